"""The fast engine proves itself on every grid's first batch, or steps aside (dpgrid.training.proof): models users bring,
each trained a few steps on the engine a grid would choose for it, with per-sample norms and sums equal to per-sample
autograd in float64; the ones the fast engine cannot serve go to torch.func in one warning (train.engine=auto) or are
refused in one line (train.engine=fast); a broken rule is caught; the batch is found, never guessed from a shape."""

import math
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpgrid import DpgridError
from dpgrid.training.persample import FastEngine, engine_for, make_engine, parametrised_layers
from dpgrid.training.proof import RTOL, choose_engine, exact, find_layout, prove
from dpgrid.training.rules import RULES, LayerRule, register_rule

T = 8  # positions of the sequence models: a batch of T samples is among the cases


class InPlaceReLU(nn.Sequential):
    """torchvision's pattern: Linear, ReLU(inplace=True), Linear."""

    def __init__(self):
        super().__init__(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3))


class InPlaceOps(nn.Module):
    """An activation written into a layer's output (F.leaky_relu(inplace=True); torch has no in-place GELU), and
    h.mul_(2) on another's."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = F.leaky_relu(self.fc1(x), 0.1, inplace=True)
        h = self.fc2(h)
        h.mul_(2)
        return self.head(torch.tanh(h))


class NanoGPT(nn.Module):
    """nanoGPT's embedding: wte(idx) + wpe(arange(T)) (the position embedding called without the batch), a
    pre-LayerNorm MLP block, a head; `tied`: the head's weight is the token embedding's."""

    def __init__(self, vocabulary=11, width=6, tied=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocabulary, width), nn.Embedding(T, width)
        self.ln, self.fc, self.proj = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        x = x + self.proj(F.gelu(self.fc(self.ln(x))))
        return self.head(x).mean(1)


class SequenceFirst(nn.Module):
    """nn.Transformer's default layout: the Linear sees (T, B, d)."""

    def __init__(self, width=5):
        super().__init__()
        self.fc, self.head = nn.Linear(width, width), nn.Linear(width, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc(x.transpose(0, 1))).mean(0))


