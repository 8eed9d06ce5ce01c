"""The `dpgrid` command (and `python -m dpgrid`): a signal is one line from the command's first moment, the import of
the command line included, never a traceback."""

import signal

from dpgrid.commands.signals import starting


def main() -> None:
    for received in (signal.SIGTERM, signal.SIGINT):
        signal.signal(received, starting)
    from dpgrid.commands.cli import main as command

    command()


if __name__ == "__main__":
    main()
