"""A model's private statistics (a data normalisation's mean and variance) are released once per grid: a secure grid
records its one estimate (statistics.json, in its ledger) and every start of it trains with that one; statistics
that would be estimated through layers that train are refused. (From an adversarial review of issue 76.)"""

import json

import pytest
import torch
from safetensors.torch import load_file

import dpgrid
from dpgrid import DpgridError

from .conftest import OmegaConf, load_cfg
from .test_data import make_idx_root


def tiny_cfg(root, **overrides):
    """A grid of four runs of two steps on 48 generated MNIST images, ScatterNet + linear with the data normalisation."""
    return load_cfg("mnist", "fixed_threshold", **{"model": "scatternet_linear", "model.norm": "data",
                                                   "dataset.n_train": "null", "data.root": str(root), "grid.k": 2,
                                                   "train.seeds": 1, "train.steps": 2, "train.eval_every": 2,
                                                   "train.batch_size": 16, "train.save_models": "all", **overrides})


@pytest.mark.slow  # three commands of a secure grid on 48 generated images (seconds)
def test_a_secure_grid_trains_every_run_with_the_one_estimate_its_ledger_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    root = tmp_path / "data"
    make_idx_root(root, n_train=48, n_test=16)
    out = tmp_path / "grid"
    for only in ("[lr0_clip0,lr0_clip1]", "[lr1_clip0,lr1_clip1]"):  # two jobs of one grid: two starts
        dpgrid.run_grid(tiny_cfg(root, **{"privacy.secure_rng": True, "grid.only": only}), out, progress=False)
    recorded = json.loads((out / "statistics.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert "statistics.json" in ledger["files"]
    started = {p.stem: load_file(p)["1.mean"] for p in (out / "weights").glob("*.safetensors")}
    assert len(started) == 4  # each run's weights hold the statistics it trained with, the recorded estimate's
    assert all(torch.allclose(mean.double(), torch.tensor(recorded["1.mean"], dtype=torch.float64)) for mean in started.values())
    released = dpgrid.load_model(out)  # as a user reads the release
    assert torch.allclose(released.state_dict()["1.mean"].double(), torch.tensor(recorded["1.mean"], dtype=torch.float64))
    # secure: another grid's estimate is another draw (the operating system's noise, not the grid's names)
    other = tmp_path / "other"
    dpgrid.run_grid(tiny_cfg(root, **{"privacy.secure_rng": True, "grid.only": "[lr0_clip0]"}), other, progress=False)
    assert not torch.allclose(torch.tensor(json.loads((other / "statistics.json").read_text())["1.mean"]),
                              torch.tensor(recorded["1.mean"]))
    # the estimate gone, the grid is refused in one line: another estimate would be a second release
    (out / "statistics.json").unlink()
    with pytest.raises(DpgridError, match="statistics.json is missing but this secure grid drew it") as refused:
        dpgrid.run_grid(tiny_cfg(root, **{"privacy.secure_rng": True}), out, progress=False)
    assert "\n" not in str(refused.value)


@pytest.mark.slow  # a seeded grid's two jobs (seconds)
def test_a_seeded_grid_writes_no_statistics_file_and_draws_the_same_estimate_at_every_start(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    root = tmp_path / "data"
    make_idx_root(root, n_train=48, n_test=16)
    out = tmp_path / "grid"
    for only in ("[lr0_clip0,lr0_clip1]", "[lr1_clip0,lr1_clip1]"):
        dpgrid.run_grid(tiny_cfg(root, **{"grid.only": only}), out, progress=False)
    started = [load_file(p)["1.mean"] for p in (out / "weights").glob("*.safetensors")]
    assert len(started) == 4 and all(torch.equal(mean, started[0]) for mean in started)
    assert not (out / "statistics.json").exists()


def conv_then_normalised(classes: int = 10):
    """A user's model with dpgrid's data normalisation after a convolution: its statistics would be of the
    convolution's outputs, which change as the runs train."""
    from torch import nn

    from dpgrid.models.scatternet import DataNormalization

    return nn.Sequential(nn.Conv2d(1, 4, 3), DataNormalization(4, 8.0, (1.0, 1.0)), nn.Flatten(),
                         nn.Linear(4 * 26 * 26, classes))


def test_statistics_after_a_layer_that_trains_are_refused_in_one_line(tmp_path):
    root = tmp_path / "data"
    make_idx_root(root, n_train=48, n_test=16)
    cfg = load_cfg("mnist", "fixed_threshold", **{"dataset.n_train": "null", "data.root": str(root), "grid.k": 2,
                                                  "train.seeds": 1, "train.steps": 2, "train.batch_size": 16})
    cfg.model = OmegaConf.create({"_target_": f"{__name__}.conv_then_normalised"})
    with pytest.raises(DpgridError, match=r"DataNormalization \(layer 1\) .* follows a layer with parameters \(0.weight\)") \
            as refused:
        dpgrid.run_grid(cfg, tmp_path / "grid", progress=False)
    assert "\n" not in str(refused.value) and not (tmp_path / "grid").exists()
