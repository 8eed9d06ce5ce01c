"""Runs that train together (train.parallel_runs): a stacked group gives every run the numbers it gets alone."""

import math

import pytest
import torch

from dpgrid.config import check_loaded, compile
from dpgrid.data import load
from dpgrid.runner import build_strategy, sources, train_together
from dpgrid.training.stacked import StackedModel, group_size, why_not_stacked

from .conftest import load_cfg, strategy_class

STACKED = ["online", "fixed_threshold", "fixed_quantile", "adamwosm", "dpadam", "nodp"]


def small_grid(strategy, **overrides):
    """A digits grid in float64 (rounding cannot flip online's sign decisions), 12 steps, validated every 3."""
    settings = {"train.float64": True, "train.epochs": 1, "train.eval_every": 3, "train.seeds": 2, "grid.k": 2,
                **overrides}
    spec = compile(load_cfg("digits", strategy, **settings))
    data = load(spec.dataset, spec.data_root, "cpu").in_float64()
    check_loaded(spec, data.n_train)
    return spec, data


@pytest.mark.parametrize("strategy", [s if s in ("online", "fixed_quantile") else pytest.param(s, marks=pytest.mark.slow)
                                      for s in STACKED])  # the two with adaptive state in the fast layer
def test_a_group_matches_each_run_trained_alone(strategy):
    """Each run's masks and noise come from its own names, so stacking changes no number: its curve (value,
    test loss, clip, lr at every validation) is the one-at-a-time run's, in float64, for every built-in strategy
    that stacks. Runs of different configurations and seeds share the group."""
    spec, data = small_grid(strategy)
    runs = [(c, s) for c in spec.plan.configurations for s in range(2)]
    alone = [train_together(spec, data, [run])[0] for run in runs]
    stacked = train_together(spec, data, runs)
    for a, b in zip(alone, stacked):
        assert (a.steps, a.best_step, a.diverged) == (b.steps, b.best_step, b.diverged)
        assert len(a.curve) == len(b.curve) > 2
        for ca, cb in zip(a.curve, b.curve):
            for key in ("value", "test_loss", "clip", "lr"):
                assert ca[key] == pytest.approx(cb[key], rel=1e-9, abs=1e-12, nan_ok=True), (key, ca, cb)


def digits_conv() -> torch.nn.Sequential:
    """digits' 8x8 images through a convolution and a transposed one (the CNN's and the autoencoder's layer types)."""
    from torch import nn

    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(inplace=True),
                         nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1), nn.Tanh(), nn.Flatten(),
                         nn.Linear(2 * 15 * 15, 10))


@pytest.mark.slow  # a grid of float64 convolutions, 20-40 s; each layer's stacked form is in the fast layer (test_rules)
@pytest.mark.parametrize("strategy", ["online", "fixed_quantile"])
def test_convolutions_stack_and_each_run_gets_its_numbers_alone(strategy):
    """A model of convolutions (Conv2d and ConvTranspose2d, an in-place ReLU between them) trains stacked: each run's
    whole curve is the one it has trained alone, in float64."""
    spec, data = small_grid(strategy, **{"model._target_": "tests.test_stacked.digits_conv"})
    assert why_not_stacked(digits_conv(), spec.strategy_cls) == ""
    runs = [(c, s) for c in spec.plan.configurations for s in range(2)]
    alone = [train_together(spec, data, [run])[0] for run in runs]
    stacked = train_together(spec, data, runs)
    for a, b in zip(alone, stacked):
        assert (a.steps, a.diverged, len(a.curve)) == (b.steps, b.diverged, len(b.curve)) and len(a.curve) > 2
        for ca, cb in zip(a.curve, b.curve):
            for key in ("value", "test_loss", "clip", "lr"):
                assert ca[key] == pytest.approx(cb[key], rel=1e-9, abs=1e-12, nan_ok=True), (key, ca, cb)


