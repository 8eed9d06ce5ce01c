"""One grid: plan, then every (configuration x seed) run, appending CSV rows; then the summary.

Output directory: resolved `config.yaml`, `plan.json`, `runs.csv` (one row per finished run, the
commit record), `curves.csv` (every validation), `summary.csv` (per configuration, best marked).
"""

import contextlib
import hashlib
import logging
import math
import re
import sys
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from . import DpgridError, data as data_mod, grid, selection, strategies, tasks
from .checks import check_config, check_size
from .files import check_writable, environment, locked, outermost_missing, remove_created, write_csv, write_json
from .models import build_model, count_parameters
from .persample import check_model, make_engine
from .plugins import arguments
from .privacy import accounting_for, make_plan
from .randomness import SecureRandom
from .curves import append_curves
from .results import claim, commit_run, config_hash, finished_runs, summarize, write_header
from .train import train_run


def derive_seed(*parts) -> int:
    """A 63-bit seed from names only, so a run's randomness never depends on run order or job split."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2 ** 63 - 1)


def resolve_device(name: str) -> torch.device:
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


def validate(cfg, n_train: int):
    """Every check that needs no data and writes nothing; returns the strategy class and the model."""
    check_config(cfg, n_train)
    resolve_device(str(cfg.train.device))
    strategy_cls = strategies.resolve(cfg.strategy)
    strategy_cls.check_config(cfg)
    accountant = str(cfg.privacy.accountant)
    method = accounting_for(strategy_cls, str(cfg.privacy.selection))
    if strategy_cls.private and accountant not in method.accountants:
        raise DpgridError(f"privacy.accountant={accountant} does not apply to strategy={cfg.strategy.name} "
                          f"(accounted by {method.name}); valid: {', '.join(method.accountants)}")
    n_configs = grid.size(cfg.strategy, cfg.grid)
    steps = math.ceil(int(cfg.train.epochs) * n_train / int(cfg.train.batch_size))
    check_size(n_configs, n_configs * int(cfg.train.seeds), steps, cfg.dataset.get("seconds_per_step"),
               bool(cfg.grid.allow_large))
    model = build_model(cfg.model)
    check_model(model, str(cfg.train.engine))  # before anything is written, not at the first run
    return strategy_cls, model


def plan_grid(cfg, n_train: int):
    """The validated grid: (strategy class, plan, selected configurations). Raises DpgridError. Planned once
    per command: `dpgrid run` hands the plan it checked before Hydra to the job that trains it."""
    strategy_cls, model = validate(cfg, n_train)
    configs = grid.configurations(cfg.strategy, cfg.grid)
    selected = grid.select(configs, cfg.grid.only)
    plan = make_plan(cfg, n_train, strategy_cls, configs, count_parameters(model))
    return strategy_cls, plan, selected


def config_n_train(cfg) -> int:
    """N as the config states it (dataset.n_train), or, when it does not, the loaded data's."""
    stated = cfg.dataset.get("n_train")
    return int(stated) if stated is not None else data_mod.load(cfg.dataset, cfg.data.root).n_train


def check_run(cfg, out_dir) -> tuple:
    """Everything about a run that can be refused before any file is written; returns the planned grid
    (plan_grid's answer), for run_grid to train."""
    planned = plan_grid(cfg, config_n_train(cfg))
    out = Path(out_dir)
    check_writable(out)
    if out.is_dir():
        with locked(out):
            claim(out, config_hash(cfg, planned[1].private), None, planned[1], bool(cfg.overwrite), cfg)  # data: once loaded
    return planned


def grid_key(cfg, plan) -> tuple:
    """The names a grid's seeds derive from (a selection adds its repetition)."""
    key = (plan.dataset, plan.strategy, plan.epsilon if plan.private else "non-private", plan.k)
    return key if plan.selection == "composition" else (*key, "selection", int(cfg.privacy.stopping_seed))


def planned_runs(out: Path, cfg, plan, selected: list) -> tuple:
    """((configuration, seed) of every run, the draw's digest or None): each selected configuration's seeds,
    or, for a random-stopping selection, candidate i's seeds i * seeds ... (i + 1) * seeds - 1 (each
    candidate is a fresh run) and the draw they come from."""
    if plan.selection == "composition":
        return [(c, s) for c in selected for s in range(plan.seeds)], None
    source = (SecureRandom() if cfg.privacy.secure_rng
              else torch.Generator().manual_seed(derive_seed(*grid_key(cfg, plan), "stopping")))
    drawn, draw = selection.candidates(out, plan, selected, source, bool(cfg.overwrite))
    return [(c, i * plan.seeds + s) for i, c in enumerate(drawn) for s in range(plan.seeds)], draw


