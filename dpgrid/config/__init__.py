"""The config: its schema (schema.py, registered with Hydra when a config is composed) and `compile`, which
turns a composed config and N into the frozen GridSpec that everything after it receives (compile.py)."""

from dpgrid.config.compile import GridSpec, Training, check_loaded, compile, settings_of
from dpgrid.config.schema import register

__all__ = ["GridSpec", "Training", "check_loaded", "compile", "register", "settings_of"]
