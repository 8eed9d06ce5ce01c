"""A model that is not in dpgrid (a GroupNorm CNN, examples/) replaces a dataset's default model."""

import json

import pandas as pd
import pytest

from .plugin import SEARCHPATH, dpgrid
from .test_data import make_idx_root

pytestmark = pytest.mark.slow  # every test here starts dpgrid processes


def test_groupnorm_cnn_trains_on_mnist_shaped_data(tmp_path):
    # 128 samples, batches of 8 and N stated: one calibration, at q = 1/16 (at q = 1/2 Opacus's RDP takes seconds)
    make_idx_root(tmp_path / "data", n_train=128, n_test=8)
    args = ["dataset=mnist", "model=groupnorm_cnn", "strategy=fixed_threshold", "grid.k=2",
            "train.epochs=1", "train.seeds=1", "train.batch_size=8", "dataset.n_train=128", f"data.root={tmp_path / 'data'}",
            SEARCHPATH]
    plan = json.loads(dpgrid("plan", "--json", *args).stdout)
    assert plan["model_parameters"] == 16 * 25 + 16 + 2 * 16 + 16 * 16 * 9 + 16 + 2 * 16 + 16 * 25 * 10 + 10
    r = dpgrid("run", *args, f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 0, r.stderr
    assert "falling back" not in r.stderr  # GroupNorm has a rule: the fast engine serves the model
    assert len(pd.read_csv(tmp_path / "grid" / "runs.csv")) == 4


def test_a_model_that_mixes_samples_is_refused_before_training(tmp_path):
    conf = tmp_path / "conf" / "model"
    conf.mkdir(parents=True)
    (conf / "bn.yaml").write_text("_target_: torch.nn.BatchNorm1d\nnum_features: 64\n")
    r = dpgrid("run", "model=bn", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", cwd=tmp_path)
    assert r.returncode == 2 and "mixes the samples of a batch" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]  # nothing written


CENTERED = '''
import torch
from torch import nn


class Centered(nn.Module):
    """h - h.mean(0) in training only, h - a fixed centre in eval: it passes any check made in eval mode."""

    def __init__(self, features=64, hidden=32, classes=10):
        super().__init__()
        self.fc, self.head = nn.Linear(features, hidden), nn.Linear(hidden, classes)
        self.register_buffer("centre", torch.zeros(hidden))

    def forward(self, x):
        h = self.fc(x)
        h = h - h.mean(0) if self.training else h - self.centre
        return self.head(torch.relu(h))
'''


@pytest.mark.parametrize("engine", ["auto", "fast", "func"])
def test_a_users_model_that_mixes_samples_in_training_only_is_refused_naming_it(tmp_path, engine):
    """A model plugin written as docs/extending.md shows, that centres its batch in training only: refused before
    anything is written, naming the model, whatever train.engine says."""
    package = tmp_path / "mine"
    (package / "conf" / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(CENTERED)
    (package / "conf" / "model" / "centered.yaml").write_text("_target_: mine.models.Centered\n")
    from .command import dpgrid as run_dpgrid

    r = run_dpgrid("run", "model=centered", f"train.engine={engine}", "strategy=fixed_threshold", "grid.k=2",
                   "train.seeds=1", "train.epochs=1", f"hydra.searchpath=[file://{package / 'conf'}]",
                   f"hydra.run.dir={tmp_path / 'grid'}", cwd=tmp_path, path=[tmp_path])
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if "changes the others' outputs in training" in line]
    assert len(lines) == 1 and "Centered 'the model' mixes them in its own forward" in lines[0], r.stderr
    assert not (tmp_path / "grid").exists()  # nothing written: the folder it made is removed
