"""Every value a user can set, checked before anything runs or is written: one line naming the key
and what is valid (DpgridError, exit code 2). Explicit code, never `assert`: the checks hold under
`python -O` too. A strategy checks its own keys (`Strategy.check_config`)."""

import math
import re
import warnings

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import DpgridError
from .tasks import TASKS

FLOAT32_MAX = 3.4e38  # parameters, thresholds and rates live in float32 tensors
MAX_EPSILON = 100.0   # beyond this a DP guarantee (a factor e^epsilon > 10^43) says nothing
MAX_LOG10 = 10        # grid axes span at most 10^-10 .. 10^10
LARGE_CONFIGS, LARGE_STEPS = 10_000, 10 ** 7  # 100x the largest paper grid's K, 20x its steps


_warned = set()


def warn_once(message: str) -> None:
    """A warning printed once per process, however often the checks run (early, then with the data)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message)


def get(cfg, key):
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except OmegaConfBaseException as e:  # e.g. an interpolated value the schema refuses
        raise DpgridError(wrong_type(e) if getattr(e, "full_key", None) else str(e).splitlines()[0]) from None


def wrong_type(error) -> str:
    """A value the schema (dpgrid/config.py) refuses: the key, the value and the type it needs."""
    first = str(error).strip().splitlines()[0]
    needed = re.search(r"converted to (\w+)", first)
    kind = {"Integer": "a whole number", "Float": "a number", "Boolean": "true or false",
            "String": "a string"}.get(needed.group(1), needed.group(1)) if needed else None
    if "is not a valid bool" in first:
        kind = "true or false"
    value = re.search(r"Value '([^']*)'", first)
    got = f", got {value.group(1)!r}" if value else ""
    return f"{error.full_key} must be {kind}{got}" if kind else f"{error.full_key}: {first}"


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def whole(cfg, key: str, low: int = 1, high: int = None) -> int:
    """An integer key in [low, high]."""
    v = get(cfg, key)
    span = f"a whole number >= {low}" if high is None else f"a whole number in {low}..{high}"
    if not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high):
        raise DpgridError(f"{key} must be {span}, got {v!r}")
    return v


def real(cfg, key: str, valid: str, ok) -> float:
    """A finite number key for which ok(v) holds; `valid` says which in words."""
    v = get(cfg, key)
    if not is_number(v) or not math.isfinite(v) or abs(v) > FLOAT32_MAX or not ok(v):
        raise DpgridError(f"{key} must be {valid}, got {v!r}")
    return float(v)


def positive(cfg, key: str) -> float:
    return real(cfg, key, "a positive finite number", lambda v: v > 0)


def fraction(cfg, key: str, closed_low: bool = False) -> float:
    """In (0, 1), or [0, 1) with closed_low."""
    if closed_low:
        return real(cfg, key, "in [0, 1)", lambda v: 0 <= v < 1)
    return real(cfg, key, "in (0, 1)", lambda v: 0 < v < 1)


def choice(cfg, key: str, options, default: str = None) -> str:
    v = get(cfg, key)
    v = default if v is None else v
    if str(v) not in options or not isinstance(v, str):
        raise DpgridError(f"{key} must be one of {', '.join(options)}, got {v!r}")
    return v


def flag(cfg, key: str) -> bool:
    v = get(cfg, key)
    if not isinstance(v, bool):
        raise DpgridError(f"{key} must be true or false, got {v!r}")
    return v


def numbers(cfg, key: str, valid: str, ok, length: int = None) -> list:
    """A list of finite numbers, each with ok(v); exactly `length` of them when given."""
    v = get(cfg, key)
    values = list(v) if OmegaConf.is_list(v) or isinstance(v, (list, tuple)) else None
    if (values is None or not values or (length and len(values) != length)
            or not all(is_number(x) and math.isfinite(x) and ok(x) for x in values)):
        size = f"{length} " if length else ""
        raise DpgridError(f"{key} must be a list of {size}numbers {valid}, got {v!r}")
    return [float(x) for x in values]


def log_range(cfg, key: str) -> list:
    low, high = numbers(cfg, key, f"in [-{MAX_LOG10}, {MAX_LOG10}] (log10 bounds)",
                        lambda x: abs(x) <= MAX_LOG10, length=2)
    if not low < high:
        raise DpgridError(f"{key} must be [low, high] with low < high (log10 bounds), got [{low:g}, {high:g}]")
    return [low, high]


BUDGETS = ("per_grid", "per_run")


def check_config(cfg, n_train: int = None, warn: bool = True) -> None:
    """The common keys (privacy, grid, train, data); the strategy's own come from the strategy class.
    n_train: the loaded data's N, or None for the config's dataset.n_train (`dpgrid plan`, early checks).
    Imports nothing heavy, so that `dpgrid run` refuses a bad value within a second."""
    n_config = whole(cfg, "dataset.n_train") if get(cfg, "dataset.n_train") is not None else None
    n_train = n_config if n_train is None else n_train  # None: not known before the data is loaded
    real(cfg, "privacy.epsilon", f"in (0, {MAX_EPSILON:g}]", lambda v: 0 < v <= MAX_EPSILON)
    delta = real(cfg, "privacy.delta", "in (0, 1)", lambda v: 0 < v < 1)
    if warn and n_train and delta >= 1 / n_train:
        warn_once(f"privacy.delta={delta:g} is not below 1/N = {1 / n_train:.3g}: a weak guarantee")
    for key in ("privacy.account_seeds", "privacy.secure_rng", "overwrite", "grid.allow_large"):
        flag(cfg, key)
    choice(cfg, "privacy.budget", BUDGETS)
    from .privacy import all_accountants
    choice(cfg, "privacy.accountant", all_accountants())
    if choice(cfg, "privacy.selection", ("composition", "random_stopping")) == "random_stopping":
        check_selection(cfg)
    whole(cfg, "grid.k", low=2)
    log_range(cfg, "grid.lr_range")
    log_range(cfg, "grid.clip_range")
    numbers(cfg, "grid.quantiles", "in (0, 1)", lambda x: 0 < x < 1)
    if get(cfg, "dataset.epsilons") is not None:
        numbers(cfg, "dataset.epsilons", f"in (0, {MAX_EPSILON:g}]", lambda x: 0 < x <= MAX_EPSILON)
    whole(cfg, "train.batch_size", high=n_train)  # high=None: checked again once the data is loaded
    for key in ("train.epochs", "train.seeds", "train.eval_every"):
        whole(cfg, key)
    fraction(cfg, "train.momentum", closed_low=True)
    if choice(cfg, "train.sampling", ("poisson", "shuffle")) == "shuffle":
        warn_once("train.sampling=shuffle: fixed-size shuffled batches are NOT covered by the Poisson analysis; "
                      "these runs claim no epsilon (epsilon_spent is empty, rows marked 'not DP')")
    choice(cfg, "train.engine", ("fast", "func"))
    choice(cfg, "dataset.task", list(TASKS))
    if choice(cfg, "dataset.normalize", ("unit", "standardize"), default="unit") == "standardize":
        if get(cfg, "dataset.mean") is None:
            raise DpgridError(f"dataset.normalize=standardize needs the public constants dataset.mean and "
                              f"dataset.std; {cfg.dataset.name} has none (mnist and fashion_mnist do)")
        real(cfg, "dataset.mean", "in [0, 1] (pixels are in [0, 1])", lambda v: 0 <= v <= 1)
        real(cfg, "dataset.std", "in (0, 1] (pixels are in [0, 1])", lambda v: 0 < v <= 1)
    if get(cfg, "dataset.classes") is not None:
        whole(cfg, "dataset.classes", low=2)
    if get(cfg, "dataset.load.max_words") is not None:
        whole(cfg, "dataset.load.max_words")
    if get(cfg, "dataset.seconds_per_step") is not None:
        positive(cfg, "dataset.seconds_per_step")
    if get(cfg, "dataset.features") is not None:
        whole(cfg, "dataset.features")
    if get(cfg, "dataset.l2") is not None:  # the logistic-regression problems' constants
        real(cfg, "dataset.l2", "a finite number >= 0 (lambda)", lambda v: v >= 0)
        positive(cfg, "dataset.feature_bound")
        positive(cfg, "dataset.radius")
    if get(cfg, "dataset.load.feature_bound") is not None:
        positive(cfg, "dataset.load.feature_bound")


def check_selection(cfg) -> None:
    """Random stopping's keys, and the settings a selection cannot be combined with."""
    from .privacy.random_stopping import RULES

    choice(cfg, "privacy.stopping", RULES)
    real(cfg, "privacy.stopping_eta", "a number in (-1, 100]", lambda v: -1 < v <= 100)
    if get(cfg, "privacy.stopping_mean") is not None:
        real(cfg, "privacy.stopping_mean", "a number > 1 (the expected number of candidates)", lambda v: v > 1)
    whole(cfg, "privacy.stopping_seed", low=0)
    refusals = {"privacy.budget": ("per_grid", "a selection's budget is the whole selection's; per_run means nothing"),
                "privacy.accountant": ("rdp", "the stopping theorems are Renyi bounds"),
                "train.sampling": ("poisson", "shuffled batches claim no epsilon to select with")}
    for key, (needed, why) in refusals.items():
        if str(get(cfg, key)) != needed:
            raise DpgridError(f"privacy.selection=random_stopping needs {key}={needed}, got {get(cfg, key)}: {why}")
    if get(cfg, "grid.only") is not None:
        raise DpgridError("privacy.selection=random_stopping cannot run with grid.only: a selection draws its "
                          "candidates from the whole grid and cannot be split by hand")


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
