"""The fast engine's layer rules (dpgrid.training.rules), each against per-sample autograd in float64
(dpgrid.testing.check_rule: the whole batch and two chunks, dense and disjoint weights, every form forced, stacked
where the type stacks), the registry's dispatch, and the transformers on the fast engine against torch.func."""

import pytest
import torch
from torch import nn

from dpgrid import DpgridError
from dpgrid.testing import check_rule
from dpgrid.training.persample import FastEngine, FuncEngine, make_engine, unsupported_layers
from dpgrid.training.rules import RULES, LayerRule, register_rule, rule_for, why_unserved
from dpgrid.training.rules.linear import LinearRule


def frozen(module, *names):
    for name in names:
        getattr(module, name).requires_grad_(False)
    return module


def ids(*shape, high=9):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(3))


def x(*shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(2))


CASES = {
    "linear": lambda: (nn.Linear(5, 4), x(6, 5)),
    "linear_no_bias": lambda: (nn.Linear(5, 4, bias=False), x(6, 5)),
    "linear_bias_frozen": lambda: (frozen(nn.Linear(5, 4), "bias"), x(6, 5)),
    "linear_sequence": lambda: (nn.Linear(5, 4), x(6, 7, 5)),
    "linear_sequence_wide": lambda: (nn.Linear(5, 9, bias=False), x(6, 7, 5)),
    "linear_sequence_weight_frozen": lambda: (frozen(nn.Linear(5, 4), "weight"), x(6, 7, 5)),
    "linear_rank_4": lambda: (nn.Linear(5, 4), x(6, 2, 3, 5)),
    "embedding_repeats": lambda: (nn.Embedding(9, 4), ids(6, 11)),
    "embedding_padding": lambda: (nn.Embedding(9, 4, padding_idx=0), ids(6, 11)),
    "embedding_one_index": lambda: (nn.Embedding(9, 4), ids(6)),
    # every sample the same distinct rows (a position embedding), with padding among them, and repeated
    "embedding_positions": lambda: (nn.Embedding(12, 4), torch.arange(7).repeat(6, 1)),
    "embedding_positions_padding": lambda: (nn.Embedding(12, 4, padding_idx=3), torch.arange(7).repeat(6, 1)),
    "embedding_same_rows_repeated": lambda: (nn.Embedding(12, 4), torch.tensor([0, 2, 2, 5, 0]).repeat(6, 1)),
    "layer_norm": lambda: (nn.LayerNorm(5), x(6, 7, 5)),
    "layer_norm_2d_no_bias": lambda: (nn.LayerNorm((7, 5), bias=False), x(6, 7, 5)),
    "layer_norm_flat": lambda: (nn.LayerNorm(5), x(6, 5)),
    "layer_norm_weight_frozen": lambda: (frozen(nn.LayerNorm(5), "weight"), x(6, 3, 5)),
    "rms_norm": lambda: (nn.RMSNorm(5), x(6, 7, 5)),
    "group_norm": lambda: (nn.GroupNorm(2, 4), x(6, 4, 3, 3)),
    "group_norm_flat": lambda: (nn.GroupNorm(2, 4), x(6, 4)),
    "instance_norm_1d": lambda: (nn.InstanceNorm1d(4, affine=True), x(6, 4, 5)),
    "instance_norm_2d": lambda: (nn.InstanceNorm2d(4, affine=True), x(6, 4, 3, 3)),
    "instance_norm_3d": lambda: (nn.InstanceNorm3d(2, affine=True), x(6, 2, 3, 3, 2)),
    "instance_norm_tracked_eval": lambda: (nn.InstanceNorm2d(4, affine=True, track_running_stats=True).eval(),
                                           x(6, 4, 3, 3)),
    "conv1d": lambda: (nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), x(6, 4, 9)),
    "conv1d_same_no_bias": lambda: (nn.Conv1d(3, 2, 4, padding="same", bias=False), x(6, 3, 8)),
    "conv2d_groups_dilation": lambda: (nn.Conv2d(4, 6, 3, stride=2, dilation=2, groups=2), x(6, 4, 11, 11)),
    "conv2d_depthwise": lambda: (nn.Conv2d(3, 6, 3, padding=1, groups=3), x(6, 3, 7, 7)),
    "conv2d_bias_frozen": lambda: (frozen(nn.Conv2d(2, 3, 3), "bias"), x(6, 2, 7, 7)),
    "conv_transpose_strided": lambda: (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                                       x(6, 4, 5, 5)),
    "conv_transpose_plain": lambda: (nn.ConvTranspose2d(3, 2, 3), x(6, 3, 5, 5)),
}


@pytest.mark.parametrize("case", CASES)
def test_each_rule_is_exact_against_per_sample_autograd(case):
    module, inputs = CASES[case]()
    torch.manual_seed(0)
    assert check_rule(module, inputs) > 0


def test_the_stacked_linear_form_is_checked_too():
    """check_rule stacks copies of a Linear layer (its rule says `stacks`) and compares each run with autograd."""
    plain, sequence = check_rule(nn.Linear(5, 4), x(6, 5)), check_rule(nn.Linear(5, 4), x(6, 3, 5))
    without = check_rule(frozen(nn.Linear(5, 4), "bias"), x(6, 5))  # a frozen part never stacks
    assert plain > without and sequence > without


class Doubled(nn.Linear):
    """A Linear subclass whose forward is not Linear's: Linear's rule would clip the wrong gradients."""

    def forward(self, x):
        return 2 * super().forward(x)


