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
