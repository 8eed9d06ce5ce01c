"""Strategy + k -> the grid's configurations, each with a stable id such as `lr3_clip2`.

Axes (SPEC §2): lr = logspace(lr_range, k), clip = logspace(clip_range, k), quantile = the fixed list.
"""

import itertools
import math

import numpy as np

from . import DpgridError

ID_PREFIX = {"lr": "lr", "clip": "clip", "quantile": "q"}
AXIS_SYMBOL = {"lr": "ρ", "clip": "C", "quantile": "γ"}  # how tables and figures print each axis


def axis_values(axis: str, grid_cfg) -> list:
    if axis == "lr":
        return np.logspace(*grid_cfg.lr_range, int(grid_cfg.k)).tolist()
    if axis == "clip":
        return np.logspace(*grid_cfg.clip_range, int(grid_cfg.k)).tolist()
    if axis == "quantile":
        return [float(v) for v in grid_cfg.quantiles]
    raise DpgridError(f"unknown grid axis {axis!r}; valid: {', '.join(ID_PREFIX)}")


def size(strategy_cfg, grid_cfg) -> int:
    """K, without building the configurations (a huge grid is refused before it is built)."""
    lengths = {"lr": int(grid_cfg.k), "clip": int(grid_cfg.k), "quantile": len(grid_cfg.quantiles)}
    unknown = [a for a in strategy_cfg.grid if a not in lengths]
    if unknown:
        raise DpgridError(f"strategy.grid names unknown axes {unknown}; valid: {', '.join(ID_PREFIX)}")
    return math.prod(lengths[a] for a in strategy_cfg.grid)


def configurations(strategy_cfg, grid_cfg) -> list:
    """-> [{"config_id": "lr3_clip2", "lr": 0.316, "clip": 0.215}, ...] in a fixed order."""
    axes = list(strategy_cfg.grid)
    values = [axis_values(a, grid_cfg) for a in axes]
    configs = []
    for picks in itertools.product(*(list(enumerate(v)) for v in values)):
        config_id = "_".join(f"{ID_PREFIX[a]}{i}" for a, (i, _) in zip(axes, picks))
        configs.append({"config_id": config_id, **{a: v for a, (_, v) in zip(axes, picks)}})
    return configs


def select(configs: list, only) -> list:
    """The configurations named by `grid.only` (all when None), refusing unknown ids."""
    if only is None:
        return configs
    only = [str(o) for o in only]
    known = {c["config_id"] for c in configs}
    unknown = [o for o in only if o not in known]
    if unknown:
        raise DpgridError(f"grid.only names unknown configuration(s) {unknown}; valid: {sorted(known)}")
    return [c for c in configs if c["config_id"] in only]