def test_a_wrong_rule_is_caught(monkeypatch):
    monkeypatch.setitem(RULES, Doubled, LinearRule)
    with pytest.raises(AssertionError, match="squared norms: relative error"):
        check_rule(Doubled(5, 4), x(6, 5))


def test_a_subclass_gets_no_rule_of_its_parent_and_falls_back():
    """Rules are found by exact type: a subclass may compute something else (Doubled), so it falls back to the exact
    torch.func engine, saying which layer and how to register one."""
    model = nn.Sequential(Doubled(5, 4), nn.ReLU(), nn.Linear(4, 2))
    assert rule_for(model[0]) is None and rule_for(model[2]) is LinearRule
    assert unsupported_layers(model) == ["Doubled has no rule (dpgrid.training.rules.register_rule)"]
    with pytest.warns(UserWarning, match="Doubled has no rule"):
        assert isinstance(make_engine(model, "classification"), FuncEngine)


def test_a_users_rule_registers_from_outside(monkeypatch):
    """register_rule from a user's module: the engine serves the type at once, and check_rule proves the rule."""
    class Scale(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return x * self.gain

    class ScaleRule(LayerRule):
        def __init__(self, module, a, g, choice, params, stacked=False):
            super().__init__(module, a, g, choice, params, stacked)
            self.grads = (a * g).reshape(len(a), -1, a.shape[-1]).sum(1)

        def sq_norms(self):
            return self.grads.pow(2).sum(1)

        def weighted_sum(self, w, subsets=None):
            return [w @ self.grads]

    monkeypatch.setitem(RULES, Scale, ScaleRule)  # what @register_rule(Scale) does, undone after the test
    assert register_rule(Scale)(ScaleRule) is ScaleRule
    assert check_rule(Scale(4), x(6, 3, 4)) > 0
    model = nn.Sequential(nn.Linear(3, 4), Scale(4), nn.Linear(4, 2)).double()
    assert isinstance(make_engine(model, "classification"), FastEngine)


@pytest.mark.parametrize("setting, why", [("max_norm", "Embedding with max_norm"),
                                          ("scale_grad_by_freq", "Embedding with scale_grad_by_freq")])
def test_embeddings_a_rule_does_not_cover_fall_back(setting, why):
    module = nn.Embedding(9, 4, **{setting: 1.0 if setting == "max_norm" else True})
    assert why_unserved(module) == why


def test_a_circular_padding_falls_back():
    assert why_unserved(nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular")) == \
        "Conv2d with padding_mode=circular"


def test_tied_embeddings_are_refused_in_one_line():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.out = nn.Embedding(9, 4), nn.Linear(4, 9, bias=False)
            self.out.weight = self.embed.weight

        def forward(self, ids):
            return self.out(self.embed(ids).mean(1))

    with pytest.raises(DpgridError, match="model: embed and out share a parameter") as refusal:
        make_engine(Tied(), "classification", "fast")
    assert "\n" not in str(refusal.value)


def transformer_case():
    from dpgrid.models.transformers import transformer

    ids_ = ids(5, 9, high=52)
    ids_[0, 4:] = 0  # a short text: its padding is attended by no one
    return transformer(vocabulary=50, max_tokens=9, width=16, heads=4).double(), ids_, torch.tensor([0, 1, 2, 3, 0])


def vit_case():
    from dpgrid.models.transformers import vit

    return vit(width=16, heads=4).double(), x(5, 1, 28, 28).double(), torch.tensor([0, 1, 2, 3, 9])


@pytest.mark.parametrize("case", [transformer_case, vit_case])
def test_the_transformers_train_on_the_fast_engine_exactly(case):
    """Every parametrised layer of both transformers has a rule (no fallback), and the fast engine's norms, sums and
    per-layer norms are torch.func's (float64)."""
    model, inputs, labels = case()
    engine = make_engine(model, "classification")
    assert isinstance(engine, FastEngine) and not unsupported_layers(model)
    fast, ref = engine(inputs, labels), FuncEngine(model, "classification")(inputs, labels)
    assert torch.allclose(fast.norms, ref.norms, rtol=1e-9, atol=0)
    assert torch.allclose(fast.group_norms, ref.group_norms, rtol=1e-9, atol=1e-300)
    clip = ref.norms.median()
    for w in (torch.clamp(clip / ref.norms, max=1.0), (ref.norms > clip).double() / ref.norms):
        for a, b in zip(fast.weighted_sum(w), ref.weighted_sum(w)):
            assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_padding_moves_nothing():
    """A text's padding positions carry no gradient: the same text padded longer has the same per-sample norm."""
    model, inputs, labels = transformer_case()
    short = inputs[:1].clone()
    short[0, 4:] = 0
    other = short.clone()
    other[0, 6:] = 0  # the same padding, later positions: the same text
    engine = FastEngine(model, "classification")
    assert torch.allclose(engine(short, labels[:1]).norms, engine(other, labels[:1]).norms, rtol=1e-12)


@pytest.mark.parametrize("value, message", [
    (dict(width=30, heads=4), r"model.heads must divide model.width \(30\), got 4"),
    (dict(depth=0), "model.depth must be a whole number >= 1, got 0"),
])
def test_transformer_settings_are_checked_in_one_line(value, message):
    from dpgrid.models.transformers import transformer

    with pytest.raises(DpgridError, match=message):
        transformer(**value)


def test_a_vit_patch_must_divide_the_image():
    from dpgrid.models.transformers import vit

    with pytest.raises(DpgridError, match=r"model.patch must divide the image side \(28\), got 5"):
        vit(patch=5)
