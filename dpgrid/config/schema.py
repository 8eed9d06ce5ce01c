"""The top-level config's schema (privacy, grid, train, data), registered with Hydra's ConfigStore as
`dpgrid_schema` and listed first in conf/config.yaml's defaults: a misspelt key or a value of the wrong
type is refused when the config is composed. The defaults and their documentation stay in
conf/config.yaml; ranges that a type cannot express are checked in dpgrid.config.checks. The option groups
(strategy, dataset, model, privacy/selection, tracker) are open: each option brings its own keys."""

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


@dataclass
class PrivacyConfig:
    epsilon: float = MISSING
    delta: float = MISSING
    account_seeds: bool = MISSING
    secure_rng: bool = MISSING
    budget: str = MISSING
    accountant: str = MISSING
    selection: Any = MISSING  # an option of conf/privacy/selection: its _target_, name and its own keys (typed by
                              # its class's Options when the grid is compiled)
    study: Optional[str] = None          # the study's name in the dataset ledger (dpgrid.results.study)
    study_budget: Optional[float] = None  # the epsilon the study may spend on the dataset, at the grid's delta
    study_ledger: Optional[str] = None   # where the dataset ledger lives (null: $DPGRID_LEDGER, else the user's data folder)


@dataclass
class GridConfig:
    k: int = MISSING
    lr_range: list[float] = MISSING
    clip_range: list[float] = MISSING
    quantiles: list[float] = MISSING
    only: Optional[list[str]] = None
    allow_large: bool = MISSING


@dataclass
class TrainConfig:
    epochs: int = MISSING
    steps: Optional[int] = None
    batch_size: int = MISSING
    eval_every: int = MISSING
    seeds: int = MISSING
    momentum: float = MISSING
    sampling: str = MISSING
    device: str = MISSING
    engine: str = MISSING
    per_sample_method: str = "auto"
    float64: bool = False
    threads: str = "auto"
    parallel_runs: str = "auto"
    cuda_graphs: bool = True
    save_models: str = "released"
    trainable: list[str] = field(default_factory=lambda: ["*"])


@dataclass
class DataConfig:
    root: str = MISSING
    check_before_queue: bool = True
    validation: str = "test"


@dataclass
class DpgridConfig:
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    grid: GridConfig = field(default_factory=GridConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    protocol: str = MISSING
    overwrite: bool = MISSING
    dataset: Any = MISSING
    strategy: Any = MISSING
    model: Any = MISSING
    tracker: Any = None  # an option of conf/tracker (its _target_ and keys), or None: no tracker


def number(value) -> str:
    """3.0 -> "3", 0.5 -> "0.5": how an epsilon appears in a run directory's name."""
    return f"{float(value):g}"


def epsilon_folder(target: str, epsilon) -> str:
    """A grid's folder for its epsilon: eps<epsilon>, or `nonprivate` for a strategy that spends none
    (its runs do not depend on epsilon, so a sweep over epsilon trains it once)."""
    try:
        from hydra.utils import get_class
        private = bool(getattr(get_class(str(target)), "private", True))
    except Exception:  # an unimportable target is refused, with its own message, when the run starts
        private = True
    return f"eps{number(epsilon)}" if private else "nonprivate"


def register() -> None:
    """Make the schema and dpgrid's resolvers known to Hydra (idempotent)."""
    ConfigStore.instance().store(name="dpgrid_schema", node=DpgridConfig)
    if not OmegaConf.has_resolver("dpgrid.number"):
        OmegaConf.register_new_resolver("dpgrid.number", number)
    if not OmegaConf.has_resolver("dpgrid.epsilon_folder"):
        OmegaConf.register_new_resolver("dpgrid.epsilon_folder", epsilon_folder)