def run_one(cfg, plan, strategy_cls, data, config: dict, seed: int, progress: bool):
    with torch.random.fork_rng(devices=[]), default_dtype(torch.float64 if cfg.train.float64 else None):
        torch.manual_seed(derive_seed(plan.dataset, "init", seed))  # same start for every strategy
        model = build_model(cfg.model).to(data.x_train.device)
    if cfg.privacy.secure_rng:  # batches and noise unpredictable; such runs are not reproducible
        sampler = noise = SecureRandom()
    else:  # public seeds: reproducible, and predictable by anyone who knows these names
        names = (*grid_key(cfg, plan), config["config_id"], seed)
        sampler = torch.Generator().manual_seed(derive_seed(*names, "sampling"))
        noise = torch.Generator(device=data.x_train.device)
        noise.manual_seed(derive_seed(*names, "noise"))
    hp = {k: v for k, v in config.items() if k != "config_id"}
    multipliers = {"noise_multiplier": plan.noise_multiplier, **plan.per_query, "delta": plan.delta,
                   "accountant": plan.accountant}
    strategy = strategy_cls(model.parameters(), hp, multipliers, plan.batch_size, arguments(cfg.strategy), noise,
                            momentum=applied_momentum(cfg, strategy_cls))
    engine = make_engine(model, data.task, str(cfg.train.engine))
    steps = plan.schedule.get(config["config_id"], {}).get("steps", plan.steps)
    return train_run(model, engine, strategy, data, steps, plan.sample_rate, int(cfg.train.eval_every),
                     sampler, progress, sampling=str(cfg.train.sampling))


