"""The process that talks to a grid's tracker (`python -m dpgrid.tracking.worker`, started by the grid's Follower): it
imports the tracker's library and opens its store on a core the grid leaves idle, and logs each message the grid sends
(pickled records of dpgrid.tracking.published, on its standard input) in order. What it has to say (a tracker that
failed) goes back on its standard output when its input ends, for the grid's command to say.

Its input ends when the grid's command ends, however it ends: a command killed before it said the grid's end (kill -9)
leaves the grid's run FAILED here. Ctrl-C and SIGTERM reach the whole process group: this process ignores them and
ends its runs as the command tells it, or as its input ends.
"""

import os
import pickle
import signal
import sys

from dpgrid.tracking import FAILED, first_line


class Logger:
    """One grid command's messages, applied to its tracker in order; a tracker that fails is said once and left off."""

    def __init__(self):
        self.tracker, self.target, self.logged, self.said = None, None, set(), []
        self.started = self.ended = False

    def handle(self, message: tuple) -> None:
        kind, *args = message
        getattr(self, kind)(*args)

    def open(self, target: str, arguments: dict, root, holder: dict) -> None:
        """Import the tracker and its library (what costs seconds, done while the grid loads and trains); its store is
        opened once the grid starts, so a grid refused before that leaves no trace in it. `holder`: the grid's
        process, which holds its runs."""
        from dpgrid.plugins import Target, resolve

        self.target, self.root, self.holder = Target(target, arguments), root, holder
        try:
            resolve(self.target, "tracker", kind="class").prepare()
        except Exception as e:  # noqa: BLE001  (said when the grid starts, as the build's own failure)
            self.target = None
            self.fail(target.rpartition(".")[2], "could not start", e)

    def start(self, grid, sweep, committed: list) -> None:
        """The tracker built (its store opened), the grid's run opened or taken up; the `committed` runs it lacks
        logged now."""
        from dpgrid.tracking import build

        if self.target is None:
            return
        try:
            self.tracker = build(self.target, self.root)
            self.tracker.holder = self.holder
        except Exception as e:  # noqa: BLE001  (a store that cannot be opened: the grid's files are the record)
            self.fail(self.target.target.rpartition(".")[2], "could not start", e)
            return
        logged = self.call("start_grid", grid, sweep)
        if logged is None:
            return
        self.started, self.logged = True, set(logged.runs)
        for run in committed:
            self.run(run)

    def run(self, run) -> None:
        key = (run.config_id, run.seed)
        if not self.started or key in self.logged:  # a resumed grid's run logged before, or sent twice
            return
        self.call("log_run", run)
        self.logged.add(key)

    def end(self, status: str, release=None, best=None, seconds=None) -> None:
        if self.started and not self.ended:
            self.ended = True
            self.call("end_grid", status, release, best, seconds)

    def close(self) -> list:
        """The input ended: a grid whose end was not said ends FAILED (its command died). Returns what to say."""
        self.end(FAILED)
        return self.said

    def call(self, method: str, *args):
        if self.tracker is None:
            return None
        try:
            return getattr(self.tracker, method)(*args)
        except Exception as e:  # noqa: BLE001  (the tracker's own fault: the grid goes on, its files are the record)
            self.fail(type(self.tracker).__name__, "failed", e)
            return None

    def fail(self, name: str, how: str, error: BaseException) -> None:
        self.tracker = None
        self.said.append(f"tracker: {name} {how} ({type(error).__name__}: {first_line(error)}); the grid goes on "
                         "without it, and the same command logs what it missed")


def main() -> None:
    for name in ("SIGINT", "SIGTERM"):  # the grid's command says how its runs end
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    logger, stream = Logger(), sys.stdin.buffer
    while True:
        try:
            message = pickle.load(stream)
        except (EOFError, pickle.UnpicklingError):  # the command ended (a torn message: it was killed mid-write)
            break
        logger.handle(message)
    pickle.dump(logger.close(), sys.stdout.buffer)
    sys.stdout.flush()
    # Every write is done by now (each tracker call commits or closes its own); the interpreter's teardown of the
    # tracker's library (MLflow, SQLAlchemy: about a second) would only make the grid's command wait.
    os._exit(0)


if __name__ == "__main__":
    main()
