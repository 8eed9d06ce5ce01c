"""Clipping strategies: one module per strategy, each a subclass of `Strategy` that maps per-sample
gradient information to a noisy update. A strategy config (conf/strategy/<name>.yaml, or a user's own
on Hydra's search path) names its class in `_target_`; nothing here lists them."""

from dpgrid import DpgridError
from dpgrid.plugins import check_hooks
from dpgrid.plugins import resolve as resolve_target
from dpgrid.strategies.adamwosm import AdamWOSM
from dpgrid.strategies.base import Noise, Progress, Strategy
from dpgrid.strategies.constant_noise import ConstantNoise
from dpgrid.strategies.dpadam import DPAdam
from dpgrid.strategies.fixed_quantile import FixedQuantile
from dpgrid.strategies.fixed_threshold import FixedThreshold
from dpgrid.strategies.nodp import NoDP
from dpgrid.strategies.online import Online
from dpgrid.strategies.pur import PUR
from dpgrid.strategies.pur_oracle import PUROracle

__all__ = ["Strategy", "Noise", "Progress", "Online", "FixedThreshold", "FixedQuantile", "AdamWOSM", "DPAdam", "NoDP", "PUR", "ConstantNoise", "PUROracle", "resolve"]


def resolve(strategy_cfg) -> type:
    """The Strategy subclass a strategy config names in `_target_` (DpgridError when it is none)."""
    where = f"strategy={strategy_cfg.get('name', '?')}"
    cls = resolve_target(strategy_cfg, where, kind="class")
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise DpgridError(f"{where}: _target_ {strategy_cfg._target_} is not a subclass of dpgrid.Strategy")
    check_hooks(cls, Strategy, where)
    return cls
