"""dpgrid: honest private hyperparameter search for DP-SGD clipping strategies.

The Python API (see dpgrid.api): compose, compile, plan, run_grid, tables; the plugin base classes Strategy
(dpgrid.strategies) and Data (dpgrid.data). Imported on first use, so `import dpgrid` stays light.
"""

__version__ = "0.1.0"
_LAZY = {"compose": "api", "compile": "api", "plan": "api", "run_grid": "api", "tables": "api", "GridResult": "api",
         "load_model": "results.models", "Strategy": "strategies", "Data": "data"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DpgridError(ValueError):
    """A problem with the user's input (config, data, results): shown as one line, exit code 2 (or `exit_code`, e.g.
    130 where the user interrupted); only the command line turns it into an exit."""

    exit_code = 2

    def __init__(self, *args, exit_code: int = None):
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code


class EnvironmentFault(DpgridError):
    """A problem with the machine (full disk, read-only or blocked folder): one line, exit code 1.
    The same command, once the fault is gone, resumes where the grid stopped."""

    exit_code = 1
