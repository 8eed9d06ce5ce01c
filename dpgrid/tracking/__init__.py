"""Experiment trackers: a grid followed in MLflow or TensorBoard (`tracker=mlflow`, `tracker=tensorboard`; off by
default). A tracker is one module and one config of the `tracker` group, its `_target_` a `Tracker` subclass.

Training knows nothing of trackers: the runner tells a `Follower` (dpgrid.results.tracked) when the grid starts
(its lock held, its plan written), when each run is committed (its row in runs.csv: the run, not a line, is the
unit, so the workers of a sweep never write into one another's runs) and when the grid ends, as the audit watches
runs through dpgrid.training.observer. What a tracker receives is made by dpgrid.tracking.published, which lets
through what dpgrid publishes and nothing else; a worker process (dpgrid.tracking.worker) logs it.

A tracker changes no result: the `tracker` settings are not part of a grid's identity (dpgrid.config.identity), and
a tracker that fails (a server that does not answer) is said in one warning and left off for the rest of the grid,
whose files stay the record; the same command logs what it missed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
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
    def prepare(cls) -> None:
        """Import the tracker's library ahead of its use (in the worker process, while the grid loads and trains)."""
        if cls.package:
            importlib.import_module(cls.package)

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
    from omegaconf import OmegaConf

    from dpgrid.plugins import check_arguments, resolve, target_of

    if not OmegaConf.is_dict(node):  # `tracker=NAME` where no config of the group was found: a plain value
        raise DpgridError(f"no tracker named {node!r}: tracker= takes an option of conf/tracker/ (`dpgrid --help` "
                          "lists them)")

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
def sweep(node, folder, overrides: list):
    """A sweep's parent run around its launch (`dpgrid run -m`), where the sweep's first job chose a tracker (`node`,
    its config; None: none); its jobs' grids find it by the sweep's folder (hydra.sweep.dir). Whatever its jobs leave
    running when it ends ends FAILED."""
    tracker = None
    if node is not None:
        folder = Path(str(folder)).absolute()
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
        tracker.log_audit(grid_of(spec, Path(grid_folder).absolute(), place.root, True), audit_of(record))
    except Exception as e:  # noqa: BLE001  (the audit's files are the record)
        warnings.warn(f"tracker: the audit was not logged ({type(e).__name__}: {first_line(e)})")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
