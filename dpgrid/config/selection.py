"""privacy.selection: the accounting method a user chooses, an option of conf/privacy/selection (its `_target_`, an
AccountingMethod; its `name`; its own keys, typed by the class's Options), and its spelling from before it was a
config option (privacy.selection=NAME, privacy.stopping=...), which is still understood."""

import dataclasses
import difflib

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpgrid import DpgridError
from dpgrid.plugins import wrong_type


def selection_of(node) -> tuple:
    """(the class of the grid's privacy.selection, its node as plain values with its keys typed by the class's
    Options): DpgridError for a node that is no option of conf/privacy/selection, a misspelt key or a wrong type."""
    from dpgrid.plugins import check_hooks, resolve
    from dpgrid.privacy.method import AccountingMethod

    if not OmegaConf.is_dict(node) or "name" not in node:
        raise DpgridError(f"privacy.selection must be an option of conf/privacy/selection (privacy.selection=NAME: "
                          f"composition, random_stopping, subsample_tuning or a config of your own), got {node!r}")
    where = f"privacy.selection={node.name}"
    cls = resolve(node, where, kind="class")
    if not (isinstance(cls, type) and issubclass(cls, AccountingMethod)):
        raise DpgridError(f"{where}: _target_ {node._target_} is not a subclass of dpgrid.privacy.AccountingMethod")
    check_hooks(cls, AccountingMethod, where)
    if str(node.name) != cls.name:  # the name plan.json and the hashes record: its class's
        raise DpgridError(f"privacy.selection.name={node.name} is not the name of its _target_ {node._target_} "
                          f"({cls.name}); choose another selection with privacy.selection={node.name}")
    given = OmegaConf.to_container(node, resolve=True)
    head = {"_target_": given.pop("_target_"), "name": given.pop("name")}
    known = [f.name for f in dataclasses.fields(cls.Options)]
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean privacy.selection.{close[0]}?" if close else \
                f"its keys: {', '.join(known) or 'none'}"
            raise DpgridError(f"privacy.selection.{key} is not a key of privacy.selection={head['name']}; {hint}")
    try:
        typed = OmegaConf.merge(OmegaConf.structured(cls.Options), given)
    except OmegaConfBaseException as e:
        e.full_key = f"privacy.selection.{getattr(e, 'full_key', '') or ''}".rstrip(".")
        raise DpgridError(wrong_type(e)) from None
    return cls, {**head, **OmegaConf.to_container(typed)}


def selection_overrides(overrides) -> list:
    """The overrides with the selection written as before it was a config option: privacy.selection=NAME chooses
    the option (privacy/selection=NAME), privacy.KEY=... of a selection's key sets privacy.selection.KEY."""
    rewritten = []
    for text in overrides:
        key, equals, value = text.partition("=")
        if equals and key == "privacy.selection":
            if value.strip().startswith(("[", "{")):
                raise DpgridError(f"privacy.selection takes one name (composition, random_stopping, subsample_tuning "
                                  f"or a config of your own), got {value}; a sweep lists several: -m "
                                  "privacy.selection=composition,random_stopping")
            text = f"privacy/selection={value}"
        elif equals and key.startswith("privacy.") and key.count(".") == 1 and key[8:] in selection_keys():
            text = f"privacy.selection.{key[8:]}={value}"
        rewritten.append(text)
    return rewritten


def selection_keys() -> set:
    """The keys of the built-in selections' options (privacy.selection.KEY)."""
    return set(key_owners())


def selection_owners(key: str) -> list:
    """The built-in selections whose options have `key`."""
    return key_owners().get(key, [])


def key_owners() -> dict:
    """{a key of a built-in selection's options: the selections that have it}."""
    from dpgrid.privacy import ACCOUNTING

    owners = {}
    for method in ACCOUNTING.values():
        for field in dataclasses.fields(method.Options):
            owners.setdefault(field.name, []).append(method.name)
    return owners