@contextlib.contextmanager
def default_dtype(dtype):
    """Models built inside draw their initial weights in `dtype` (None: unchanged). Drawn in float32 and
    then converted, they would differ by a float32 rounding between CPUs (the vectorised kernels differ)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or previous)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def applied_momentum(cfg, strategy_cls) -> float:
    """train.momentum, or 0 for a strategy whose update does not take it (Adam's own moments, noisy GD)."""
    return float(cfg.train.momentum) if strategy_cls.uses_momentum else 0.0


def run_row(cfg, plan, strategy_cls, config, seed, result, draw=None, digest=None) -> dict:
    row = dict(dataset=plan.dataset, strategy=plan.strategy, metric=tasks.get(cfg.dataset.task).metric,
               epsilon=plan.epsilon, delta=plan.delta, k=plan.k, config_id=config["config_id"])
    row.update({k: v for k, v in config.items() if k != "config_id"})
    if plan.selection == "random_stopping":
        row.update(candidate=seed // plan.seeds, draw=draw)
    row.update(seed=seed, noise_multiplier=plan.noise_multiplier, **plan.per_query,
               budget=plan.budget, accountant=plan.accountant, epsilon_spent=plan.epsilon_spent,
               epsilon_grid=plan.epsilon_grid, seeds_accounted=plan.account_seeds,
               protocol=str(cfg.protocol), momentum=applied_momentum(cfg, strategy_cls), sampling=plan.sampling,
               normalize=str(cfg.dataset.get("normalize", "unit")), steps=result.steps if plan.schedule else plan.steps,
               best_value=result.best_value, best_step=result.best_step)
    if config["config_id"] in plan.schedule and plan.epsilon_spent is not None:  # a noise schedule (not the oracle):
        spent = plan.schedule[config["config_id"]]  # this run's own epsilon, under both conversions
        row.update(epsilon_spent=spent[f"epsilon_{plan.accountant}"],
                   **{k: v for k, v in spent.items() if k.startswith("epsilon_")})
    if "clip" in strategy_cls.adapts:
        row["final_clip"] = result.final_clip
    if "lr" in strategy_cls.adapts:
        row["final_lr"] = result.final_lr
    row.update(diverged=result.diverged, seconds=round(result.seconds, 3), eval_seconds=round(result.eval_seconds, 3),
               config_hash=digest)
    return row


def run_grid(cfg, out_dir, progress: bool = True, on_lock=None, created="unknown", planned=None) -> pd.DataFrame:
    """Train the grid into out_dir, resuming what is there. The directory's lock is taken before anything
    is written into it and held to the end; `on_lock(out)` writes what the caller records beside the grid
    (the command line: Hydra's record). A grid refused after taking the lock removes the folders it created
    (`created`: the outermost one, None for none; by default what did not exist when it was called).
    `planned`: plan_grid's answer for this config, when the caller has it (it is used if its N is the data's)."""
    out = Path(out_dir)
    created = outermost_missing(out) if created == "unknown" else created
    check_writable(out)
    with environment(out):
        out.mkdir(parents=True, exist_ok=True)
    with locked(out):
        try:
            if on_lock:
                on_lock(out)
            return train_grid(cfg, out, progress, planned)
        except DpgridError:
            remove_created(out, created)
            raise


def train_grid(cfg, out: Path, progress: bool, planned=None) -> pd.DataFrame:
    """run_grid's work, with the directory's lock held."""
    data = data_mod.load(cfg.dataset, cfg.data.root, resolve_device(str(cfg.train.device)))
    if cfg.train.float64:
        data = data.in_float64()
    if planned is None or planned[1].n_train != data.n_train:
        planned = plan_grid(cfg, data.n_train)
    strategy_cls, plan, selected = planned
    digest, data_files = config_hash(cfg, plan.private), data_mod.fingerprint(data.files)
    claim(out, digest, data_files, plan, bool(cfg.overwrite), cfg)
    write_header(out, cfg, plan, digest, data_files)
    done = finished_runs(out, plan, int(cfg.train.eval_every), digest, {c["config_id"] for c in selected})
    work, draw = planned_runs(out, cfg, plan, selected)
    todo = [(c, s) for c, s in work if (c["config_id"], s) not in done]
    total = len(work)
    # A selection's console and cli.log say nothing that depends on the candidates: not their number
    # (a bar's total, a line per run) nor their scores. Those stay in the private files.
    quiet = plan.selection == "random_stopping"
    if quiet:
        print(SELECTION_QUIET, file=sys.stderr, flush=True)
    bar = tqdm(total=total, initial=total - len(todo), desc=f"{plan.strategy} {plan.dataset} eps={plan.epsilon:g} "
               f"k={plan.k}", disable=None if progress and not quiet else True)
    for finished, (config, seed) in enumerate(todo, start=total - len(todo) + 1):
        result = run_one(cfg, plan, strategy_cls, data, config, seed, progress and not quiet)
        append_curves(out / "curves.csv", [dict(config_id=config["config_id"], seed=seed, **c) for c in result.curve])
        commit_run(out / "runs.csv", run_row(cfg, plan, strategy_cls, config, seed, result, draw, digest))
        if not quiet:
            report_run(plan, config["config_id"], seed, result, finished, total)
        bar.update()
    bar.close()
    runs = pd.read_csv(out / "runs.csv", dtype={"config_id": str}) if work else None
    if plan.selection == "random_stopping":
        summary, released = selection.summarize_selection(runs, plan, list(cfg.strategy.grid), data.task)
        write_json(out / "selection.json", released)
    else:
        summary = summarize(runs, list(cfg.strategy.grid), data.task)
    write_csv(out / "summary.csv", summary)
    return summary


SELECTION_QUIET = ("random-stopping selection: training the drawn candidates; how many there are and their scores "
                   "stay in the private files (candidates.json, runs.csv, curves.csv, summary.csv)")


def report_run(plan, config_id: str, seed: int, result, done: int, total: int) -> None:
    """One line per finished run: into cli.log (under Hydra), and to stderr when it is not a terminal
    (nohup, a cluster job, CI), where the progress bar is not shown."""
    value = "diverged" if result.diverged else f"{result.best_value:.4g}"
    budget = f"eps={plan.epsilon:g}" if plan.private else "non-private"
    line = (f"{plan.strategy} {plan.dataset} {budget} k={plan.k}: run {done}/{total} {config_id} "
            f"seed {seed}: {value} ({result.seconds:.1f} s)")
    logging.getLogger("dpgrid").info(line)
    if not sys.stderr.isatty():
        print(line, file=sys.stderr, flush=True)


def describe_best(summary: pd.DataFrame, task: str) -> str:
    if not len(summary):
        return "no candidate was drawn (K = 0): the selection releases nothing"
    if not summary.best.any():
        return "no configuration converged: every run diverged"
    b = summary[summary.best].iloc[0]
    hps = ", ".join(f"{a}={b[a]:.4g}" for a in summary.columns if a in grid.ID_PREFIX)
    unit = tasks.get(task).unit
    if "candidate" in summary:  # a random-stopping selection: what selection.json releases, nothing more
        return f"selected configuration {b.config_id} ({hps}): {unit} {b['mean']:.4g} (selection.json)"
    return (f"best configuration {b.config_id} ({hps}): {unit} {b['mean']:.4g} ± {b['std']:.2g} "
            f"over {b.n_seeds - b.n_diverged} seed(s)")
