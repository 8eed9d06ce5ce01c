"""Experiment trackers: a grid followed in MLflow or TensorBoard (`tracker=mlflow`, `tracker=tensorboard`; off by
default). A tracker is one module and one config of the `tracker` group, its `_target_` a `Tracker` subclass.

Training knows nothing of trackers: the runner tells a `Follower` when the grid starts (its lock held, its plan
written), when each run is committed (its row in runs.csv: the run, not a line, is the unit, so the workers of a
sweep never write into one another's runs) and when the grid ends, as the audit watches runs through
dpgrid.training.observer. What a tracker receives is made by dpgrid.tracking.published, which lets through what
dpgrid publishes and nothing else.

A tracker changes no result: the `tracker` settings are not part of a grid's identity (dpgrid.config.identity), and
a tracker that fails (a server that does not answer) is said in one warning and left off for the rest of the grid,
whose files stay the record; the same command logs what it missed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.tracking.published import Audit, Grid, Logged, Release, Run, Sweep  # noqa: F401 (a tracker's types)

FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"  # how a grid's or a sweep's run ends (MLflow's words)


class Tracker:
    """What follows grids in a tracker: a run per sweep, per grid and per (configuration, seed). Each method receives
    records of dpgrid.tracking.published only. `root` is where a local store goes (the outputs: hydra.sweep.dir)."""

    package = ""   # the module it imports (refused in one line, naming `extra`, when it is not installed)
    extra = ""     # `pip install "dpgrid[EXTRA]"`
    holder = None  # the process that holds the grid's runs (dpgrid.tracking.holder()), where it is not this one

    def __init__(self, root):
        self.root = Path(root).absolute()

    @classmethod
    def check_installed(cls, name: str) -> None:
        if cls.package and importlib.util.find_spec(cls.package) is None:
            raise DpgridError(f"tracker={name} needs the {cls.package} package: pip install \"dpgrid[{cls.extra}]\"")

    def start_sweep(self, sweep: Sweep) -> None:
        """A sweep begins (or is run again), before any of its grids."""

    def end_sweep(self, status: str) -> None:
        """The sweep's command ends: every grid has ended, in this process or a worker's."""

    def start_grid(self, grid: Grid, sweep: Path = None) -> Logged:
        """The grid begins (or resumes: its run is taken up); `sweep`: the sweep folder it is a job of. Returns what is
        logged of it already."""
        return Logged()

    def log_run(self, run: Run) -> None:
        """A run committed: logged whole."""

    def end_grid(self, status: str, release: Release = None, best: dict = None, seconds: float = None) -> None:
        """The grid's command ends (FINISHED, FAILED or KILLED), with what it released and its best configuration."""

    def log_audit(self, grid: Grid, audit: Audit) -> None:
        """An audit of the grid (trained and ended) measured its bound."""


@dataclass(frozen=True)
class Place:
    """Where a grid is followed from: the outputs' root (hydra.sweep.dir: the local store goes there) and, for a sweep's
    job, the sweep's folder (its parent run). `inline`: log in this process instead of a worker's (a test's)."""
    root: Path
    sweep: Path = None
    inline: bool = False


def compiled(node, name: str = None):
    """The tracker config (`tracker=...`) as a compiled grid keeps it (dpgrid.plugins.Target), or None (off): its class
    importable and a Tracker, its keys its constructor's, its package installed."""
    if node is None:
        return None
    from dpgrid.plugins import check_arguments, resolve, target_of

    name = name or str(node.get("_target_", "?")).rpartition(".")[0].rpartition(".")[2]  # its module's: mlflow
    cls = resolve(node, f"tracker={name}", kind="class")
    if not (isinstance(cls, type) and issubclass(cls, Tracker)):
        raise DpgridError(f"tracker={name}: {node.get('_target_')} is not a dpgrid.tracking.Tracker")
    check_arguments(node, "tracker", given_by_dpgrid=("root",))
    cls.check_installed(name)
    return target_of(node, "tracker")


def build(target, root) -> Tracker:
    from dpgrid.plugins import call

    return call(target, "tracker", root=root)


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

        self.channel = Inline(Logger()) if place.inline else Worker()
        target = spec.tracker
        self.send("open", target.target, dict(target.arguments), place.root, holder())

    def started(self) -> None:
        """The grid trains from here (its plan written and said): its run opened or taken up, with the runs committed
        before this command that the tracker lacks (a kill between a commit and its log)."""
        if self.channel is None:
            return
        from dpgrid.tracking.published import grid_of

        self.grid = grid_of(self.spec, self.out, self.place.root)
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
        from dpgrid.results.statement import MODEL
        from dpgrid.tracking.published import best_of, release_of

        release = release_of(self.out / MODEL)
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
        for line in channel.close():
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

    def close(self) -> list:
        return self.logger.close()


class Worker:
    """A worker process (dpgrid.tracking.worker) that logs the messages sent to it, on a core of its own."""

    def __init__(self):
        import os
        import subprocess
        import sys

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's modules and plugins
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

    def close(self) -> list:
        import pickle
        import subprocess

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


def holder() -> dict:
    """The process that holds a grid's runs while it trains: its host, pid and start (what tells whether it died)."""
    import os
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}


def process_start(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, Linux's /proc), '' where that cannot be read: with the pid,
    what tells the process from a later one given its number."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def alive(pid: int, start: str) -> bool:
    """Whether process `pid`, started at `start` ('' for unknown), runs on this host."""
    import os

    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return not start or process_start(int(pid)) == start


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


@contextlib.contextmanager
def sweep(cfg, overrides: list):
    """A sweep's parent run around its launch (`dpgrid run -m`), where the sweep's first job chose a tracker; its
    jobs' grids find it by the sweep's folder. Whatever its jobs leave running when it ends ends FAILED."""
    node = cfg.get("tracker")
    tracker = None
    if node is not None:
        folder = Path(str(cfg.hydra.sweep.dir)).absolute()
        try:
            tracker = build(compiled(node), folder)
            tracker.start_sweep(Sweep(str(folder), " ".join(overrides)))
        except DpgridError:
            raise
        except Exception as e:  # noqa: BLE001  (a store that cannot be opened: the grids' files are the record)
            warnings.warn(f"tracker: the sweep's run could not start ({type(e).__name__}: {first_line(e)}); its grids "
                          "are followed on their own")
            tracker = None
    status = FAILED
    try:
        yield
        status = FINISHED
    except SystemExit as e:
        status = FINISHED if e.code in (None, 0) else FAILED
        raise
    except KeyboardInterrupt:
        status = KILLED
        raise
    finally:
        if tracker is not None:
            try:
                tracker.end_sweep(status)
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"tracker: the sweep's run could not be ended ({type(e).__name__}: {first_line(e)})")


def audited(spec, grid_folder: Path, record: dict, place: Place) -> None:
    """An audit's bound and verdict, logged to the audited grid's run (dpgrid audit, once audit.json is written)."""
    if getattr(spec, "tracker", None) is None:
        return
    from dpgrid.tracking.published import audit_of, grid_of

    try:
        tracker = build(spec.tracker, place.root)
        tracker.log_audit(grid_of(spec, Path(grid_folder).absolute(), place.root), audit_of(record))
    except Exception as e:  # noqa: BLE001  (the audit's files are the record)
        warnings.warn(f"tracker: the audit was not logged ({type(e).__name__}: {first_line(e)})")


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


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
