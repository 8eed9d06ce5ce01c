"""Modules that moved into packages (dpgrid.MOVED_MODULES): last release's imports and configs keep working, each
with one line naming the new path, and a grid recorded under the old paths keeps its hash."""

import importlib
import sys
import warnings

import pytest

from dpgrid import MOVED_MODULES

from .conftest import load_cfg


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_imports_the_moved_module_and_names_where_it_went(old):
    sys.modules.pop(old, None)  # as in a fresh interpreter: an old path imported before says nothing again
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED_MODULES[old])
    assert [str(w.message) for w in said] == [f"{old} moved to {MOVED_MODULES[old]}: import it from there"]
    assert said[0].category is FutureWarning  # shown to a user by default, unlike a DeprecationWarning


def test_a_path_that_never_existed_is_still_not_found():
    with pytest.raises(ModuleNotFoundError):
        __import__("dpgrid.no_such_module")


@pytest.mark.parametrize("dataset,key,old", [("digits", "dataset.load._target_", "dpgrid.datasets.load_digits"),
                                             ("iris", "dataset.load._target_", "dpgrid.binary.load_iris"),
                                             ("ag_news_tokens", "model._target_", "dpgrid.transformers.transformer")])
def test_a_config_naming_an_old_path_is_the_same_grid(dataset, key, old):
    """A user's config (or a grid's recorded config.yaml) that names last release's path compiles to the grid the
    built-in config compiles to, hash included: the recorded grid resumes."""
    from omegaconf import OmegaConf

    from dpgrid.config import compile

    strategy = "pur" if dataset == "iris" else "online"
    new = compile(load_cfg(dataset, strategy), plan=False)
    cfg = load_cfg(dataset, strategy)
    OmegaConf.update(cfg, key, old)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old path's one line, shown where it is first imported
        before = compile(cfg, plan=False)
    assert before.config_hash == new.config_hash
    assert OmegaConf.select(cfg, key) == old and OmegaConf.select(load_cfg(dataset, strategy), key) != old
