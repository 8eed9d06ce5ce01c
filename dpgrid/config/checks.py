"""Every value a user can set, checked before anything runs or is written: one line naming the key
and what is valid (DpgridError, exit code 2). Explicit code, never `assert`: the checks hold under
`python -O` too. A strategy checks its own keys (`Strategy.check_config`)."""

import math

from omegaconf import OmegaConf

from dpgrid import DpgridError
from dpgrid.data.tasks import TASKS
from dpgrid.plugins import Reader

MAX_EPSILON = 100.0   # beyond this a DP guarantee (a factor e^epsilon > 10^43) says nothing
LARGE_CONFIGS, LARGE_STEPS = 10_000, 10 ** 7  # 100x the largest paper grid's K, 20x its steps


BUDGETS = ("per_grid", "per_run")
SAVE_MODELS = ("released", "all", "none")  # train.save_models (dpgrid.results.models)
# train.per_sample_method besides auto: a convolution's forms (dpgrid.training.rules.convolution) and a Linear layer's on
# sequences (dpgrid.training.rules.linear)
PER_SAMPLE_METHODS = ("grouped", "grouped64", "depthwise64", "backward32", "backward128", "unfold16", "unfold64",
                      "ghost", "per_sample")


def check_config(cfg, n_train: int = None) -> list:
    """The common keys (privacy, grid, train, data, and what every dataset config states); a strategy,
    model or dataset loader checks its own keys. n_train: the loaded data's N, or None for the config's
    dataset.n_train (`dpgrid plan`, early checks). Returns the warnings, for the caller to show once.
    Imports nothing heavy, so that `dpgrid run` refuses a bad value before torch is imported."""
    read = Reader(cfg)
    n_config = read.whole("dataset.n_train") if read.has("dataset.n_train") else None
    n_train = n_config if n_train is None else n_train  # None: not known before the data is loaded
    warnings = []
    read.real("privacy.epsilon", f"in (0, {MAX_EPSILON:g}]", lambda v: 0 < v <= MAX_EPSILON)
    delta = read.real("privacy.delta", "in (0, 1)", lambda v: 0 < v < 1)
    if n_train and delta >= 1 / n_train:
        warnings.append(f"privacy.delta={delta:g} is not below 1/N = {1 / n_train:.3g}: a weak guarantee")
    for key in ("privacy.account_seeds", "privacy.secure_rng", "overwrite", "grid.allow_large", "train.float64"):
        read.flag(key)
    read.choice("privacy.budget", BUDGETS)
    from dpgrid.privacy import all_accountants
    read.choice("privacy.accountant", all_accountants())
    read.whole("grid.k", low=2)
    if read.get("grid.only") is not None and len(read.get("grid.only")) == 0:
        raise DpgridError("grid.only must name at least one configuration, e.g. grid.only=[lr0] (null: all of them)")
    read.log_range("grid.lr_range")
    read.log_range("grid.clip_range")
    read.numbers("grid.quantiles", "in (0, 1)", lambda x: 0 < x < 1)
    if read.has("dataset.epsilons"):
        read.numbers("dataset.epsilons", f"in (0, {MAX_EPSILON:g}]", lambda x: 0 < x <= MAX_EPSILON)
    read.whole("train.batch_size", high=n_train)  # high=None: checked again once the data is loaded
    for key in ("train.epochs", "train.seeds", "train.eval_every"):
        read.whole(key)
    if read.get("train.steps") is not None:  # T itself, in place of epochs: a fraction of an epoch, or any T
        read.whole("train.steps")
    read.fraction("train.momentum", closed_low=True)
    if read.choice("train.sampling", ("poisson", "shuffle")) == "shuffle":
        warnings.append("train.sampling=shuffle: fixed-size shuffled batches are NOT covered by the Poisson analysis; "
                        "these runs claim no epsilon (epsilon_spent is empty, rows marked 'not DP')")
    read.choice("train.engine", ("auto", "fast", "func"))
    read.choice("train.per_sample_method", ("auto", *PER_SAMPLE_METHODS))
    read.choice("train.save_models", SAVE_MODELS)
    threads = str(read.get("train.threads"))
    if threads != "auto" and not (threads.isdigit() and int(threads) >= 1):
        raise DpgridError(f"train.threads must be auto or a whole number >= 1, got {threads!r}")
    parallel = str(read.get("train.parallel_runs"))
    if parallel != "auto" and not (parallel.isdigit() and int(parallel) >= 1):
        raise DpgridError(f"train.parallel_runs must be auto or a whole number >= 1, got {parallel!r}")
    read.choice("dataset.task", list(TASKS))
    if read.choice("dataset.normalize", ("unit", "standardize"), default="unit") == "standardize":
        if not read.has("dataset.mean"):
            raise DpgridError(f"dataset.normalize=standardize needs the public constants dataset.mean and "
                              f"dataset.std; {cfg.dataset.name} has none (mnist and fashion_mnist do)")
        read.real("dataset.mean", "in [0, 1] (pixels are in [0, 1])", lambda v: 0 <= v <= 1)
        read.real("dataset.std", "in (0, 1] (pixels are in [0, 1])", lambda v: 0 < v <= 1)
    if read.has("dataset.classes"):
        read.whole("dataset.classes", low=2)
    for key in ("dataset.seconds_per_step", "dataset.stacked_seconds_per_step"):
        if read.has(key):
            read.positive(key)
    if read.has("dataset.features"):
        read.whole("dataset.features")
    return warnings


