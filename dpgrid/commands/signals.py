"""Signals (SIGTERM, Ctrl-C) while dpgrid runs: each ends the command in one line, with 143 or 130, never a traceback;
the grid stops between two writes and the same command resumes it. Once a command has said its results, a signal
changes nothing. Standard library only: the `dpgrid` command installs `starting` before it imports anything else."""

import signal
import sys


class Interrupted(KeyboardInterrupt):
    """SIGTERM or Ctrl-C (SIGINT): the grid stops between two writes and says how to resume."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


RECEIVED = []  # the signals this command received: whatever breaks after one (a module half imported) is it
FINISHED = []  # the command's results, once said: a signal after them changes nothing, and the command exits 0


def on_signal(signum, frame):
    if FINISHED:
        return
    RECEIVED.append(signum)
    raise Interrupted(signum)


def stopped(error: BaseException):
    """(name, exit code) when `error` is, or follows, an interruption; None otherwise."""
    if not (RECEIVED or isinstance(error, KeyboardInterrupt)) or isinstance(error, SystemExit):
        return None
    signum = getattr(error, "signum", RECEIVED[0] if RECEIVED else signal.SIGINT)
    return ("SIGTERM", 143) if signum == signal.SIGTERM else ("interrupted", 130)


def starting(signum, frame):
    """The handler from the command's first moment until dpgrid.commands.cli.main installs `on_signal`."""
    name, code = ("SIGTERM", 143) if signum == signal.SIGTERM else ("interrupted", 130)
    print(f"dpgrid: error: {name}: dpgrid stopped as it started; the same command starts it again", file=sys.stderr)
    raise SystemExit(code)
