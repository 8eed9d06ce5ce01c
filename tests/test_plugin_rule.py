"""A layer type of a user's own (examples/dpgrid_example/layer_scale.py) registers its rule from outside dpgrid: the
rule is exact, and a grid of a model with it trains on the fast engine, with no fallback."""

import pandas as pd
import pytest
import torch

from .plugin import EXAMPLES, SEARCHPATH, dpgrid


@pytest.fixture
def layer_scale(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from dpgrid_example import layer_scale  # registers LayerScale's rule (for a type no other test uses)

    return layer_scale


def test_the_users_rule_is_exact(layer_scale):
    from dpgrid.testing import check_rule

    assert check_rule(layer_scale.LayerScale(4), torch.randn(6, 5, 4)) > 0
    assert check_rule(layer_scale.LayerScale(4), torch.randn(6, 4)) > 0


def test_its_model_trains_on_the_fast_engine(layer_scale):
    from dpgrid.training.persample import FastEngine, make_engine

    assert isinstance(make_engine(layer_scale.layer_scale_mlp(), "classification"), FastEngine)


@pytest.mark.slow
def test_a_grid_of_it_runs_without_falling_back(tmp_path):
    r = dpgrid("run", "model=layer_scale_mlp", "strategy=fixed_threshold", "grid.k=2", "train.seeds=1",
               "train.epochs=1", SEARCHPATH, f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 0, r.stderr
    assert "falling back" not in r.stderr and len(pd.read_csv(tmp_path / "grid" / "runs.csv")) == 4  # k^2 x 1 seed
