"""`_target_` nodes: what a config names, resolved and called, and the Reader a plugin checks its keys with. Built-in
strategies, models and dataset loaders go through here exactly like a user's (their own package, their own config
folder on Hydra's search path). Failures are one line naming the config option and the target."""

import logging
import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from hydra.utils import get_class, get_method
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpgrid import DpgridError


@dataclass(frozen=True)
class Target:
    """A config's `_target_` and the keyword arguments its node gives it, as plain values: what a compiled grid keeps
    of its model config and its dataset's loader (every function below takes one or the node)."""
    target: str
    arguments: Mapping


def target_of(node, where: str) -> Target:
    return Target(target_name(node, where), MappingProxyType(arguments(node)))


def target_name(node, where: str) -> str:
    if isinstance(node, Target):
        return node.target
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if not target or not isinstance(target, str):
        raise DpgridError(f"{where}: no _target_ (a dotted path to a class or function, e.g. mypkg.module.Name)")
    return target


def check_hooks(cls, base, where: str) -> None:
    """A plugin class that defines a hook dpgrid no longer calls is refused in one line naming what replaced it:
    its override would be ignored without a word (an accounting method's last-release `plan`, now `calibrate`, would
    spend the full epsilon instead of what it asks for). `base._renamed_hooks`: {old name: what replaced it}."""
    for old, new in getattr(base, "_renamed_hooks", {}).items():
        for klass in cls.__mro__:
            if klass is base:
                break
            if old in vars(klass):
                raise DpgridError(f"{where}: {klass.__name__} defines `{old}`, which dpgrid no longer calls: {new}")


def resolve(node, where: str, kind: str = "callable"):
    """The class (kind="class") or callable that node._target_ names."""
    target = target_name(node, where)
    hydra_log = logging.getLogger("hydra.utils")  # it logs the failure in three lines before raising it
    quiet, hydra_log.disabled = hydra_log.disabled, True
    try:
        return get_class(target) if kind == "class" else get_method(target)
    except Exception as e:  # Hydra wraps import errors of every kind
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise DpgridError(f"{where}: cannot import _target_ {target} ({reason})") from None
    finally:
        hydra_log.disabled = quiet


def arguments(node) -> dict:
    """The node's keys other than _target_, as plain Python values."""
    if isinstance(node, Target):
        return dict(node.arguments)
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"}


def check_arguments(node, where: str, given_by_dpgrid=()) -> None:
    """Refuse a key of node that its _target_ does not take as a keyword argument (a typo in a config, or a
    `+model.foo=1` nothing would read), naming what it takes; a target that takes **kwargs takes anything."""
    import inspect

    target = resolve(node, where)
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: left to the call
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    takes = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
             and p.name not in given_by_dpgrid]
    for key in arguments(node):
        if key not in takes:
            raise DpgridError(f"{where}.{key}: {target_name(node, where)} takes no argument {key!r}; it takes "
                              f"{', '.join(takes) or 'none'}")


def call(node, where: str, **extra):
    """Call node._target_ with the node's other keys and `extra` (which win)."""
    return resolve(node, where)(**{**arguments(node), **extra})


# --- the keys a plugin is given, each checked as it is read ----------------------------------------------

FLOAT32_MAX = 3.4e38  # parameters, thresholds and rates live in float32 tensors
MAX_LOG10 = 10        # grid axes span at most 10^-10 .. 10^10


class Reader:
    """Reads the keys of one config node, each checked as it is read: a value outside its range is a
    DpgridError naming the key (`prefix` + key) and what is valid. `Reader(cfg)` reads the top-level
    settings; a strategy's `check_options` gets a Reader of its own keys only (prefix "strategy.")."""

    def __init__(self, values, prefix: str = ""):
        self.values, self.prefix = values, prefix

    def get(self, key: str):
        node = self.values
        try:
            if OmegaConf.is_config(node):
                return OmegaConf.select(node, key, throw_on_missing=False)
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return node
        except OmegaConfBaseException as e:  # e.g. an interpolated value the schema refuses
            raise DpgridError(wrong_type(e) if getattr(e, "full_key", None) else str(e).splitlines()[0]) from None

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def refuse(self, key: str, valid: str, value) -> None:
        raise DpgridError(f"{self.prefix}{key} must be {valid}, got {value!r}")

    def whole(self, key: str, low: int = 1, high: int = None) -> int:
        """An integer key in [low, high]."""
        v = self.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high):
            self.refuse(key, f"a whole number >= {low}" if high is None else f"a whole number in {low}..{high}", v)
        return v

    def real(self, key: str, valid: str, ok) -> float:
        """A finite number key for which ok(v) holds; `valid` says which in words."""
        v = self.get(key)
        if not is_number(v) or not math.isfinite(v) or abs(v) > FLOAT32_MAX or not ok(v):
            self.refuse(key, valid, v)
        return float(v)

    def positive(self, key: str) -> float:
        return self.real(key, "a positive finite number", lambda v: v > 0)

    def fraction(self, key: str, closed_low: bool = False) -> float:
        """In (0, 1), or [0, 1) with closed_low."""
        if closed_low:
            return self.real(key, "in [0, 1)", lambda v: 0 <= v < 1)
        return self.real(key, "in (0, 1)", lambda v: 0 < v < 1)

    def choice(self, key: str, options, default: str = None) -> str:
        v = self.get(key)
        v = default if v is None else v
        if str(v) not in options or not isinstance(v, str):
            self.refuse(key, f"one of {', '.join(options)}", v)
        return v

    def flag(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            self.refuse(key, "true or false", v)
        return v

    def numbers(self, key: str, valid: str, ok, length: int = None) -> list:
        """A list of finite numbers within float32's range, each with ok(v); exactly `length` of them when given."""
        v = self.get(key)
        values = list(v) if OmegaConf.is_list(v) or isinstance(v, (list, tuple)) else None
        if (values is None or not values or (length and len(values) != length)
                or not all(is_number(x) and math.isfinite(x) and abs(x) <= FLOAT32_MAX and ok(x) for x in values)):
            self.refuse(key, f"a list of {f'{length} ' if length else ''}numbers {valid}", v)
        return [float(x) for x in values]

    def log_range(self, key: str) -> list:
        low, high = self.numbers(key, f"in [-{MAX_LOG10}, {MAX_LOG10}] (log10 bounds)", lambda x: abs(x) <= MAX_LOG10,
                                 length=2)
        if not low < high:
            raise DpgridError(f"{self.prefix}{key} must be [low, high] with low < high (log10 bounds), "
                              f"got [{low:g}, {high:g}]")
        return [low, high]


def wrong_type(error) -> str:
    """A value the schema (dpgrid/config/schema.py) refuses: the key, the value and the type it needs."""
    first = str(error).strip().splitlines()[0]
    needed = re.search(r"converted to (\w+)", first)
    kind = {"Integer": "a whole number", "Float": "a number", "Boolean": "true or false",
            "String": "a string"}.get(needed.group(1), needed.group(1)) if needed else None
    if "is not a valid bool" in first:
        kind = "true or false"
    value = re.search(r"Value '([^']*)'", first)
    got = f", got {value.group(1)!r}" if value else ""
    return f"{error.full_key} must be {kind}{got}" if kind else f"{error.full_key}: {first}"


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
