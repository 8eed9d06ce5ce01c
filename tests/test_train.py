"""One run's loop: what it releases, and when it calls a run diverged."""

import math

import torch
from torch import nn

from dpgrid.data import Data
from dpgrid.training.persample import make_engine
from dpgrid.strategies.fixed_threshold import FixedThreshold
from dpgrid.training.train import train_runs
from dpgrid.strategies.base import Noise

from .conftest import load_cfg


def small_data(n_train=64, n_test=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_test, 5, generator=g)
    y = (x[:, 0] > 0).long()
    return Data(x[:n_train], y[:n_train], x[n_train:], y[n_train:], "classification")


def run(data, noise=0.5, lr=0.1, steps=6, engine=make_engine):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 2))
    strategy = FixedThreshold(model.parameters(), hp={"lr": lr, "clip": 1.0}, noise=Noise(noise),
                              batch_size=16, options={}, generator=torch.Generator().manual_seed(1))
    (result,) = train_runs([model], engine(model, "classification"), strategy, data, steps, 0.25, 3,
                           [torch.Generator().manual_seed(2)], progress=False)
    return model, result


def test_curves_record_the_public_test_loss_not_the_private_training_loss():
    data = small_data()
    model, result = run(data)
    assert [c["step"] for c in result.curve] == [3, 6] and "train_loss" not in result.curve[0]
    expected = nn.functional.cross_entropy(model(data.x_test), data.y_test).item()
    assert math.isclose(result.curve[-1]["test_loss"], expected, rel_tol=1e-6)


def test_divergence_is_decided_from_released_quantities_only():
    """A batch's gradient information holds norms and sums for a strategy to clip and noise, and no un-noised
    statistic of the private batch (a training loss) the training loop could read; parameters that overflow, a
    function of the released noisy updates, are divergence."""
    data = small_data()
    model = nn.Sequential(nn.Linear(5, 2))
    grads = make_engine(model, "classification").gradients(data, [torch.arange(8)])
    public = {name for name in vars(grads) if not name.startswith("_")}
    assert public <= {"size", "device", "mask"}, public  # its numbers are reached only through norms and sums
    _, result = run(data)
    assert not result.diverged and math.isfinite(result.best_value)
    _, blown = run(data, lr=1e39)  # beyond float32: the released parameters overflow
    assert blown.diverged and math.isnan(blown.best_value)


def test_float64_is_hashed_only_when_set():
    """Grids recorded before train.float64 existed keep their config hash; a float64 grid is another config."""
    from dpgrid.config import settings_of
    from dpgrid.config.identity import config_hash

    plain, double = settings_of(load_cfg()), settings_of(load_cfg(**{"train.float64": "true"}))
    unset = settings_of(load_cfg())  # a config from before the key existed
    del unset["train"]["float64"]
    assert config_hash(plain) == config_hash(unset) != config_hash(double)
