"""TensorBoard (`tracker=tensorboard`, `pip install "dpgrid[tensorboard]"`): event files under `tracker.dir` (default
<hydra.sweep.dir>/tensorboard), a folder per grid named as its run directory under the outputs, and in it a folder per
configuration and seed: `tensorboard --logdir outputs/tensorboard`.

A grid's folder holds its plan and what it covers (Text), its release and best configuration (Scalars, Text) and an
audit's bound; each run's folder its validations with their steps (Scalars) and its configuration beside its best
value (HParams). A run's folder is written whole under a hidden name and renamed into place: it exists once the run is
logged, so a resumed grid logs the runs whose folder is missing, and a folder a kill left half-written is removed
when its grid starts again (its lock held: no other process writes there).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dpgrid.tracking import Tracker
from dpgrid.tracking.published import Audit, Grid, Logged, Release, Run

PARTIAL = ".partial-"  # a run's folder while it is written: .seed<s>.partial-<pid>


class TensorboardTracker(Tracker):
    package, extra = "tensorboard", "tensorboard"

    def __init__(self, root, dir: str = None):  # noqa: A002  (the config's key, as lightning-hydra-template names it)
        super().__init__(root)
        self.dir = Path(dir).absolute() if dir else self.root / "tensorboard"
        self.folder = None

    def start_grid(self, grid: Grid, sweep: Path = None) -> Logged:
        self.folder = self.dir / grid.name
        logged = Logged()
        for config in (p for p in self.folder.glob("*") if p.is_dir() and not p.name.startswith(".")):
            for run in config.iterdir():
                if run.name.startswith(".") and PARTIAL in run.name:  # a kill's half-written run
                    shutil.rmtree(run, ignore_errors=True)
                elif run.is_dir() and run.name.startswith("seed") and run.name[4:].isdigit():
                    logged.runs.add((config.name, int(run.name[4:])))
        with writer(self.folder) as w:
            w.add_text("plan", table(grid.params))
            if grid.covers:
                w.add_text("covers", grid.covers)
        return logged

    def log_run(self, run: Run) -> None:
        from torch.utils.tensorboard.summary import hparams

        target = self.folder / run.config_id / f"seed{run.seed}"
        partial = target.parent / f".{target.name}{PARTIAL}{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        with writer(partial) as w:
            for step, values in run.curve:
                for key, value in values.items():
                    w.add_scalar(curve_tag(key), value, step)
            ended = {f"run/{key}": value for key, value in run.values.items()}
            ended["run/diverged"] = float(run.diverged)
            for key, value in ended.items():
                w.add_scalar(key, value, 0)
            for summary in hparams(dict(run.params), ended):
                w.file_writer.add_summary(summary)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)

    def end_grid(self, status: str, release: Release = None, best: dict = None, seconds: float = None) -> None:
        if self.folder is None:
            return
        with writer(self.folder) as w:
            w.add_text("status", status)
            best = dict(best or {})
            if "config_id" in best:
                w.add_text("best_config", best.pop("config_id"))
            for key, value in best.items():
                w.add_scalar(f"grid/{key}", value, 0)
            if seconds is not None:
                w.add_scalar("grid/seconds", seconds, 0)
            if release is not None:
                for key, value in release.values.items():
                    w.add_scalar(key.replace(".", "/", 1), value, 0)  # release/epsilon: grouped as TensorBoard groups
                w.add_text("release", table({**release.params, "covers": release.covers,
                                              "model": str(release.folder) if release.folder else release.withheld}))

    def log_audit(self, grid: Grid, audit: Audit) -> None:
        with writer(self.dir / grid.name) as w:
            for key, value in audit.values.items():
                w.add_scalar(key.replace(".", "/", 1), value, 0)
            w.add_text("audit", table({**audit.params, **({"mechanism": audit.verdict} if audit.verdict else {})}))


def curve_tag(key: str) -> str:
    """A validation's scalar: test/<metric>, test/loss, and the strategy's state (clip, lr, its own)."""
    return f"test/{key[len('test_'):]}" if key.startswith("test_") else f"state/{key}"


def table(values: dict) -> str:
    """A Markdown table of name and value (TensorBoard's Text tab renders it)."""
    return "| name | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in values.items())


class writer:
    """A SummaryWriter into `folder`, flushed and closed when the block ends."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __enter__(self):
        from torch.utils.tensorboard import SummaryWriter

        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(self.folder), max_queue=10_000, flush_secs=3600)
        return self.writer

    def __exit__(self, *exc):
        self.writer.close()
