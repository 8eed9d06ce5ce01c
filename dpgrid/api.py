"""dpgrid from Python (a notebook, a script, a test): the same calls the command line makes.

    import dpgrid
    cfg = dpgrid.compose(["strategy=fixed_threshold", "grid.k=3", "train.epochs=1"])
    spec = dpgrid.compile(cfg)                         # frozen and validated: spec.plan.noise_multiplier, ...
    result = dpgrid.run_grid(spec, "outputs/mine")    # writes and resumes exactly like `dpgrid run`
    result.summary                                     # pandas DataFrames: runs, curves, summary
    dpgrid.tables("outputs")

Every function raises DpgridError (a ValueError) on bad input, never SystemExit, and writes to disk only
where asked (run_grid's out_dir, tables' results_dir/tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrid.config.compose import compose  # noqa: F401 (dpgrid.compose, the first of the calls above)

if TYPE_CHECKING:  # pandas is imported when a grid is run: `dpgrid` refuses bad input before that
    import pandas as pd


def compile(cfg, n_train: int = None):
    """The config compiled into a frozen, validated grid (dpgrid.config.GridSpec); N as given, else the config's
    dataset.n_train, else the loaded data's."""
    from dpgrid.config import compile as compile_grid

    return compile_grid(cfg, n_train)


def plan(cfg, n_train: int = None):
    """The grid's validated privacy plan (dpgrid.privacy.Plan): compile(cfg, n_train).plan."""
    return compile(cfg, n_train).plan


@dataclass
class GridResult:
    """What a grid wrote: its directory, plan and the three CSVs as DataFrames."""
    out_dir: Path
    plan: dict
    runs: pd.DataFrame
    curves: pd.DataFrame
    summary: pd.DataFrame

    @property
    def best(self):
        return self.summary[self.summary.best].iloc[0]


def run_grid(cfg, out_dir, progress: bool = True) -> GridResult:
    """Train the grid (a composed config, or the GridSpec `compile` made of one) into out_dir, resuming what
    is there, as `dpgrid run` does."""
    import json

    from dpgrid.config import GridSpec
    from dpgrid.results.files import directory_setting, read_frame
    from dpgrid.runner import train

    with directory_setting("another out_dir of run_grid"):
        train((cfg if isinstance(cfg, GridSpec) else compile(cfg)).announce(), out_dir, progress)
    out = Path(out_dir)
    read = lambda name: read_frame(out / name)  # noqa: E731
    return GridResult(out, json.loads((out / "plan.json").read_text()), read("runs.csv"), read("curves.csv"),
                      read("summary.csv"))


def tables(results_dir="outputs", figures: bool = True, mix_budgets: bool = False, report=print, out=None) -> list:
    """Paper-style tables (and figures) of every grid under results_dir into `out` (default results_dir/tables);
    returns the files written."""
    from dpgrid.reporting.tables import write_tables
    from dpgrid.results.files import directory_setting

    with directory_setting("another out for tables"):
        return write_tables(Path(results_dir), figures=figures, mix_budgets=mix_budgets, report=report, out=out)