class SharedOutside(nn.Module):
    """A layer's weight also used outside the layer: F.linear(x, self.fc.weight)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.fc(x) + F.linear(x, self.fc.weight))


class NeverCalled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.spare = nn.Linear(4, 3), nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class RawViT(nn.Module):
    """A ViT with a raw nn.Parameter class token and position embedding (no layer owns them)."""

    def __init__(self, patches=4, width=6):
        super().__init__()
        self.embed = nn.Linear(7 * 7, width)
        self.cls = nn.Parameter(torch.randn(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, patches + 1, width))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, 3)

    def forward(self, images):
        patches = F.unfold(images, 7, stride=7).transpose(1, 2)
        x = self.embed(patches)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos
        return self.head(self.norm(x)[:, 0])


def images(n):
    return torch.rand(n, 1, 14, 14)


CASES = {  # name: (model, inputs of n samples, labels of n)
    "in-place ReLU": (InPlaceReLU, lambda n: torch.randn(n, 4), lambda n: torch.randint(0, 3, (n,))),
    "in-place leaky ReLU and mul_": (InPlaceOps, lambda n: torch.randn(n, 4), lambda n: torch.randint(0, 3, (n,))),
    "nanoGPT wpe(arange(T))": (NanoGPT, lambda n: torch.randint(0, 11, (n, T)), lambda n: torch.randint(0, 11, (n,))),
    "nanoGPT, tied embeddings": (lambda: NanoGPT(tied=True), lambda n: torch.randint(0, 11, (n, T)),
                                 lambda n: torch.randint(0, 11, (n,))),
    "sequence-first Linear": (SequenceFirst, lambda n: torch.randn(n, T, 5), lambda n: torch.randint(0, 3, (n,))),
    "weight used through F.linear": (SharedOutside, lambda n: torch.randn(n, 4), lambda n: torch.randint(0, 3, (n,))),
    "a layer never called": (NeverCalled, lambda n: torch.randn(n, 4), lambda n: torch.randint(0, 3, (n,))),
    "ViT with raw parameters": (RawViT, images, lambda n: torch.randint(0, 3, (n,))),
}
FAST = {"in-place ReLU", "in-place leaky ReLU and mul_", "nanoGPT wpe(arange(T))", "sequence-first Linear",
        "a layer never called"}  # served exactly; the others step aside


def grid_engine(model, x, y, setting="auto"):
    """The engine a grid of this model trains with: the compile's choice by layer types, then the first batch's proof."""
    name, _ = engine_for(model, setting)
    if name == "func":
        return make_engine(model, "classification", "func"), "func"
    choice = choose_engine(model, "classification", x, y, setting, False, "auto")
    return make_engine(model, "classification", choice.name, layout=choice.layout), choice.name


def close(got, want, what):
    error = float((got - want).norm() / want.norm().clamp_min(1e-300))
    assert error <= 1e-10, f"{what}: relative error {error:.1e}"


@pytest.mark.parametrize("name", list(CASES))
def test_each_model_trains_with_per_sample_autograds_norms_and_sums(name):
    """A few steps of plain DP-SGD on the engine the grid would choose, the batch size equal to T among them: every
    step's norms and clipped sums equal the exact per-sample gradients', on the fast engine with the batch padded by
    two masked rows too (as on CUDA); the models the fast engine cannot serve are the ones that step aside."""
    build, inputs, labels = CASES[name]
    torch.manual_seed(0)
    model = build().double()
    public_x, public_y = inputs(40), labels(40)
    public_x = public_x.double() if public_x.is_floating_point() else public_x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine, chosen = grid_engine(model, public_x, public_y)
    assert chosen == ("fast" if name in FAST else "func"), chosen
    params = [p for p in model.parameters() if p.requires_grad]
    for size in (T, 3, 5):
        x, y = inputs(size), labels(size)
        x = x.double() if x.is_floating_point() else x
        got, want = engine(x, y), exact(model, "classification", x, y)
        close(got.norms, want.norms, f"{name}, {size} samples: norms")
        weights = torch.clamp(0.5 * want.norms.median() / want.norms, max=1.0)
        for a, b in zip(got.weighted_sum(weights), want.weighted_sum(weights)):
            close(a, b, f"{name}, {size} samples: clipped sum")
        if chosen == "fast":  # padded as a CUDA graph needs the batch: two masked rows change nothing
            padded = engine(torch.cat([x, x[:2]]), torch.cat([y, y[:2]]),
                            torch.cat([torch.ones(size), torch.zeros(2)]).double())
            close(padded.norms[:size], want.norms, f"{name}, {size} samples padded: norms")
            assert torch.isinf(padded.norms[size:]).all(), f"{name}: a padded row's norm is finite"
            padded_weights = torch.clamp(0.5 * want.norms.median() / padded.norms, max=1.0)
            for a, b in zip(padded.weighted_sum(padded_weights), want.weighted_sum(weights)):
                close(a, b, f"{name}, {size} samples padded: clipped sum")
        with torch.no_grad():  # a step, so the next batch is checked at other parameters
            for p, s in zip(params, got.weighted_sum(weights)):
                p.sub_(0.1 * s / size)


def test_a_batch_of_t_samples_is_not_taken_for_t_positions():
    """The layout is found with batch sizes that equal no dimension of the model, so a batch of exactly T samples
    gives the position embedding its own per-sample view: before, the T rows were read as T samples (0.2 % off)."""
    model = NanoGPT().double()
    layout = find_layout(model, parametrised_layers(model), torch.randint(0, 11, (40, T)))
    positions = parametrised_layers(model).index(model.wpe)
    assert layout.layers[positions].batch_dim is None and not layout.problem
    assert all(found.batch_dim == 0 for at, found in enumerate(layout.layers) if at != positions)
    unaware = FastEngine(model, "classification")  # the engine told nothing: dimension 0 taken for the samples
    x, y = torch.randint(0, 11, (T, T)), torch.randint(0, 11, (T,))
    assert not torch.allclose(unaware(x, y).norms, exact(model, "classification", x, y).norms, rtol=1e-6)


def test_an_in_place_change_found_while_training_is_served_from_then_on():
    """An engine told nothing of the model sees the in-place ReLU change its layer's output and keeps a copy of it from
    that batch on: its norms are autograd's."""
    model = InPlaceReLU().double()
    engine = FastEngine(model, "classification")
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    close(engine(x, y).norms, exact(model, "classification", x, y).norms, "in-place ReLU")


