"""`python tests/paused.py READY GO AFTER dpgrid ARGS...`: `dpgrid ARGS...` in a real process that, right
after committing its AFTER-th run (0: once it holds the run directory, before any run; -1: at start-up, as
it composes its config; "finished": once it has said its results; a module's name: as that module starts to be
imported, wherever the start-up imports it, e.g. torch.nn inside torch's own import, or dpgrid.commands.cli as the command
starts), creates the file READY and waits until the file GO exists. A test then acts at that moment (a signal, kill -9, a second
writer) without racing the grid: the process is where the test wants it, however loaded the machine."""

import sys
import time
from pathlib import Path


def main() -> None:
    ready, go = Path(sys.argv[1]), Path(sys.argv[2])

    def pause():
        ready.touch()
        while not go.exists():  # a signal interrupts this sleep and is handled as anywhere in the grid
            time.sleep(0.01)

    if sys.argv[3] == "finished":  # once the results are said: the command must end as a finished one
        from dpgrid.commands import signals

        class Pausing(list):
            def append(self, item):
                super().append(item)
                pause()

        signals.FINISHED = Pausing()
        from dpgrid.commands import cli
        cli.FINISHED = signals.FINISHED
        sys.argv[1:] = sys.argv[5:]
        from dpgrid.__main__ import main as command  # as the `dpgrid` command starts
        command()
        return
    if not sys.argv[3].lstrip("-").isdigit():  # a module's name: pause as its import starts
        import importlib.abc

        module = sys.argv[3]

        class Importing(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == module and not ready.exists():
                    pause()
                return None

        sys.meta_path.insert(0, Importing())
        sys.argv[1:] = sys.argv[5:]
        from dpgrid.__main__ import main as command  # as the `dpgrid` command starts
        command()
        return
    after = int(sys.argv[3])
    from dpgrid import runner
    from dpgrid.commands.cli import main as dpgrid

    commit, header = runner.commit_run, runner.write_header
    commits = [0]

    def committed(*args, **kwargs):
        count = commit(*args, **kwargs)
        commits[0] += 1
        if commits[0] == after:
            pause()
        return count

    def holding(*args, **kwargs):  # once it holds the run directory, before any run
        header(*args, **kwargs)
        if after == 0:
            pause()

    runner.commit_run, runner.write_header = committed, holding
    if after < 0:
        import importlib

        composing = importlib.import_module("dpgrid.config.compose")  # where the command line takes compose from
        compose = composing.compose

        def starting(*args, **kwargs):
            pause()
            return compose(*args, **kwargs)

        composing.compose = starting
    dpgrid(sys.argv[5:])


if __name__ == "__main__":
    main()
