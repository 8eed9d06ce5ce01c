"""Compile, then run: `compile(cfg, n_train)` is the one function that reads the whole composed config. It
checks every key once (the common ones in dpgrid.config.checks; a strategy its own, through `check_options`), resolves
the strategy and the model, builds the configurations and asks the accounting for the noise. What it returns,
a frozen GridSpec, is all that training, the run directory and `dpgrid plan` receive: they can be called from a
notebook or a test with a spec, never needing Hydra.

The spec is a pure function of the config and N: any job on any machine compiles the same noise for the same
grid. `dpgrid run` compiles before Hydra writes anything, and its job trains that spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping, Optional

from omegaconf import OmegaConf

from dpgrid import DpgridError
from dpgrid.config.identity import config_hash, flat_privacy, identity_settings
from dpgrid.config.selection import selection_of
from dpgrid.plugins import target_of
from dpgrid.data import VALIDATION
from dpgrid.specs import Start, Study, dataset_spec, own_keys

@dataclass(frozen=True)
class Training:
    """How each run trains (train.*, and privacy.secure_rng, which picks the runs' random source)."""
    epochs: int
    batch_size: int      # the EXPECTED batch size B
    eval_every: int
    seeds: int
    momentum: float      # as applied: 0 for a strategy whose update does not take it (uses_momentum = False)
    sampling: str        # poisson | shuffle
    device: str
    engine: str          # the per-sample engine this grid's model runs on by its layer types (fast, or func where fast cannot serve)
    float64: bool
    secure_rng: bool
    threads: str = "auto"  # torch threads: auto (chosen when the grid runs, dpgrid.training.threads) or a number
    parallel_runs: str = "auto"  # runs trained stacked: auto (dpgrid.training.stacked.group_size) or a number
    cuda_graphs: bool = True  # on CUDA, each step replayed as a CUDA graph where that serves (dpgrid.training.graphs)
    save_models: str = "released"  # released | all | none (dpgrid.results.models)
    per_sample_method: str = "auto"  # each layer's per-sample form where a rule offers several: auto (measured) or one
    engine_setting: str = "auto"  # train.engine as set: auto | fast (the first batch's proof refuses, not falls back) | func
    steps: Optional[int] = None   # train.steps: T itself, in place of epochs (None: T from the epochs)


@dataclass(frozen=True)
class GridSpec:
    """One grid, compiled: every value its runs, rows and tables need, validated, and nothing else."""
    plan: Any                   # dpgrid.privacy.Plan (frozen): noise, what it spends, the configurations
    strategy_cls: type
    selection_cls: type         # privacy.selection's AccountingMethod (the strategy may declare its own instead)
    options: Mapping            # the strategy config's own keys (read-only)
    to_train: tuple             # the configurations this command trains (grid.only), in grid order
    only: Optional[tuple]       # grid.only as given (None: every configuration)
    train: Training
    dataset: Any                # dpgrid.specs.DatasetSpec: its loader and the public constants a run reads
    model: Any                  # dpgrid.plugins.Target: the model's builder and arguments; its size is plan.model_parameters
    data_root: str
    protocol: str
    overwrite: bool
    stopping_seed: int
    privacy: Mapping            # the privacy settings (read-only), which the plan is made from
    settings: Mapping           # the resolved config without hydra: written as config.yaml, hashed
    config_hash: str
    warnings: tuple = ()        # to show once, when the grid starts or is planned
    start: Any = Start()        # dpgrid.specs.Start: the checkpoint every run starts from, adapters, what trains
    study: Any = Study()        # dpgrid.specs.Study: the study's name, budget and ledger (dpgrid.results.study)
    validation: str = "test"    # data.validation: test, or test_half (dpgrid.data.test_halves)
    observer: Any = None        # what watches its runs (dpgrid.training.observer.RunObserver: `dpgrid audit`'s canaries), or None
    tracker: Any = None         # dpgrid.plugins.Target of tracker=... (dpgrid.tracking), or None: what follows the grid

    def announce(self) -> "GridSpec":
        """Show the grid's warnings (once: a grid is compiled once); returns the spec."""
        import warnings

        for warning in self.warnings:
            warnings.warn(warning)
        return self


def compile(cfg, n_train: int = None, plan: bool = True, before_plan=None) -> GridSpec:
    """The frozen, validated grid of a composed config, for N = n_train (None: the config's dataset.n_train,
    else the loaded data's). DpgridError (one line naming the key) for anything that cannot run. Everything up to
    the plan is checked before torch is loaded (strategies load it at first use), so a refusal is as fast as Python
    starts; `before_plan(spec)` is then asked what else may refuse the grid (`dpgrid run`: its run directory,
    dpgrid.results.claim); plan=False stops there (the spec has no plan, its device is as configured): a sweep's
    jobs are all checked so. Reads no file but what N needs (the data, where the config does not state N) and the
    checkpoint model.init names (its checksum is the grid's identity, its release metadata what covers it)."""
    from dpgrid.config.checks import check_config, start_of, study_of
    from dpgrid.plugins import Reader

    selection_cls, selection = selection_of(cfg.privacy.selection)  # its keys typed: a misspelt one is refused first
    warnings = check_config(cfg, n_train)  # first, and before torch is imported: a bad value is refused at once
    selection_cls.check_options(Reader(cfg))
    from dpgrid.tracking import compiled as compiled_tracker

    tracker = compiled_tracker(cfg.get("tracker"))  # its package installed, else one line naming the extra
    from dpgrid.config.grid import configurations, select, size
    from dpgrid.plugins import arguments
    from dpgrid.strategies import resolve

    strategy_cls = resolve(cfg.strategy)
    strategy_cls.check_options(Reader(arguments(cfg.strategy), prefix="strategy."))
    task = str(cfg.dataset.task)
    if strategy_cls.tasks is not None and task not in strategy_cls.tasks:
        raise DpgridError(f"strategy={cfg.strategy.name} runs on datasets of task {', '.join(strategy_cls.tasks)}; "
                          f"dataset={cfg.dataset.name} has task {task}")
    from dpgrid.privacy import accounting_for

    accountant = str(cfg.privacy.accountant)
    method = accounting_for(strategy_cls, selection_cls)
    if strategy_cls.private and accountant not in method.accountants:
        raise DpgridError(f"privacy.accountant={accountant} does not apply to strategy={cfg.strategy.name} "
                          f"(accounted by {method.name}); valid: {', '.join(method.accountants)}")
    dataset = dataset_spec(read_only(cfg.dataset))
    if n_train is None:  # as the config states it, else the loaded data's
        stated = cfg.dataset.get("n_train")
        n_train = int(stated) if stated is not None else loaded_n_train(dataset, cfg.data.root)
    # a huge grid is refused before its configurations are built
    steps = cfg.train.get("steps")
    check_scale(size(cfg.strategy, cfg.grid), n_train, int(cfg.train.epochs) if steps is None else steps * int(
                    cfg.train.batch_size) / n_train, int(cfg.train.batch_size),
                int(cfg.train.seeds), dataset.seconds_per_step, bool(cfg.grid.allow_large))
    configs = configurations(cfg.strategy, cfg.grid)
    only = tuple(str(o) for o in cfg.grid.only) if cfg.grid.only is not None else None
    plain = settings_of(cfg)
    plain["privacy"]["selection"] = selection
    start = start_of(Reader(cfg))
    privacy = flat_privacy(plain["privacy"])
    spec = GridSpec(
        plan=None, strategy_cls=strategy_cls, selection_cls=selection_cls, options=MappingProxyType(arguments(cfg.strategy)),
        to_train=tuple(select(configs, only)), only=only,
        train=Training(epochs=int(cfg.train.epochs), batch_size=int(cfg.train.batch_size),
                       eval_every=int(cfg.train.eval_every), seeds=int(cfg.train.seeds),
                       momentum=float(cfg.train.momentum) if strategy_cls.uses_momentum else 0.0,
                       sampling=str(cfg.train.sampling), device=str(cfg.train.device), engine=str(cfg.train.engine),
                       float64=bool(cfg.train.float64), secure_rng=bool(cfg.privacy.secure_rng),
                       threads=str(cfg.train.threads), parallel_runs=str(cfg.train.parallel_runs),
                       cuda_graphs=bool(cfg.train.cuda_graphs),
                       save_models=str(cfg.train.save_models), per_sample_method=str(cfg.train.per_sample_method),
                       engine_setting=str(cfg.train.engine), steps=None if steps is None else int(steps)),
        dataset=dataset, model=target_of(own_keys(read_only(cfg.model)), "model"), start=start,
        data_root=str(cfg.data.root), protocol=str(cfg.protocol), overwrite=bool(cfg.overwrite), stopping_seed=int(privacy["stopping_seed"]),
        privacy=MappingProxyType(privacy), settings=MappingProxyType(plain),
        config_hash=config_hash(identity_settings(plain, start), strategy_cls.private, selection_cls.accounts_seeds),
        warnings=tuple(warnings), study=study_of(Reader(cfg)), tracker=tracker,
        validation=Reader(cfg).choice("data.validation", VALIDATION) if "validation" in cfg.data else "test")
    if before_plan is not None:
        before_plan(spec)
    if not plan:
        return spec
    device = resolve_device(spec.train.device)  # torch from here on
    privacy_plan = make_plan(spec, configs, n_train, 0)  # reads the dataset's constants first: a model key
    from dpgrid.models.finetuning import prepare
    from dpgrid.models import build_model, count_parameters
    from dpgrid.plugins import check_arguments
    from dpgrid.models.inputs import statistics_events
    from dpgrid.training.persample import engine_for

    check_arguments(own_keys(cfg.model), "model")
    check_arguments(cfg.dataset.load, "dataset.load", given_by_dpgrid=("root",))
    model = build_model(cfg.model)  # interpolated from one is named as the user set it
    prepare(model, start, f"model={spec.settings['model'].get('_target_')}")  # the checkpoint fits, the globs match
    statistics = statistics_events(model)
    if statistics:  # the model estimates statistics of the private data: its plan composes them with the runs
        privacy_plan = make_plan(spec, configs, n_train, 0, statistics)
    engine, fallback = engine_for(model, spec.train.engine)  # refused before anything is written
    relation = "equals" if spec.train.eval_every == privacy_plan.steps else "is more than"
    once = (f"train.eval_every={spec.train.eval_every} {relation} a run's T = {privacy_plan.steps} steps: each run "
            "is validated once, after its last step (its learning curve is one point, and the tables draw no curve "
            "of it); lower train.eval_every below T for a curve",) \
        if spec.train.eval_every >= privacy_plan.steps else ()
    trains = sum(p.numel() for p in model.parameters() if p.requires_grad)
    trained = tuple(name for name, p in model.named_parameters() if p.requires_grad)
    return replace(spec, plan=replace(privacy_plan, model_parameters=count_parameters(model)),
                   train=replace(spec.train, device=str(device), engine=engine),
                   start=replace(start, trainable_parameters=trains, trained=trained) if not start.is_default else start,
                   warnings=spec.warnings + ((fallback,) if fallback else ()) + once)


def check_loaded(spec: GridSpec, n_train: int) -> None:
    """Refuse data whose N is not the one the grid was planned for: its noise, T and epsilon are the plan's, so a
    config that states dataset.n_train must hold that many training examples (null: the loaded data's N)."""
    if spec.plan.n_train != n_train:
        raise DpgridError(f"dataset.n_train={spec.plan.n_train} but the data under {spec.data_root} hold {n_train} "
                          f"training examples, and the grid's noise and steps were planned for {spec.plan.n_train}: "
                          f"pass dataset.n_train={n_train} (or dataset.n_train=null to plan for the data's N)")


def make_plan(spec: GridSpec, configs: list, n_train: int, model_parameters: int, statistics=()):
    from dpgrid.plugins import Reader
    from dpgrid.privacy import make_plan as plan_privacy

    t, cls = spec.train, spec.strategy_cls
    dataset, strategy = spec.settings["dataset"], spec.settings["strategy"]
    if t.batch_size > n_train:
        raise DpgridError(f"train.batch_size must be a whole number in 1..{n_train}, got {t.batch_size}")
    if cls.full_batch and t.batch_size != n_train:
        raise DpgridError(f"strategy={strategy['name']} is full-batch gradient descent: train.batch_size must be "
                          f"N = {n_train}, got {t.batch_size}")
    return plan_privacy(
        strategy_cls=cls, selection=spec.selection_cls, options=dict(spec.options), privacy=dict(spec.privacy),
        problem=cls.problem(Reader(dataset, prefix="dataset."), n_train), n_train=n_train,
        batch_size=t.batch_size, epochs=t.epochs, steps=t.steps, seeds=t.seeds, sampling=t.sampling,
        dataset=dataset["name"], strategy=strategy["name"], k=int(spec.settings["grid"]["k"]),
        label=str(strategy.get("label") or cls.label or strategy["name"]), axes=list(strategy["grid"]),
        dataset_epsilons=[float(e) for e in dataset.get("epsilons") or [spec.privacy["epsilon"]]],
        model_parameters=model_parameters, configurations=configs, statistics=statistics)


def check_scale(n_configs: int, n_train: int, epochs: int, batch_size: int, seeds: int, seconds_per_step,
                allow_large: bool) -> None:
    from dpgrid.config.checks import check_size

    steps = math.ceil(epochs * n_train / batch_size)
    check_size(n_configs, n_configs * seeds, steps, seconds_per_step, allow_large)


def loaded_n_train(dataset, root) -> int:
    """N of the loaded data, for a dataset config that does not state it (dataset.n_train)."""
    from dpgrid.data import load

    return load(dataset, root).n_train


def settings_of(cfg) -> dict:
    """The resolved config without Hydra's own node, as plain Python values."""
    return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)


def read_only(node):
    node = OmegaConf.create(OmegaConf.to_container(node, resolve=True))
    OmegaConf.set_readonly(node, True)
    return node


def resolve_device(name: str):
    import re

    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not re.fullmatch(r"cuda(:\d+)?", name):
        raise DpgridError(f"train.device must be auto, cpu or cuda[:N], got {name!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(name.partition(":")[2] or 0) if name != "cpu" else 0
    if name != "cpu" and index >= count:
        valid = "auto, cpu" + (f", cuda:0..cuda:{count - 1}" if count else "")
        raise DpgridError(f"train.device={name} but this machine has {count} CUDA device(s); valid here: {valid}")
    return torch.device(name)
