"""A grid's command as its tracker (dpgrid.tracking) hears it: the Follower the runner tells (the grid started, a run
committed, the grid ended), which makes the published records of what the run directory holds, and the worker
process it hands them to (dpgrid.tracking.worker), which logs them in order on a core the grid leaves free."""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

from dpgrid.results.procedure import procedure_of
from dpgrid.results.statement import MODEL, STATEMENT
from dpgrid.tracking import FAILED, FINISHED, KILLED, Place, holder

WAIT_S = 300  # how long a grid's command waits, once it has ended, for its tracker to finish logging


class Follower:
    """One grid's command as its tracker hears it (dpgrid.runner calls it): each call becomes a message of published
    records, logged in order by a worker process (dpgrid.tracking.worker), so that the tracker's imports, its store and
    its writes cost the grid no time where a core is free. Without a tracker it does nothing."""

    def __init__(self, spec=None, out: Path = None, place: Place = None):
        self.spec, self.out, self.place = spec, out, place
        self.grid, self.ended_as, self.channel = None, None, None
        self.start = time.perf_counter()
        if spec is None or getattr(spec, "tracker", None) is None:
            return
        from dpgrid.tracking.worker import Logger

        try:
            self.channel = Inline(Logger()) if place.inline else Worker()
        except OSError as e:  # no process can be started: the grid's files are the record
            warnings.warn(f"tracker: its worker process could not start ({e}); the grid goes on without it")
            return
        target = spec.tracker
        self.send("open", target.target, dict(target.arguments), place.root, holder())

    def started(self) -> None:
        """The grid trains from here (its plan written and said): its run opened or taken up, with the runs committed
        before this command that the tracker lacks (a kill between a commit and its log)."""
        if self.channel is None:
            return
        from dpgrid.tracking.published import grid_of

        self.grid = grid_of(self.spec, self.out, self.place.root,
                            not procedure_of(self.spec.plan.method).releases_best_only)
        committed = committed_runs(self.out, self.spec.plan.axes, self.grid.metric) if self.grid.runs_published else []
        self.send("start", self.grid, self.place.sweep, committed)

    def committed(self, row: dict, curve: list) -> None:
        if self.grid is None or not self.grid.runs_published:
            return
        from dpgrid.tracking.published import run_of

        self.send("run", run_of(row, curve, self.spec.plan.axes, self.grid.metric))

    def ended(self, summary=None) -> None:
        """The grid's command has written its summary and release."""
        if self.grid is None:
            return
        from dpgrid.tracking.published import best_of, release_of

        release = release_of(self.out / MODEL / STATEMENT)
        if release is not None and release.withheld:
            warnings.warn(f"tracker: {release.withheld}")
        self.ended_as = FINISHED
        self.send("end", FINISHED, release, best_of(summary) if self.grid.runs_published else {},
                  time.perf_counter() - self.start)

    def stopped(self, error: BaseException) -> None:
        """The command ends without its grid's end: KILLED for a signal, else FAILED."""
        if self.grid is not None and self.ended_as is None:
            self.ended_as = KILLED if isinstance(error, KeyboardInterrupt) else FAILED
            self.send("end", self.ended_as)

    def close(self) -> None:
        """Wait for the tracker to have logged everything, and say what it had to say."""
        if self.channel is None:
            return
        if self.grid is not None and self.ended_as is None:  # a command that released nothing new (a secure grid's
            self.ended_as = FINISHED                          # one release, made before)
            self.send("end", FINISHED)
        channel, self.channel = self.channel, None
        for line in channel.close(started=self.grid is not None):
            warnings.warn(line)

    def send(self, *message) -> None:
        if self.channel is not None:
            self.channel.send(message)


class Inline:
    """The worker's Logger in this process."""

    def __init__(self, logger):
        self.logger = logger

    def send(self, message: tuple) -> None:
        self.logger.handle(message)

    def close(self, started: bool = True) -> list:
        return self.logger.close()


class Worker:
    """A worker process (dpgrid.tracking.worker) that logs the messages sent to it, on a core of its own."""

    def __init__(self):
        import os
        import subprocess
        import sys

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # its modules and plugins
        self.process = subprocess.Popen([sys.executable, "-m", "dpgrid.tracking.worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env)
        self.lost = False

    def send(self, message: tuple) -> None:
        import pickle

        if self.lost:
            return
        try:
            pickle.dump(message, self.process.stdin)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):  # it died: said when the command ends
            self.lost = True

    def close(self, started: bool = True) -> list:
        """What it had to say, once it has logged everything; a grid that never started (refused) has nothing to log,
        and its worker, which has only imported its library, is stopped at once."""
        import pickle
        import subprocess

        if not started:
            self.process.kill()
            self.process.communicate()
            return []
        try:
            said, _ = self.process.communicate(timeout=WAIT_S)  # its input closed: it ends once it has logged it
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            return [f"tracker: it had not finished logging {WAIT_S} s after the grid ended (does its server answer?); "
                    "stopped, and the same command logs what it missed"]
        try:
            return pickle.loads(said)
        except Exception:  # noqa: BLE001  (nothing, or a torn answer: it died)
            return [f"tracker: its worker process ended without finishing (exit code {self.process.returncode}); the "
                    "same command logs what it missed"]


@contextlib.contextmanager
def follow(spec, out: Path, place: Place = None):
    """The Follower of one grid's command (one that does nothing where the grid has no tracker), ended with it."""
    if getattr(spec, "tracker", None) is None:
        yield Follower()
        return
    follower = Follower(spec, Path(out).absolute(), place or Place(Path(out).absolute().parent))
    try:
        yield follower
    except BaseException as e:
        follower.stopped(e)
        follower.close()
        raise
    follower.close()


def committed_runs(out: Path, axes, metric: str) -> list:
    """The runs committed in out/runs.csv, with their validations (curves.csv), as a tracker logs them."""
    from dpgrid.results.curves import read_curves
    from dpgrid.results.files import read_frame
    from dpgrid.tracking.published import run_of

    if not (out / "runs.csv").exists():
        return []
    missing = read_frame(out / "runs.csv").to_dict("records")
    if not missing:
        return []
    curves = read_curves(out / "curves.csv")[0]
    by_run = {key: group.to_dict("records") for key, group in curves.groupby(["config_id", "seed"], sort=False)} \
        if len(curves) else {}
    return [run_of(row, by_run.get((row["config_id"], int(row["seed"])), []), axes, metric) for row in missing]