def test_a_diverged_run_ends_alone_and_the_others_go_on():
    spec, data = small_grid("fixed_threshold")
    config = dict(spec.plan.configurations[0])
    wild = {**config, "config_id": "wild", "lr": 1e300, "clip": 1e300}  # overflows to inf at its first step
    (alone,) = train_together(spec, data, [(config, 0)])
    calm, diverged = train_together(spec, data, [(config, 0), (wild, 0)])
    assert diverged.diverged and math.isnan(diverged.best_value) and diverged.steps < spec.plan.steps
    assert not calm.diverged and calm.steps == spec.plan.steps
    assert calm.best_value == pytest.approx(alone.best_value, rel=1e-9)
    assert [c["value"] for c in calm.curve] == pytest.approx([c["value"] for c in alone.curve], rel=1e-9)


@pytest.mark.parametrize("secure", [False, True])
def test_every_run_of_a_group_draws_its_own_noise(secure):
    """Three slots of the same configuration and seed: seeded, their streams are derived from the same names and
    they stay identical; in secure mode each slot draws from the OS generator on its own, and no two agree."""
    spec, data = small_grid("fixed_threshold", **{"privacy.secure_rng": secure})
    config = spec.plan.configurations[0]
    models = [torch.nn.Linear(3, 2, dtype=torch.float64) for _ in range(3)]
    for m in models:
        m.load_state_dict(models[0].state_dict())
    stack = StackedModel([torch.nn.Sequential(m) for m in models])
    pairs = [sources(spec, config, 0, "cpu") for _ in models]
    strategy = build_strategy(spec, stack.params, {"lr": (1.0,) * 3, "clip": (1.0,) * 3}, [n for _, n in pairs])
    before = [p.clone() for p in stack.params]
    strategy.noisy_mean([torch.zeros_like(p) for p in stack.params], 1.0)  # noise only
    noise = strategy.noisy_mean([torch.zeros_like(p) for p in stack.params], 1.0)
    weight = noise[0].flatten(1)
    same = [torch.equal(weight[0], weight[r]) for r in (1, 2)] + [torch.equal(weight[1], weight[2])]
    assert same == ([True] * 3 if not secure else [False] * 3)
    assert all(torch.equal(a, b) for a, b in zip(before, stack.params))  # noisy_mean itself changes nothing
    batches = [next(iter([s.poisson_indices(1000, 0.5)])) if secure else None for s, _ in pairs]
    if secure:  # the masks too: each slot's own draw
        assert not torch.equal(batches[0], batches[1])


def test_what_cannot_stack_trains_one_run_at_a_time_and_says_why():
    from dpgrid.models import build_model
    cnn = build_model(load_cfg("mnist", "online").model)  # stacks when asked; auto does not (measured slower)
    assert why_not_stacked(cnn, strategy_class("online")) == ""
    size, why = group_size("auto", cnn, strategy_class("online"), 35, 512, torch.device("cpu"), torch.rand(1, 1, 28, 28))
    assert size == 1 and "Conv2d layers stack" in why and "measured slower" in why
    assert group_size("6", cnn, strategy_class("online"), 35, 512, torch.device("cpu"), torch.rand(1, 1, 28, 28)) == (6, "")
    mlp = build_model(load_cfg("digits", "online").model)
    assert "written for one run" in why_not_stacked(mlp, strategy_class("pur"))
    assert group_size("auto", mlp, strategy_class("pur"), 35, 128, torch.device("cpu"))[0] == 1
    assert group_size("auto", mlp, strategy_class("online"), 35, 128, torch.device("cpu")) == (35, "")
    assert group_size("4", mlp, strategy_class("online"), 35, 128, torch.device("cpu")) == (4, "")
    assert group_size("64", mlp, strategy_class("online"), 10, 128, torch.device("cpu")) == (10, "")
    words = build_model(load_cfg("ag_news", "online").model)  # compute-bound on a CPU: stacked only when asked
    size, why = group_size("auto", words, strategy_class("online"), 35, 512, torch.device("cpu"))
    assert size == 1 and "bound by its arithmetic" in why
    assert group_size("8", words, strategy_class("online"), 35, 512, torch.device("cpu")) == (8, "")


