"""Clipping strategies: one module per strategy, each mapping per-sample gradient information to a
noisy update. `dpgrid.strategies.<name>` exports STRATEGY; conf/strategy/<name>.yaml configures it."""

import importlib

from .. import DpgridError

NAMES = ("online", "fixed_threshold", "fixed_quantile", "adamwosm", "nodp")


def get(name: str):
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise DpgridError(f"unknown strategy {name!r}; valid: {', '.join(NAMES)}") from None
    return module.STRATEGY
