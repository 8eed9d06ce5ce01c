"""The protocol knobs the paper leaves open: each changes what it says and is recorded in the outputs."""

import json

import pandas as pd
import pytest
import torch

from dpgrid.data import load
from dpgrid.training.train import batches

from .command import dpgrid
from .test_data import idx_cfg, make_idx_root

SMALL = ["grid.k=2", "train.seeds=1", "train.epochs=2", "train.eval_every=5", "strategy=fixed_threshold"]


def test_shuffle_gives_fixed_size_batches_covering_each_pass():
    gen = torch.Generator().manual_seed(0)
    it = batches(10, 0.3, 3, "shuffle", gen)
    first_pass = [next(it) for _ in range(3)]
    assert all(len(b) == 3 for b in first_pass)
    assert len(set(torch.cat(first_pass).tolist())) == 9  # no repeats within a pass (one left over)
    poisson = [len(b) for b in (next(batches(1000, 0.1, 100, "poisson", gen)) for _ in range(20))]
    assert len(set(poisson)) > 1  # Poisson batch sizes vary around q N


def test_standardize_uses_the_published_constants(tmp_path):
    make_idx_root(tmp_path)
    unit = load(idx_cfg("mnist", "MNIST", "classification"), tmp_path)
    std = load(idx_cfg("mnist", "MNIST", "classification", normalize="standardize",
                       mean=0.1307, std=0.3081), tmp_path)
    torch.testing.assert_close(std.x_train, (unit.x_train - 0.1307) / 0.3081)
    make_idx_root(tmp_path, "FashionMNIST")
    ae = load(idx_cfg("fashion_mnist", "FashionMNIST", "reconstruction", normalize="standardize",
                   mean=0.286, std=0.353), tmp_path)
    assert ae.y_train.min() >= 0 and ae.y_train.max() <= 1 and ae.x_train.min() < 0  # targets stay in [0, 1]


@pytest.mark.slow
def test_knobs_are_recorded_and_change_the_runs(tmp_path):
    outs = {}
    for name, extra in [("base", ["protocol=literal"]), ("momentum", []), ("shuffle", ["train.sampling=shuffle"]),
                        ("delta", ["privacy.delta=1e-6"])]:
        out = tmp_path / name
        r = dpgrid("run", *SMALL, *extra, f"hydra.run.dir={out}")
        assert r.returncode == 0, r.stderr
        outs[name] = (pd.read_csv(out / "runs.csv"), json.loads((out / "plan.json").read_text()), r.stderr)
    base, momentum, shuffle, delta = (outs[n] for n in ("base", "momentum", "shuffle", "delta"))
    assert (base[0].momentum == 0).all() and (momentum[0].momentum == 0.9).all()  # protocol=paper, the default
    assert (base[0].protocol == "literal").all() and (momentum[0].protocol == "paper").all()
    assert not base[0].best_value.equals(momentum[0].best_value)
    # shuffled batches: the same noise, but no epsilon claimed anywhere
    assert (shuffle[0].sampling == "shuffle (not DP)").all() and shuffle[1]["sampling"] == "shuffle (not DP)"
    assert shuffle[0].epsilon_spent.isna().all() and shuffle[0].epsilon_grid.isna().all()
    assert shuffle[1]["epsilon_spent"] is None and shuffle[1]["noise_multiplier"] == base[1]["noise_multiplier"]
    assert "NOT covered by the Poisson analysis" in shuffle[2]
    assert (base[0].sampling == "poisson").all() and (base[0].normalize == "unit").all()
    assert (delta[0].delta == 1e-6).all() and delta[1]["noise_multiplier"] > base[1]["noise_multiplier"]
    assert base[1]["budget"] == "per_grid" and (base[0].accountant == "rdp").all()


@pytest.mark.slow
def test_standardize_is_refused_without_constants(tmp_path):
    r = dpgrid("run", *SMALL, "dataset.normalize=standardize", cwd=tmp_path)
    assert r.returncode == 2 and "needs the public constants" in r.stderr
