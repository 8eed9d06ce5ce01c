"""The config: its schema (schema.py, registered with Hydra when a config is composed) and `compile`, which
turns a composed config and N into the frozen GridSpec that everything after it receives (compile.py)."""

from dpgrid.config.compile import GridSpec, Training, compile, planned, settings_of
from dpgrid.config.schema import register

__all__ = ["GridSpec", "Training", "compile", "planned", "register", "settings_of"]
