"""Clipping strategies: one module per strategy, each a subclass of `Strategy` that maps per-sample
gradient information to a noisy update. A strategy config (conf/strategy/<name>.yaml, or a user's own
on Hydra's search path) names its class in `_target_`; nothing here lists them."""

from .. import DpgridError
from ..plugins import resolve as resolve_target
from .adamwosm import AdamWOSM
from .base import Strategy
from .constant_noise import ConstantNoise
from .dpadam import DPAdam
from .fixed_quantile import FixedQuantile
from .fixed_threshold import FixedThreshold
from .nodp import NoDP
from .online import Online
from .pur import PUR
from .pur_oracle import PUROracle

__all__ = ["Strategy", "Online", "FixedThreshold", "FixedQuantile", "AdamWOSM", "DPAdam", "NoDP", "PUR", "ConstantNoise", "PUROracle", "resolve"]


def resolve(strategy_cfg) -> type:
    """The Strategy subclass a strategy config names in `_target_` (DpgridError when it is none)."""
    where = f"strategy={strategy_cfg.get('name', '?')}"
    cls = resolve_target(strategy_cfg, where, kind="class")
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise DpgridError(f"{where}: _target_ {strategy_cfg._target_} is not a subclass of dpgrid.Strategy")
    return cls
