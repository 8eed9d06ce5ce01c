"""Strategy + k -> the grid's configurations, each with a stable id such as `lr3_clip2`.

Axes (docs/protocol.md §2): lr = logspace(lr_range, k), clip = logspace(clip_range, k), quantile = the fixed list; a
strategy may bring its own axes as lists in its config (`axes: {sigma: [0.001, 0.01]}`). A strategy with no
axis (`grid: []`) has one configuration, `default`.
"""

import itertools
import math

import numpy as np

from dpgrid import DpgridError

ID_PREFIX = {"lr": "lr", "clip": "clip", "quantile": "q"}
AXIS_SYMBOL = {"lr": "ρ", "clip": "C", "quantile": "γ", "sigma": "σ"}  # how tables and figures print each axis


def own_axis(axis: str, strategy_cfg):
    """The values of an axis the strategy config lists itself, or None."""
    own = strategy_cfg.get("axes") or {}
    return [float(v) for v in own[axis]] if axis in own else None


def axis_values(axis: str, grid_cfg, strategy_cfg=None) -> list:
    if strategy_cfg is not None and own_axis(axis, strategy_cfg) is not None:
        return own_axis(axis, strategy_cfg)
    if axis == "lr":
        return np.logspace(*grid_cfg.lr_range, int(grid_cfg.k)).tolist()
    if axis == "clip":
        return np.logspace(*grid_cfg.clip_range, int(grid_cfg.k)).tolist()
    if axis == "quantile":
        return [float(v) for v in grid_cfg.quantiles]
    raise DpgridError(f"unknown grid axis {axis!r}; valid: {', '.join(ID_PREFIX)}")


def size(strategy_cfg, grid_cfg) -> int:
    """K, without building the configurations (a huge grid is refused before it is built)."""
    lengths = {"lr": int(grid_cfg.k), "clip": int(grid_cfg.k), "quantile": len(grid_cfg.quantiles),
               **{a: len(v) for a, v in (strategy_cfg.get("axes") or {}).items()}}
    unknown = [a for a in strategy_cfg.grid if a not in lengths]
    if unknown:
        raise DpgridError(f"strategy.grid names unknown axes {unknown}; valid: {', '.join(ID_PREFIX)}")
    return math.prod(lengths[a] for a in strategy_cfg.grid)


def configurations(strategy_cfg, grid_cfg) -> list:
    """-> [{"config_id": "lr3_clip2", "lr": 0.316, "clip": 0.215}, ...] in a fixed order."""
    axes = list(strategy_cfg.grid)
    values = [axis_values(a, grid_cfg, strategy_cfg) for a in axes]
    configs = []
    for picks in itertools.product(*(list(enumerate(v)) for v in values)):
        config_id = "_".join(f"{ID_PREFIX.get(a, a)}{i}" for a, (i, _) in zip(axes, picks)) or "default"
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


def edges(configuration: dict, configurations: list, axes: list) -> list:
    """The axes on whose end a configuration lies, as "ρ at its largest": a best configuration there suggests the
    grid stopped short of the best value. Only axes of three values or more (with two, every value is an end)."""
    found = []
    for axis in axes:
        values = sorted({c[axis] for c in configurations if axis in c})
        if len(values) < 3 or axis not in configuration:
            continue
        at = [end for end, value in (("smallest", values[0]), ("largest", values[-1]))
              if math.isclose(float(configuration[axis]), value, rel_tol=1e-9)]
        found += [f"{AXIS_SYMBOL.get(axis, axis)} at its {end}" for end in at]
    return found
