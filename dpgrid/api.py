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

from dpgrid import DpgridError
from dpgrid.config.compose import DPGRID_LAUNCHER, check_launcher, compose, sweep_jobs

if TYPE_CHECKING:  # pandas is imported when a grid is run: `dpgrid` refuses bad input before that
    import pandas as pd


def refuse_jobs(refused: list, jobs: int) -> None:
    """[(job's overrides, its DpgridError)] as one refusal: each job named on a line of its own, or the one reason
    alone where every job gives it (a sweep-wide setting)."""
    reasons = [str(e) for _, e in refused]
    if len(refused) == jobs and len(set(reasons)) == 1:
        raise DpgridError(reasons[0])
    if len(refused) == 1:
        raise DpgridError(f"sweep job {' '.join(refused[0][0])}: {reasons[0]}")
    if refused:
        raise DpgridError(f"{len(refused)} of the sweep's {jobs} jobs cannot run, so none was started:\n"
                          + "\n".join(f"sweep job {' '.join(job)}: {reason}" for (job, _), reason in zip(refused, reasons)))


def check_sweep(overrides: list) -> dict:
    """Every job of a sweep composed, checked and planned in this process (every refusal `dpgrid plan` would give),
    before any is launched or queued: a sweep with a job that cannot run trains nothing, and each such job is named in
    a line of its own; jobs of different configs that would write into one directory are refused, naming their
    overrides. Returns {each job's directory: the config hash checked for it}."""
    import warnings

    from dpgrid.config import compile
    from dpgrid.results.claim import check_run

    jobs, composed = sweep_jobs(overrides), []
    for job in jobs:  # the cheap checks of every job first, so a bad value is refused before torch is loaded
        try:
            cfg = compose(job, with_hydra=True)
            out = (Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)).absolute()
            spec = compile(cfg, plan=False)
            check_run(spec, out)
            composed.append((job, cfg, out, spec))
        except DpgridError as e:
            composed.append((job, e, None, None))
    refuse_jobs([(job, cfg) for job, cfg, _, _ in composed if isinstance(cfg, DpgridError)], len(jobs))
    check_launcher(composed[0][1].hydra.launcher)  # one launcher for the whole sweep
    planned = []
    for job, cfg, _, _ in composed:  # the plan's own refusals (a noise the strategy cannot carry, an unreachable epsilon)
        try:
            with warnings.catch_warnings():  # the job says its own warnings when it runs
                warnings.simplefilter("ignore")
                compile(cfg)
        except DpgridError as e:
            planned.append((job, e))
    refuse_jobs(planned, len(jobs))
    by_dir, checked = {}, set()
    for job, cfg, out, spec in composed:
        by_dir.setdefault(out, {}).setdefault(spec.config_hash, job)
        if str(cfg.hydra.launcher.get("_target_", "")) == DPGRID_LAUNCHER:  # what a queued job would find late
            check_before_queue(spec, job, out, bool(cfg.data.check_before_queue), checked)
    for out, jobs in by_dir.items():
        if len(jobs) > 1:
            first, second = list(jobs.values())[:2]
            differ = [o for o in second if o not in first]
            raise DpgridError(f"the sweep's jobs '{' '.join(first)}' and '{' '.join(second)}' would both write into "
                              f"{out} ({', '.join(differ)} is not part of its name); give them different "
                              "directories, e.g. add that key to hydra.sweep.subdir")
    return {out: next(iter(jobs)) for out, jobs in by_dir.items()}


def check_before_queue(spec, job: list, out: Path, data: bool, checked: set) -> None:
    """A SLURM sweep job's refusals that would otherwise come after its wait in the queue: its dataset under
    data.root (loaded once per dataset and root; `data` False skips it), and its run directory's lock."""
    from dpgrid.results.files import locked

    key = (spec.dataset.name, str(spec.data_root))
    if data and key not in checked:
        from dpgrid.data import load

        checked.add(key)
        try:
            load(spec.dataset, spec.data_root)
        except DpgridError as e:
            raise DpgridError(f"sweep job {' '.join(job)}: {e} (checked on this machine before queueing; "
                              "data.check_before_queue=false skips it where the cluster's nodes see other paths)") from None
    if (out / ".lock").exists():
        try:
            with locked(out):
                pass
        except DpgridError as e:
            raise DpgridError(f"sweep job {' '.join(job)}: {e}") from None


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
