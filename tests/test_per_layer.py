"""Per-parameter-group information (group norms, sums with per-(sample, group) weights) and the per-layer
clipping plugin built on it (examples/dpgrid_example/per_layer.py)."""

import math
import sys

import pytest
import torch
from torch import nn

from dpgrid.models import cnn, mlp
from dpgrid.training.persample import empty_batch, make_engine, parameter_groups, per_sample_losses
from dpgrid.privacy.randomness import standard_normal
from dpgrid.strategies.base import Noise

from .plugin import EXAMPLES, SEARCHPATH, dpgrid


def per_layer_class():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from dpgrid_example.per_layer import PerLayerClipping
    finally:
        sys.path.remove(str(EXAMPLES))
    return PerLayerClipping


def models():
    torch.manual_seed(0)
    return {"mlp": (mlp().double(), torch.randn(5, 64, dtype=torch.float64), torch.tensor([0, 1, 9, 1, 0])),
            "cnn": (cnn().double(), torch.rand(3, 1, 28, 28, dtype=torch.float64), torch.tensor([1, 7, 3]))}


def loop_grads(model, x, y):
    """Each sample's gradient, one backward per sample: the reference."""
    out = []
    for i in range(len(x)):
        model.zero_grad()
        per_sample_losses(model(x[i:i + 1]), y[i:i + 1], "classification")[0].backward()
        out.append([p.grad.detach().clone() for p in model.parameters()])
    return out


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("engine", ["fast", "func"])
def test_group_norms_and_sums_match_the_per_sample_loop(name, engine):
    model, x, y = models()[name]
    groups = parameter_groups(model)
    reference = loop_grads(model, x, y)
    grads = make_engine(model, "classification", engine)(x, y)
    expected = torch.tensor([[math.sqrt(sum(float(g[i].pow(2).sum()) for i in group)) for group in groups]
                             for g in reference], dtype=torch.float64)
    torch.testing.assert_close(grads.group_norms, expected, rtol=1e-9, atol=1e-12)
    weights = torch.rand(len(x), len(groups), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    group_of = {i: l for l, group in enumerate(groups) for i in group}
    sums = grads.group_weighted_sum(weights)
    for i, s in enumerate(sums):
        torch.testing.assert_close(s, sum(weights[n, group_of[i]] * reference[n][i] for n in range(len(x))),
                                   rtol=1e-9, atol=1e-12)
    # all groups weighted alike: the ordinary weighted sum
    flat = grads.weighted_sum(weights[:, 0])
    same = grads.group_weighted_sum(weights[:, :1].expand(-1, len(groups)))
    for a, b in zip(flat, same):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_per_layer_clipping_clips_each_layer_to_its_share():
    model, x, y = models()["mlp"]
    groups, reference = parameter_groups(model), loop_grads(model, x, y)
    clip, b, lr = 0.05, 4, 1.0
    before = [p.detach().clone() for p in model.parameters()]
    strategy = per_layer_class()(model.parameters(), hp={"lr": lr, "clip": clip}, noise=Noise(0.0),
                                 batch_size=b, options={}, generator=torch.Generator().manual_seed(0))
    strategy.step(make_engine(model, "classification", "fast")(x, y))
    share = clip / math.sqrt(len(groups))
    expected = [torch.zeros_like(p) for p in before]
    for sample in reference:
        for group in groups:
            norm = math.sqrt(sum(float(sample[i].pow(2).sum()) for i in group))
            assert norm > share  # the test clips every layer of every sample
            clipped = [sample[i] * min(1.0, share / norm) for i in group]
            assert math.sqrt(sum(float(c.pow(2).sum()) for c in clipped)) == pytest.approx(share)
            for i, c in zip(group, clipped):
                expected[i] += c
    for p, p0, e in zip(model.parameters(), before, expected):
        torch.testing.assert_close(p.detach(), p0 - lr * e / b, rtol=1e-9, atol=1e-12)


def test_per_layer_noise_is_nu_times_the_whole_threshold_over_b():
    """The sensitivity is C (sum_l C_l^2 = C^2): the noise's std is nu C / B, the draws those of the generator."""
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2)).double()
    nu, clip, b, lr = 1.7, 0.3, 8, 1.0
    before = [p.detach().clone() for p in model.parameters()]
    strategy = per_layer_class()(model.parameters(), hp={"lr": lr, "clip": clip}, noise=Noise(nu),
                                 batch_size=b, options={}, generator=torch.Generator().manual_seed(5))
    strategy.step(empty_batch(list(model.parameters()), torch.device("cpu"), 2))  # no sample: noise only
    replay = torch.Generator().manual_seed(5)
    for p, p0 in zip(model.parameters(), before):
        z = standard_normal(p.shape, replay, p.device, p.dtype)
        torch.testing.assert_close(p.detach(), p0 - lr * nu * clip / b * z, rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_per_layer_clipping_runs_as_a_plugin(tmp_path):
    r = dpgrid("run", "strategy=per_layer", "grid.k=2", "train.epochs=1", "train.seeds=1", SEARCHPATH,
               f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 0, r.stderr
    assert "best configuration" in r.stdout


def test_per_layer_clipping_stacks_as_it_trains_alone():
    """The example says `stacks = True`: its stacked runs (group norms (G, b, L), group sums per run) get the numbers
    they get alone, checked with the helper a plugin's own test calls."""
    from dpgrid.testing import check_stacked

    from .plugin import EXAMPLES, SEARCHPATH

    import sys
    sys.path.insert(0, str(EXAMPLES))
    try:
        assert check_stacked("per_layer", SEARCHPATH) > 100
    finally:
        sys.path.remove(str(EXAMPLES))


def test_per_layer_clipping_gets_its_numbers_on_padded_batches(monkeypatch):
    """The example says `captures = True`: a padded row's group norms are inf, so its per-layer weights are 0, and
    padded batches train to the curves of the batches as drawn, checked with the helper a plugin's own test calls."""
    from dpgrid.testing import check_padded

    from .plugin import EXAMPLES, SEARCHPATH

    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert check_padded("per_layer", SEARCHPATH) > 100


def test_check_stacked_catches_a_step_that_pools_the_runs(tmp_path, monkeypatch):
    """A plugin's stacked step that reads one clip for every run (the first run's) is not what its runs get alone:
    the helper names the first value that differs."""
    from dpgrid.testing import check_stacked

    (tmp_path / "pooled.py").write_text(
        "import torch\nfrom dpgrid.strategies import FixedThreshold\n\n\nclass Pooled(FixedThreshold):\n"
        "    stacks = True\n\n    def clip_weights(self, norms):\n"
        "        return torch.clamp(self.clip.reshape(-1)[0] / norms.clamp_min(1e-12), max=1.0)\n")
    conf = tmp_path / "conf" / "strategy"
    conf.mkdir(parents=True)
    (conf / "pooled.yaml").write_text("_target_: pooled.Pooled\nname: pooled\ngrid: [lr, clip]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AssertionError, match="alone, .* stacked"):
        check_stacked("pooled", f"hydra.searchpath=[file://{tmp_path / 'conf'}]")
