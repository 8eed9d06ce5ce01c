"""Modules loaded at their first use: the strategies name torch at the top as usual, yet a config is checked
(their `check_options`, their accounting attributes) without loading it, so a refusal answers in the time
Python takes to start. The Python documentation's recipe (importlib.util.LazyLoader)."""

import importlib.util
import sys


def lazy_import(name: str):
    """The module `name`: the imported one if it is loaded, else one that loads on first attribute access."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

