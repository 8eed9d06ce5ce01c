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


# Modules that moved into packages in 0.2 (commands, models, data): their old path still imports, with one line that
# names the new one, and a config's `_target_` under an old path still resolves (dpgrid.config.identity hashes either
# spelling as the old one, so a grid recorded before the move keeps its hash and resumes).
MOVED_MODULES = {"dpgrid.cli": "dpgrid.commands.cli", "dpgrid.jobs": "dpgrid.commands.jobs",
                 "dpgrid.launchers": "dpgrid.commands.launchers", "dpgrid.slurm": "dpgrid.commands.slurm",
                 "dpgrid.signals": "dpgrid.commands.signals", "dpgrid.audit.command": "dpgrid.commands.audit",
                 "dpgrid.transformers": "dpgrid.models.transformers", "dpgrid.finetuning": "dpgrid.models.finetuning",
                 "dpgrid.datasets": "dpgrid.data.datasets", "dpgrid.tasks": "dpgrid.data.tasks",
                 "dpgrid.binary": "dpgrid.data.binary"}


class _MovedModule:
    """The import of a moved module's old path: the module at its new path, and a FutureWarning naming it."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in MOVED_MODULES:
            return None
        from importlib.util import spec_from_loader
        return spec_from_loader(name, _MovedModule)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        import importlib
        import sys
        import warnings

        new = MOVED_MODULES[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}: import it from there", FutureWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(new)  # what the import statement then returns


def _install_moved_modules():
    import sys
    if not any(finder is _MovedModule for finder in sys.meta_path):
        sys.meta_path.append(_MovedModule)


_install_moved_modules()


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


def cache_folder(variable: str, kind: str):
    """Where dpgrid keeps what it can compute again (`kind`: noise, features, ...): the path in the environment
    variable `variable`, None where it says off, else $XDG_CACHE_HOME/dpgrid/<kind> (~/.cache/dpgrid/<kind>)."""
    import os
    from pathlib import Path

    setting = os.environ.get(variable)
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpgrid" / kind
