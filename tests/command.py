"""`dpgrid ARGS` inside the test process: the command line's own `main()`, with its exit code, stdout and
stderr, as a fresh process would give them, but without the 2.5 s a new interpreter spends importing torch,
Hydra and Opacus. What only a real process shows (kill -9, signals, python -O, the installed entry point)
is tested with real processes."""

import contextlib
import io
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str


def dpgrid(*args, cwd=None, path=()) -> Completed:
    """Run `dpgrid *args` in `cwd` with `path` prepended to sys.path (a user's plugin package)."""
    from dpgrid.commands.cli import main

    keep_absl_off_captured_streams()
    out, err, code = io.StringIO(), io.StringIO(), 0
    saved = os.getcwd(), sys.path[:]
    try:
        os.chdir(cwd or saved[0])
        sys.path[:0] = [str(p) for p in path]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("default")  # a fresh registry: each warning once per call, as per process
            warnings.showwarning = show  # on stderr, as a process prints it (pytest would record it instead)
            try:
                main([str(a) for a in args])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        keep_absl_off_captured_streams()
        os.chdir(saved[0])
        sys.path[:] = saved[1]
    return Completed(code, out.getvalue(), err.getvalue())


def show(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def keep_absl_off_captured_streams():
    """absl's log handler (dp-accounting imports absl) keeps the sys.stderr of its import, and Hydra's logging
    set-up closes every handler: in one process that would close pytest's or this module's captured stream.
    The real stderr is never closed by absl."""
    if "absl.logging" in sys.modules:
        sys.modules["absl.logging"].get_absl_handler().python_handler.stream = sys.__stderr__


STARTED = []  # the paused processes of the running test: tests/conftest.py ends any it leaves behind


def start_paused(args, after, folder: Path):
    """A real `dpgrid *args` process, returned once it has committed `after` runs (0: once it holds its run
    directory; a module's name: as that module's import starts) and waits there (tests/paused.py); touch the
    returned GO file to let it go on."""
    ready, go = folder / "paused.ready", folder / "paused.go"
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("paused.py")), str(ready), str(go), str(after),
                             "dpgrid", *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    deadline = time.monotonic() + 900  # only a hung process meets this, however loaded the machine
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"dpgrid ended (exit {proc.returncode}) before pausing: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("dpgrid did not reach its pause")
        time.sleep(0.01)
    return proc, go


def one_line(stderr: str) -> bool:
    """A refusal in one line: a single line besides the warnings said before it (each one line too)."""
    return len([line for line in stderr.splitlines() if not line.startswith("dpgrid: warning:")]) == 1
