"""Modules loaded at their first use: the strategies name torch at the top as usual, yet a config is checked
(their `check_options`, their accounting attributes) without loading it, so a refusal answers in the time
Python takes to start. Nothing happens at import: no module is registered in sys.modules until one is used."""

import importlib


class LazyModule:
    """The module `name`, imported (importlib.import_module) at the first attribute asked of it."""

    def __init__(self, name: str):
        self._name, self._module = name, None

    def __getattr__(self, attribute: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, {'loaded' if self._module is not None else 'loaded at first use'}>"


def lazy_import(name: str) -> LazyModule:
    return LazyModule(name)