def test_the_stacked_engine_serves_an_in_place_activation():
    """Stacked runs of the in-place ReLU model (train.parallel_runs): each run's norms and sums are its own."""
    model = InPlaceReLU()
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    layout, alone, stacked, _ = prove(model, "classification", x, y, stacked_too=True)
    assert alone == "" and stacked == "", (alone, stacked)


def test_what_cannot_be_served_is_named_and_forced_fast_is_refused():
    model = SharedOutside()
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    with pytest.warns(UserWarning, match=r"steps aside: Linear 'fc'.*outside its own call"):
        assert choose_engine(model, "classification", x, y, "auto", False, "auto").name == "func"
    with pytest.raises(DpgridError, match=r"^train.engine=fast: Linear 'fc'.*train.engine=auto") as refused:
        choose_engine(model, "classification", x, y, "fast", False, "auto")
    assert "\n" not in str(refused.value)
    with pytest.raises(DpgridError, match="tied weights"):  # known by its layer types: refused at compile
        engine_for(NanoGPT(tied=True), "fast")
    assert engine_for(RawViT(), "auto")[0] == "func" and "RawViT has no rule" in engine_for(RawViT(), "auto")[1]


class Doubling(nn.Linear):
    """A Linear subclass for the broken rule below (a rule is registered for a type exactly)."""


@pytest.fixture
def broken_rule():
    """A rule registered by a test whose norms are the Linear rule's doubled: a plugin author's bug."""
    from dpgrid.training.rules.linear import LinearRule

    @register_rule(Doubling)
    class BrokenRule(LinearRule):
        def sq_norms(self):
            return 4 * super().sq_norms()

    yield BrokenRule
    RULES.pop(Doubling)


def test_a_broken_rule_is_caught_on_the_first_batch(broken_rule):
    model = nn.Sequential(Doubling(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    with pytest.warns(UserWarning, match=r"Doubling '0'.*its rule \(BrokenRule\) computes other per-sample"):
        assert choose_engine(model, "classification", x, y, "auto", True, "auto").name == "func"
    with pytest.raises(DpgridError, match=r"train.engine=fast: Doubling '0'"):
        choose_engine(model, "classification", x, y, "fast", True, "auto")


class Truncated(nn.Linear):
    """A Linear subclass whose rule (below) returns a sum for its weight and none for its bias."""


def test_a_rule_returning_fewer_sums_than_parameters_is_caught():
    from dpgrid.training.rules.linear import LinearRule

    @register_rule(Truncated)
    class ShortRule(LinearRule):
        def weighted_sum(self, w, subsets=None):
            return super().weighted_sum(w, subsets)[:1]

    try:
        model = nn.Sequential(Truncated(4, 8), nn.Tanh(), nn.Linear(8, 3))
        x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
        _, disagreement, _, _ = prove(model, "classification", x, y, False)
        assert disagreement.startswith("the fast engine fails on this model (ValueError") and "\n" not in disagreement
    finally:
        RULES.pop(Truncated)


def built_in(name):
    from dpgrid.models import autoencoder, cnn, mlp
    from dpgrid.models.transformers import transformer, vit

    images, digits = torch.rand(20, 1, 28, 28), torch.randint(0, 10, (20,))
    return {"mlp": (mlp(), torch.randn(20, 64), torch.randint(0, 10, (20,)), "classification"),
            "cnn": (cnn(), images, digits, "classification"),
            "autoencoder": (autoencoder(), images, images, "reconstruction"),
            "vit": (vit(), images, digits, "classification"),
            "transformer": (transformer(vocabulary=50), torch.randint(0, 52, (20, 32)), torch.randint(0, 4, (20,)),
                            "classification")}[name]


@pytest.mark.parametrize("name", ["mlp", "vit", *(pytest.param(n, marks=pytest.mark.slow)
                                                  for n in ("cnn", "autoencoder", "transformer"))])
def test_the_built_in_models_prove_themselves_far_inside_the_tolerance(name):
    """float64 rounding of the two summation orders, on the built-in models (RTOL's justification)."""
    model, x, y, task = built_in(name)
    layout, disagreement, stacked, error = prove(model, task, x, y, False)
    assert not disagreement and error < 1e-10 < RTOL, (name, error)
    assert all(found.batch_dim == 0 and not found.copies for found in layout.layers)
    assert math.isfinite(error)
