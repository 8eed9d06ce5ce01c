"""Tramèr & Boneh's ScatterNet models: the scattering transform against kymatio's, the models, the data normalisation's
private statistics and their accounting, the features' cache (resume, invalidation) and a tiny grid of each model."""

import json
import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import dpgrid
from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.data import Data
from dpgrid.data import features as cache
from dpgrid.models.scattering import Scattering2d
from dpgrid.models.scatternet import DataNormalization, scatternet_cnn, scatternet_linear, tanh_cnn

from .conftest import fast_layer_runs, load_cfg
from .test_data import make_idx_root


def images(n=6, shape=(1, 28, 28), seed=0):
    """Digit-like test images: random strokes on a dark background, and one smooth blob, in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, *shape, generator=g) > 0.8).float() * torch.rand(n, *shape, generator=g)
    u = torch.linspace(-1, 1, shape[-1])
    x[0] = torch.exp(-4 * (u[None, :, None] ** 2 + u[None, None, :] ** 2)).expand(shape)
    return x


GOLDEN = Path(__file__).resolve().parent / "golden" / "scattering" / "kymatio_mnist.npz"


def test_the_transform_equals_kymatios_recorded_output():
    """kymatio 0.3.0's Scattering2D(J=2, shape=(28, 28), L=8) of three images, recorded by
    tests/golden/scattering/record.py (the slow test below checks the record against kymatio where it is installed)."""
    recorded = np.load(GOLDEN)
    theirs = torch.from_numpy(recorded["scattering"])  # (3, 1, 81, 7, 7)
    ours = Scattering2d(2, 8, (28, 28))(torch.from_numpy(recorded["images"]))
    torch.testing.assert_close(ours, theirs.reshape(ours.shape), atol=2e-6 * float(theirs.abs().max()), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("J, L, shape, channels", [(2, 8, (28, 28), 1), (2, 8, (32, 32), 3), (3, 6, (32, 32), 1)])
def test_the_transform_equals_kymatios(J, L, shape, channels):
    frontend = pytest.importorskip("kymatio.scattering2d.frontend.torch_frontend")
    x = images(5, (channels, *shape))
    theirs = frontend.ScatteringTorch2D(J=J, shape=shape, L=L)(x)  # (n, C, K, h, w)
    ours = Scattering2d(J, L, shape)(x)  # (n, C K, h, w): channel c's K coefficients together, as the authors view it
    assert ours.shape == (5, channels * theirs.shape[2], *theirs.shape[-2:])
    torch.testing.assert_close(ours, theirs.reshape(ours.shape), atol=2e-6 * float(theirs.abs().max()), rtol=1e-5)
    if (J, L, shape) == (2, 8, (28, 28)):  # the recorded reference is still kymatio's
        recorded = np.load(GOLDEN)
        live = frontend.ScatteringTorch2D(J=2, shape=(28, 28), L=8)(torch.from_numpy(recorded["images"]))
        torch.testing.assert_close(live, torch.from_numpy(recorded["scattering"]), atol=1e-6, rtol=1e-5)


def test_the_transform_keeps_samples_apart_and_passes_its_own_features_through():
    stage = Scattering2d(2, 8, (28, 28))
    x = images(6)
    S = stage(x)
    assert S.shape == (6, 81, 7, 7) and stage.channels == 81 and Scattering2d(3, 8, (32, 32)).channels == 1 + 24 + 192
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    torch.testing.assert_close(stage(x[order]), S[order])  # no sample reads another's
    torch.testing.assert_close(stage(x[:1]), S[:1], atol=1e-6, rtol=1e-5)
    assert stage(S) is S  # precomputed features pass unchanged: the released model takes either
    assert float((stage(x.double()) - S.double()).abs().max()) < 1e-5 * float(S.abs().max())
    with pytest.raises(ValueError, match="expected, got shape"):
        stage(torch.rand(2, 1, 32, 32))


def test_the_models_have_the_papers_sizes_and_take_images_or_features():
    from dpgrid.models import count_parameters

    x = images(4)
    for build, size in ((scatternet_linear, 39_700), (scatternet_cnn, 33_066)):
        model = build()
        assert count_parameters(model) == size
        torch.testing.assert_close(model(x), model(model[0](x)))
    assert count_parameters(tanh_cnn()) == 26_010 and tanh_cnn()(x).shape == (4, 10)
    colour = images(2, (3, 32, 32))
    for build in (scatternet_linear, scatternet_cnn, tanh_cnn):
        assert build(image=[3, 32, 32])(colour).shape == (2, 10)
    assert scatternet_linear(image=[3, 32, 32])[3].in_features == 243 * 8 * 8
    with pytest.raises(DpgridError, match="model.groups"):
        scatternet_linear(groups=10)
    with pytest.raises(DpgridError, match="model.norm must"):
        scatternet_cnn(norm="batch")
    with pytest.raises(DpgridError, match="model.norm_clip"):
        scatternet_linear(norm="data", norm_clip=[1.0])


class Batches(list):
    @property
    def n(self):
        return sum(len(b) for b in self)


def test_the_data_normalisation_is_the_gaussian_mechanism_of_clipped_moments():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, 3, 2, 2, generator=g, dtype=torch.float64)
    train, test = Batches([x[:25], x[25:]]), Batches([x[:10]])
    layer = DataNormalization(3, noise_multiplier=2.0, clip=(100.0, 100.0))
    exact = layer.estimate(train, test, lambda shape: torch.zeros(shape, dtype=torch.float64))
    flat = x.flatten(2)
    torch.testing.assert_close(exact["mean"], flat.mean((0, 2)).float())
    torch.testing.assert_close(exact["var"], (flat.pow(2).mean((0, 2)) - flat.mean((0, 2)) ** 2).float())
    # the noise is nu C / N on the mean, and a sample far out moves it by at most C / N
    shifted = layer.estimate(train, test, lambda shape: torch.ones(shape, dtype=torch.float64))
    torch.testing.assert_close(shifted["mean"] - exact["mean"], torch.full((3,), 2.0 * 100 / 40))
    tight = DataNormalization(3, 2.0, clip=(0.1, 0.1))
    far = x.clone()
    far[0] = 1e6
    moved = tight.estimate(Batches([far]), test, lambda s: torch.zeros(s, dtype=torch.float64))["mean"]
    kept = tight.estimate(Batches([x]), test, lambda s: torch.zeros(s, dtype=torch.float64))["mean"]
    assert float((moved - kept).norm()) <= 2 * 0.1 / 40 + 1e-6
    assert layer.events() == [(1.0, 2.0, 2)]
    # standardised with them, a zero variance maps to 0
    layer.load_state_dict({"mean": torch.tensor([0.5, 0.5, 0.5]), "var": torch.tensor([0.25, 0.0, 1.0])})
    out = layer(torch.ones(1, 3, 2, 2))
    assert out[0, 1].abs().max() == 0 and float(out[0, 0, 0, 0]) == pytest.approx(0.5 / math.sqrt(0.25 + 1e-5))


def planned(strategy="fixed_threshold", **overrides):
    cfg = load_cfg("mnist", strategy, **{"model": "scatternet_linear", "grid.k": 3, **overrides})
    return compile(cfg).plan


def privacy_plan(statistics=(), selection="composition", seeds=5):
    """A plan of 4 configurations of T = 118 steps (N = 60,000, B = 512, one epoch) at (3, 1e-5)."""
    from dpgrid.privacy import make_plan
    from dpgrid.strategies import FixedThreshold

    privacy = {"epsilon": 3, "delta": 1e-5, "account_seeds": False, "budget": "per_grid", "accountant": "rdp",
               "selection": selection, "stopping": "truncated_negative_binomial", "stopping_eta": 0.0,
               "stopping_mean": None, "selection_accountant": "rdp"}
    configs = [{"config_id": f"lr{i}", "lr": 0.1 * (i + 1)} for i in range(4)]
    return make_plan(strategy_cls=FixedThreshold, options={}, privacy=privacy, problem={}, n_train=60000,
                     batch_size=512, epochs=1, seeds=seeds, sampling="poisson", statistics=statistics, dataset="mnist",
                     strategy="fixed_threshold", k=4, label="DP-SGD", axes=["lr"], dataset_epsilons=[3],
                     model_parameters=0, configurations=configs)


def test_the_statistics_compose_into_every_epsilon_the_grid_states():
    from dp_accounting import dp_event, rdp

    from dpgrid.privacy import ACCOUNTING

    plain, normed = privacy_plan(), privacy_plan([(1.0, 8.0, 2)])
    assert plain.statistics == [] and "statistics" not in plain.to_dict()  # every other plan.json as it was
    assert normed.statistics == [[1.0, 8.0, 2]] and normed.to_dict()["statistics"] == [[1.0, 8.0, 2]]
    assert normed.noise_multiplier > plain.noise_multiplier  # the statistics took part of the budget

    def spent(runs):  # an accountant dpgrid did not write: dp-accounting's RDP, the statistics and the runs' steps
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_event.GaussianDpEvent(8.0), 2)
        accountant.compose(dp_event.PoissonSampledDpEvent(normed.sample_rate,
                                                          dp_event.GaussianDpEvent(normed.noise_multiplier)),
                           runs * normed.steps)
        return accountant.get_epsilon(normed.delta)

    assert normed.epsilon_spent <= 3 and spent(4) == pytest.approx(normed.epsilon_spent, rel=2e-3)
    assert spent(20) == pytest.approx(normed.epsilon_with_seeds, rel=2e-3)
    assert ACCOUNTING["composition"].released_steps(normed) == [[1.0, 8.0, 2], [normed.sample_rate,
                                                                                normed.noise_multiplier, 20 * 118]]


def test_random_stopping_composes_the_statistics_into_its_selections_epsilon():
    selected, alone = privacy_plan([(1.0, 8.0, 2)], "random_stopping"), privacy_plan(selection="random_stopping")
    assert selected.epsilon_spent <= 3 and selected.noise_multiplier > alone.noise_multiplier
    from dpgrid.privacy.random_stopping import selection_epsilon

    without = selection_epsilon(selected.sample_rate, selected.noise_multiplier, 5 * 118, 1e-5, selected.record.stopping)
    assert without < selected.epsilon_spent - 0.05  # the statistics' share is in the selection's epsilon


@pytest.mark.slow
def test_a_model_with_a_data_normalisation_plans_its_statistics():
    plain, normed = planned(), planned(**{"model.norm": "data", "model.norm_noise": 6})
    assert plain.statistics == [] and normed.statistics == [[1.0, 6.0, 2]]
    assert normed.noise_multiplier > plain.noise_multiplier and normed.epsilon_spent <= 3


REFUSED = [({"privacy/selection": "subsample_tuning"}, "subsample_tuning does not account"),
           ({"strategy": "nodp", "grid.k": 2}, "is not private"),
           ({"privacy/selection": "random_stopping", "privacy.selection.stopping": "liu_talwar"}, "liu_talwar"),
           ({"privacy/selection": "random_stopping", "privacy.selection.selection_accountant": "profile",
             "privacy.accountant": "pld"}, "selection_accountant=rdp")]


@pytest.mark.parametrize("overrides, refused", fast_layer_runs(REFUSED, REFUSED[1]))
def test_a_method_that_does_not_compose_the_statistics_is_refused(overrides, refused):
    with pytest.raises(DpgridError, match=refused):
        planned(**{"model.norm": "data", **overrides})


# ---- the features' cache -------------------------------------------------------------------------------------------

class Failing(Scattering2d):
    """The stage, killed after `calls` chunks."""
    calls = 2

    def forward(self, x):
        if Failing.calls == 0:
            raise KeyboardInterrupt
        Failing.calls -= 1
        return super().forward(x)


def tiny(n_train=40, n_test=12, seed=0):
    x = images(n_train + n_test, seed=seed)
    y = torch.arange(n_train + n_test) % 10
    return Data(x[:n_train], y[:n_train], x[n_train:], y[n_train:], "classification")


def entries(folder):
    return sorted(p for p in folder.iterdir() if p.is_dir())


def test_the_cache_resumes_where_a_killed_computation_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    monkeypatch.setattr(cache, "CHUNK", 8)
    data = tiny()
    expected = Scattering2d(2, 8, (28, 28))(data.x_train)
    Failing.calls = 3  # the shape's probe, then two chunks
    with pytest.raises(KeyboardInterrupt):
        cache.with_features(Failing(2, 8, (28, 28)), data, "tiny")
    (entry,) = entries(tmp_path / "features")
    assert (entry / "train.rows").read_text() == "16" and (entry / "meta.json").exists() and not cache.finished(entry)
    assert oct((entry / "train.npy.part").stat().st_mode)[-3:] == "600" and oct(entry.stat().st_mode)[-3:] == "700"
    Failing.calls = 10 ** 6
    computed, original = [], cache.transform

    def recording(stage, x, write, progress, what, start=0):
        computed.append((what, start))
        return original(stage, x, write, progress, what, start)

    monkeypatch.setattr(cache, "transform", recording)
    features, said = cache.with_features(Failing(2, 8, (28, 28)), data, "tiny")
    assert computed == [("tiny train", 16), ("tiny test", 0)]  # the 16 rows written before the kill are not redone
    torch.testing.assert_close(features.x_train, expected)
    assert said.startswith("features: tiny's scattering2d computed") and (entry / "meta.json").exists()
    computed.clear()
    again, said = cache.with_features(Scattering2d(2, 8, (28, 28)), data, "tiny")
    assert computed == [] and said == "" and torch.equal(again.x_test, features.x_test)



def test_a_changed_data_file_is_computed_afresh_and_its_old_features_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    stage, data = Scattering2d(2, 8, (28, 28)), tiny()
    first, _ = cache.with_features(stage, data, "tiny")
    (old,) = entries(tmp_path / "features")
    changed = Data(data.x_train.clone(), data.y_train, data.x_test, data.y_test, data.task)
    changed.x_train[7, 0, 3, 3] += 0.5  # one pixel of one training image
    second, said = cache.with_features(stage, changed, "tiny")
    (new,) = entries(tmp_path / "features")
    assert new != old and said and not torch.equal(first.x_train[7], second.x_train[7])
    torch.testing.assert_close(second.x_train[8:], first.x_train[8:])
    Failing.calls = 2  # a third data file, its computation killed after one chunk: a partial entry, labelled
    monkeypatch.setattr(cache, "CHUNK", 8)
    third = Data(data.x_train.clone() + 0.25, data.y_train, data.x_test, data.y_test, data.task)
    with pytest.raises(KeyboardInterrupt):
        cache.with_features(Failing(2, 8, (28, 28)), third, "tiny")
    (partial,) = set(entries(tmp_path / "features")) - {new}
    assert (partial / "train.npy.part").exists() and not cache.finished(partial)
    cache.with_features(stage, data, "tiny")  # the first file again: both entries of other data are dropped
    assert entries(tmp_path / "features") == [old]
    cache.with_features(stage, changed, "tiny")
    assert entries(tmp_path / "features") == [new]
    other, _ = cache.with_features(Scattering2d(2, 6, (28, 28)), data, "tiny")  # another setting: another entry
    assert other.x_train.shape[1] == 1 + 12 + 36 and len(entries(tmp_path / "features")) == 2
    monkeypatch.setenv("DPGRID_FEATURES", "off")
    kept = len(entries(tmp_path / "features"))
    off, said = cache.with_features(stage, data, "tiny")
    assert "not kept" in said and len(entries(tmp_path / "features")) == kept
    torch.testing.assert_close(off.x_train, first.x_train)


def test_an_entry_being_opened_is_not_dropped_between_its_two_maps(tmp_path, monkeypatch):
    """Another data file's computation drops the old entry, but not while a process opens its maps: drop_stale is
    called, as another process would, between the opening of train.npy and test.npy."""
    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    stage, data = Scattering2d(2, 8, (28, 28)), tiny()
    first, _ = cache.with_features(stage, data, "tiny")
    (entry,) = entries(tmp_path / "features")
    original, dropped = np.load, []

    def load_then_drop(path, *args, **kwargs):
        array = original(path, *args, **kwargs)
        if Path(path).name == "train.npy" and not dropped:
            dropped.append(True)
            cache.drop_stale(tmp_path / "features", tmp_path / "features" / "another", "tiny", stage.identity())
        return array

    monkeypatch.setattr(cache.np, "load", load_then_drop)
    again, said = cache.with_features(stage, data, "tiny")
    assert dropped and said == "" and (entry / "meta.json").exists()
    torch.testing.assert_close(again.x_test, first.x_test)
    monkeypatch.setattr(cache.np, "load", original)
    cache.drop_stale(tmp_path / "features", tmp_path / "features" / "another", "tiny", stage.identity())
    assert entries(tmp_path / "features") == []  # held by nobody, it is dropped, moved away first and then removed


def test_an_entry_dropped_or_half_removed_is_computed_again(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    stage, data = Scattering2d(2, 8, (28, 28)), tiny()
    first, _ = cache.with_features(stage, data, "tiny")
    (entry,) = entries(tmp_path / "features")
    real_flock, moved_while_waiting = fcntl.flock, []

    def dropped_while_waiting(handle, operation):  # another process drops the entry while this one waits for it
        if operation == fcntl.LOCK_EX and not moved_while_waiting:
            moved_while_waiting.append(entry.rename(tmp_path / "features" / ".dropped-by-another"))
        return real_flock(handle, operation)

    monkeypatch.setattr(fcntl, "flock", dropped_while_waiting)
    with cache.locked(entry):  # the lock it waited on is the moved entry's: it takes the key's, made again
        assert moved_while_waiting and (entry / ".lock").exists() and not cache.finished(entry)
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert cache.read_back(entry) is None
    again, said = cache.with_features(stage, data, "tiny")
    assert said.startswith("features: tiny's scattering2d computed")
    torch.testing.assert_close(again.x_train, first.x_train)
    (entry / "train.npy").unlink()  # meta.json without its arrays (a removal killed half-way)
    assert cache.read_back(entry) is None
    third, said = cache.with_features(stage, data, "tiny")
    assert said.startswith("features: tiny's scattering2d computed") and cache.finished(entry)
    torch.testing.assert_close(third.x_train, first.x_train)
    moved = tmp_path / "features" / ".dropped-x-1"
    moved.mkdir()
    (moved / "train.npy").write_bytes(b"0")  # a moved entry whose removal a kill interrupted
    cache.drop_stale(tmp_path / "features", entry, "tiny", stage.identity())
    assert not moved.exists() and cache.finished(entry)


@pytest.mark.slow
def test_the_cache_survives_kill_9(tmp_path):
    """A real process killed with SIGKILL while writing the features: the next one resumes and gets the same array."""
    root = tmp_path / "data"
    make_idx_root(root, n_train=3000, n_test=10)
    env = {**os.environ, "DPGRID_FEATURES": str(tmp_path / "features"), "OMP_NUM_THREADS": "1"}
    script = ("import sys; from dpgrid.data.datasets import load_idx; from dpgrid.data.features import with_features; "
              "from dpgrid.models.scattering import Scattering2d; "
              "d = load_idx(sys.argv[1], 'MNIST'); with_features(Scattering2d(2, 8, (28, 28)), d, 'mnist')")
    proc = subprocess.Popen([sys.executable, "-c", script, str(root)], env=env)
    deadline = time.time() + 300
    while time.time() < deadline and not list((tmp_path / "features").glob("*/train.rows")):
        time.sleep(0.05)
    rows = list((tmp_path / "features").glob("*/train.rows"))
    assert rows, "the computation never recorded a chunk"
    proc.kill()
    proc.wait()
    written = int(rows[0].read_text())
    assert 0 < written < 3000 and not list((tmp_path / "features").glob("*/train.npy"))
    assert list((tmp_path / "features").glob("*/meta.json"))  # labelled before computing
    subprocess.run([sys.executable, "-c", script, str(root)], env=env, check=True)
    from dpgrid.data.datasets import load_idx

    data = load_idx(root, "MNIST")
    (entry,) = entries(tmp_path / "features")
    kept = torch.from_numpy(np.load(entry / "train.npy"))
    torch.testing.assert_close(kept, Scattering2d(2, 8, (28, 28))(data.x_train), atol=1e-6, rtol=1e-5)


# ---- a tiny grid of each model, on generated MNIST files ---------------------------------------------------------

MODELS = [("scatternet_linear", {"model.norm": "data"}), ("scatternet_linear", {}), ("scatternet_cnn", {}),
          ("scatternet_cnn", {"model.norm": "data"}), ("tanh_cnn", {})]


@pytest.mark.slow  # a grid of four runs each (about 10 s)
@pytest.mark.parametrize("model, extra", MODELS,
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={w}" for k, w in v.items()) or "-")
def test_a_tiny_grid_trains_on_the_fast_engine_and_releases_a_model_of_images(tmp_path, monkeypatch, model, extra):
    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    root = tmp_path / "data"
    make_idx_root(root, n_train=48, n_test=16)
    cfg = load_cfg("mnist", "fixed_threshold", **{"model": model, "dataset.n_train": "null", "data.root": str(root),
                                                  "grid.k": 2, "train.seeds": 1, "train.steps": 2, "train.eval_every": 2,
                                                  "train.batch_size": 16, **extra})
    result = dpgrid.run_grid(cfg, tmp_path / "grid", progress=False)
    runs = result.runs
    assert len(runs) == 4 and set(runs.engine) == {"fast"} and (runs.engine_proof < 1e-6).all()
    record = json.loads((tmp_path / "grid" / "model" / "model.json").read_text())
    normed = extra.get("model.norm") == "data"
    assert record["plan"].get("statistics") == ([[1.0, 8.0, 2]] if normed else None)
    assert record["covered_by"]["epsilon"] == result.plan["epsilon_with_seeds"]
    assert ("Scattering2d(J=2, L=8, shape=(28, 28))" in record["architecture"]["module"]) == (model != "tanh_cnn")
    released = dpgrid.load_model(tmp_path / "grid")
    assert ("1.mean" in released.state_dict()) == normed
    from dpgrid.data.datasets import load_idx

    raw = load_idx(root, "MNIST")
    assert released(raw.x_test).shape == (16, 10)  # the release takes images: its stage is in it
    if model != "tanh_cnn":
        assert len(entries(tmp_path / "features")) == 1  # computed once for the grid's four runs


def test_cifar10_loads_from_the_python_batches(tmp_path):
    from dpgrid.data.datasets import load_cifar10

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}", 3) for i in range(1, 6)), ("test_batch", 4)]:
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"labels": list(rng.integers(0, 10, n))}, f)
    data = load_cifar10(tmp_path)
    assert data.x_train.shape == (15, 3, 32, 32) and data.x_test.shape == (4, 3, 32, 32)
    raw = pickle.load(open(folder / "data_batch_1", "rb"))[b"data"][0].reshape(3, 32, 32) / 255.0
    expected = (raw[1] - 0.456) / 0.224
    assert np.allclose(data.x_train[0, 1].numpy(), expected, atol=1e-6)
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DpgridError, match="unreadable CIFAR-10 batch"):
        load_cifar10(tmp_path)
    with pytest.raises(DpgridError, match="missing data file"):
        load_cifar10(tmp_path / "elsewhere")


@pytest.mark.slow
def test_the_release_loads_without_dpgrid_on_kymatios_transform(tmp_path, monkeypatch):
    """docs/scatternet.md's snippet: kymatio's Scattering2D, then plain PyTorch with the released weights, gives the
    logits dpgrid.load_model gives."""
    frontend = pytest.importorskip("kymatio.scattering2d.frontend.torch_frontend")
    from safetensors.torch import load_file

    from dpgrid.data.datasets import load_idx

    monkeypatch.setenv("DPGRID_FEATURES", str(tmp_path / "features"))
    root = tmp_path / "data"
    make_idx_root(root, n_train=48, n_test=16)
    cfg = load_cfg("mnist", "fixed_threshold", **{"model": "scatternet_linear", "dataset.n_train": "null",
                                                  "data.root": str(root), "grid.k": 2, "train.seeds": 1,
                                                  "train.steps": 2, "train.batch_size": 16})
    dpgrid.run_grid(cfg, tmp_path / "grid", progress=False)
    images = load_idx(root, "MNIST").x_test
    scattering = frontend.ScatteringTorch2D(J=2, shape=(28, 28), L=8)
    head = torch.nn.Sequential(torch.nn.Identity(), torch.nn.GroupNorm(27, 81, affine=False), torch.nn.Flatten(),
                               torch.nn.Linear(81 * 7 * 7, 10))
    head.load_state_dict(load_file(tmp_path / "grid" / "model" / "seed0.safetensors"))
    plain = head(scattering(images).reshape(len(images), 81, 7, 7))
    ours = dpgrid.load_model(tmp_path / "grid")(images)  # float32 rounding of the features, scaled by the weights
    torch.testing.assert_close(plain, ours, atol=1e-4 * float(ours.abs().max()), rtol=1e-3)