def test_a_grid_resumed_mid_group_ends_with_the_uninterrupted_grids_csvs(tmp_path):
    """A kill after some runs of a group were committed: the same command trains the whole group again (its
    padding and kernels as before) and commits only what is missing. Same machine, same process: the CSVs are
    the uninterrupted grid's up to float rounding far below what another grouping would move (float32 here)."""
    import pandas as pd

    from dpgrid.results.seal import seal
    from dpgrid.runner import train

    spec = compile(load_cfg("digits", "online", **{"train.epochs": 1, "train.eval_every": 4, "train.seeds": 2,
                                                   "grid.k": 3, "train.parallel_runs": 4}))
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train(spec, whole, progress=False)
    train(spec, resumed, progress=False)
    runs = pd.read_csv(resumed / "runs.csv")
    runs.iloc[:5].to_csv(resumed / "runs.csv", index=False)  # the 6th run lost: the second group (5, 6) half committed
    seal(resumed)  # as the kill after the 5th run's commit left it sealed
    train(spec, resumed, progress=False)
    key = ["config_id", "seed"]
    a = pd.read_csv(whole / "runs.csv").sort_values(key).reset_index(drop=True)
    b = pd.read_csv(resumed / "runs.csv").sort_values(key).reset_index(drop=True)
    assert len(a) == len(b) == 6
    for column in ("best_value", "final_clip", "final_lr", "best_step", "steps"):
        assert b[column].tolist() == pytest.approx(a[column].tolist(), rel=1e-12), column
    ca = pd.read_csv(whole / "curves.csv").sort_values([*key, "step"]).reset_index(drop=True)
    cb = pd.read_csv(resumed / "curves.csv").sort_values([*key, "step"]).reset_index(drop=True)
    assert len(ca) == len(cb)
    for column in ("test_loss", "clip", "lr"):  # the test loss moves with any rounding of the run's steps
        assert cb[column].tolist() == pytest.approx(ca[column].tolist(), rel=1e-12), column


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_parallel_runs_is_one_line(value):
    from dpgrid import DpgridError

    with pytest.raises(DpgridError, match=rf"^train.parallel_runs must be auto or a whole number >= 1, got '{value}'$"):
        compile(load_cfg("digits", "online", **{"train.parallel_runs": value}), plan=False)


def test_a_stacked_strategys_curve_values_are_each_runs_own(tmp_path, monkeypatch):
    """curve_values' stacked form: a (G,) tensor is a value per run, recorded in each run's curve as its own (the
    numbers it records alone); a plain number is every run's."""
    from dpgrid.testing import check_stacked

    (tmp_path / "noted.py").write_text(
        "from dpgrid.strategies import FixedThreshold\n\n\nclass Noted(FixedThreshold):\n    stacks = True\n\n"
        "    def curve_values(self):\n        return {\"twice_clip\": 2 * self.clip, \"one\": 1.0}\n")
    conf = tmp_path / "conf" / "strategy"
    conf.mkdir(parents=True)
    (conf / "noted.yaml").write_text("_target_: noted.Noted\nname: noted\ngrid: [lr, clip]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    assert check_stacked("noted", search) > 0
    spec, data = small_grid("noted", **{"hydra.searchpath": f"[file://{tmp_path / 'conf'}]"})
    runs = [(c, 0) for c in spec.plan.configurations]
    for (config, _), result in zip(runs, train_together(spec, data, runs)):
        assert [c["twice_clip"] for c in result.curve] == pytest.approx([2 * config["clip"]] * len(result.curve))
        assert {c["one"] for c in result.curve} == {1.0}