def study_of(read: Reader):
    """The grid's dpgrid.specs.Study (privacy.study, privacy.study_budget, privacy.study_ledger), checked."""
    from dpgrid.specs import Study

    name = read.get("privacy.study") if read.has("privacy.study") else None
    if name is not None and (not isinstance(name, str) or not name.strip()):
        read.refuse("privacy.study", "null or a non-empty name", name)
    budget = read.positive("privacy.study_budget") if read.has("privacy.study_budget") and \
        read.get("privacy.study_budget") is not None else None
    ledger = read.get("privacy.study_ledger") if read.has("privacy.study_ledger") else None
    if ledger is not None and (not isinstance(ledger, str) or not ledger):
        read.refuse("privacy.study_ledger", "null (the default place) or a folder", ledger)
    return Study(name=name, budget=budget, ledger=ledger)


def start_of(read: Reader):
    """The grid's dpgrid.specs.Start (model.init, model.lora, train.trainable), checked: a missing checkpoint is refused
    here (its checksum is the grid's identity); what its tensors fit is asked when the model is built."""
    from dpgrid.specs import Start

    trainable = read.get("train.trainable")
    if not isinstance(trainable, (list, tuple)) and not OmegaConf.is_list(trainable) or not len(trainable) or \
            not all(isinstance(p, str) and p for p in trainable):
        read.refuse("train.trainable", "a non-empty list of parameter-name globs, e.g. [\"*\"] or [\"head.*\"]",
                    OmegaConf.to_object(trainable) if OmegaConf.is_config(trainable) else trainable)
    init = read.get("model.init")
    if init is not None and (not isinstance(init, str) or not init):
        read.refuse("model.init", "null or the path of a .safetensors file", init)
    rank = read.whole("model.lora.rank", low=0) if read.has("model.lora.rank") else 0
    targets = read.get("model.lora.targets") or []
    if read.has("model.lora.alpha"):
        read.positive("model.lora.alpha")
    if rank:
        if not len(targets) or not all(isinstance(t, str) and t for t in targets):
            read.refuse("model.lora.targets", "a non-empty list of module-name globs (the Linear layers that get "
                        "adapters) when model.lora.rank > 0", OmegaConf.to_object(targets) if OmegaConf.is_config(targets)
                        else targets)
    elif len(targets):
        raise DpgridError("model.lora.targets are set but model.lora.rank is 0: set model.lora.rank (e.g. 8) to add "
                          "adapters, or leave model.lora.targets empty")
    digest = None
    if init is not None:
        from pathlib import Path

        if not Path(init).is_file():
            raise DpgridError(f"model.init: no file {init}")
        from dpgrid.privacy.provenance import checksum

        digest = checksum(init)
    declared = read.get("model.init_covered_by") if read.has("model.init_covered_by") else None
    declared = OmegaConf.to_object(declared) if OmegaConf.is_config(declared) else declared
    if declared is not None and not (declared == "public" or (
            isinstance(declared, dict) and set(declared) == {"epsilon", "delta", "dataset"}
            and all(isinstance(declared[k], (int, float)) and not isinstance(declared[k], bool)
                    for k in ("epsilon", "delta")) and 0 < declared["epsilon"] < math.inf and 0 <= declared["delta"] < 1
            and isinstance(declared["dataset"], str) and declared["dataset"])):
        read.refuse("model.init_covered_by", "null (read from the checkpoint's file), public, or {epsilon: E, delta: D, "
                    "dataset: NAME} (what covers a checkpoint trained privately elsewhere)", declared)
    if declared is not None and init is None:
        raise DpgridError("model.init_covered_by is set but model.init is null: it declares a checkpoint's privacy")
    disjoint = read.flag("model.init_disjoint") if read.has("model.init_disjoint") else False
    if disjoint and init is None:
        raise DpgridError("model.init_disjoint=true but model.init is null: it declares that this grid's data shares no "
                          "example with a checkpoint's")
    provenance = None
    if init is not None:
        from dpgrid.privacy.provenance import checkpoint_provenance

        provenance = checkpoint_provenance(init, declared)
    return Start(init=init, init_sha256=digest, init_provenance=provenance, init_disjoint=disjoint, lora_rank=rank,
                 lora_alpha=float(read.get("model.lora.alpha")) if rank else 1.0,
                 lora_targets=tuple(str(t) for t in targets), trainable=tuple(str(p) for p in trainable))


def check_size(n_configs: int, runs: int, steps: int, seconds_per_step, allow_large: bool) -> None:
    """Refuse a grid far beyond what the user likely meant, unless grid.allow_large=true."""
    total = runs * steps
    if allow_large or (n_configs <= LARGE_CONFIGS and total <= LARGE_STEPS):
        return
    estimate = ""
    if seconds_per_step:
        days = total * float(seconds_per_step) / 86400
        estimate = f", about {days:,.1f} days at {float(seconds_per_step):g} s per step (2-core CPU)"
    raise DpgridError(f"a large grid: {n_configs:,} configurations, {runs:,} runs of {steps:,} steps "
                      f"({total:,} steps{estimate}); pass grid.allow_large=true to start it")
