"""`_target_` nodes: what a config names, resolved and called. Built-in strategies, models and dataset
loaders go through here exactly like a user's (their own package, their own config folder on Hydra's
search path). Failures are one line naming the config option and the target."""

import logging
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from hydra.utils import get_class, get_method
from omegaconf import DictConfig, OmegaConf

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
