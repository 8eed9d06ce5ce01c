"""The engines' per-sample norms and weighted sums against a plain loop (one backward per sample), in float64, on
whole models (each layer rule alone: tests/test_rules.py), and the convolutions' per-sample methods."""

import pytest
import torch
from torch import nn

from dpgrid.models import autoencoder, bag_of_words, cnn
from dpgrid import DpgridError
from dpgrid.training.persample import FastEngine, FuncEngine, make_engine
from dpgrid.training.rules import MethodChoice
from dpgrid.training.rules import convolution as convolutions
from dpgrid.training.rules.convolution import CONV_METHODS, applicable


def small_cnn():  # the CNN's layer types (Conv2d with padding, MaxPool2d stride 1) at test size
    return nn.Sequential(nn.Conv2d(1, 3, 4, padding=1), nn.ReLU(), nn.MaxPool2d(2, stride=1),
                         nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 6), nn.ReLU(),
                         nn.Linear(6, 3))


def small_autoencoder():  # Conv2d and ConvTranspose2d with LeakyReLU and Sigmoid, as in Table 6
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.LeakyReLU(), nn.Conv2d(2, 3, 3), nn.LeakyReLU(),
                         nn.ConvTranspose2d(3, 2, 3), nn.LeakyReLU(), nn.ConvTranspose2d(2, 1, 3), nn.Sigmoid())


def strided_conv():
    return nn.Sequential(nn.Conv2d(2, 3, 3, stride=2, padding=2, dilation=2), nn.Tanh(), nn.Flatten(),
                         nn.Linear(3 * 5 * 5, 3, bias=False))


def wide_convs():  # layers wide enough to be unfolded (8 x 8 channels), a non-square kernel and padding
    return nn.Sequential(nn.Conv2d(2, 8, 3), nn.Tanh(), nn.Conv2d(8, 8, (3, 2), padding=(1, 0)), nn.Tanh(),
                         nn.ConvTranspose2d(8, 8, 3), nn.Tanh(), nn.ConvTranspose2d(8, 1, 3), nn.Flatten(),
                         nn.Linear(11 * 10, 3))


def same_padding():  # padding="same" with an even kernel: Conv2d pads the odd one on the right and bottom
    return nn.Sequential(nn.Conv2d(2, 3, (4, 3), padding="same"), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 9 * 9, 3))


CASES = {
    "cnn": (small_cnn, (6, 1, 9, 9), "classification"),
    "bag_of_words": (lambda: bag_of_words(2, 50), (6, 100), "classification"),
    "autoencoder": (small_autoencoder, (6, 1, 8, 8), "reconstruction"),
    "strided_conv": (strided_conv, (6, 2, 9, 9), "classification"),
    "wide_convs": (wide_convs, (6, 2, 9, 9), "classification"),
    "same_padding": (same_padding, (6, 2, 9, 9), "classification"),
}


def loop_reference(model, x, y, task):
    grads = []
    for xi, yi in zip(x, y):
        model.zero_grad()
        out = model(xi.unsqueeze(0))
        loss = (nn.functional.cross_entropy(out, yi.unsqueeze(0)) if task == "classification"
                else nn.functional.mse_loss(out, yi.unsqueeze(0)))
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(grads)


def relative_error(a, b):
    return float((a - b).norm() / b.norm())


def float64_case(case: str, seed: int = 0):
    """(model, x, y, task, the per-sample loop's gradients) of one of CASES, in float64."""
    build, x_shape, task = CASES[case]
    torch.manual_seed(seed)
    model = build().double()
    x = torch.rand(x_shape, dtype=torch.float64)
    y = x if task == "reconstruction" else torch.randint(0, 3, (len(x),))
    return model, x, y, task, loop_reference(model, x, y, task)


ENGINES = {"func": lambda model, task: FuncEngine(model, task),
           **{f"fast:{name}": (lambda name: lambda model, task: FastEngine(model, task, MethodChoice(name)))(name)
              for name in ("auto", *CONV_METHODS)}}  # every per-sample method of a convolution, forced


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_engine_matches_loop_in_float64(engine, case):
    model, x, y, task, reference = float64_case(case)
    grads = ENGINES[engine](model, task)(x, y)
    norms = reference.norm(dim=1)
    assert relative_error(grads.norms, norms) < 1e-6
    clip = norms.median()
    for w in (torch.clamp(clip / norms, max=1.0),                  # the clipped sum
              (norms > clip).double() / norms,                     # online's sum of q_i
              torch.rand(len(x), dtype=torch.float64)):
        flat = torch.cat([t.flatten() for t in grads.weighted_sum(w)])
        assert relative_error(flat, w @ reference) < 1e-6
    assert not hasattr(grads, "loss")  # no un-noised statistic of the private batch leaves the engine


@pytest.mark.parametrize("build, x, task", [
    (cnn, torch.rand(3, 1, 28, 28), "classification"),
    (autoencoder, torch.rand(3, 1, 28, 28), "reconstruction"),
    (bag_of_words, torch.rand(3, 750), "classification"),
])
def test_fast_engine_agrees_with_func_on_the_full_models(build, x, task):
    torch.manual_seed(1)
    model = build().double()
    x = x.double()
    y = x if task == "reconstruction" else torch.tensor([0, 1, 2])
    fast, ref = FastEngine(model, task)(x, y), FuncEngine(model, task)(x, y)
    assert relative_error(fast.norms, ref.norms) < 1e-6
    w = torch.rand(3, dtype=torch.float64)
    for a, b in zip(fast.weighted_sum(w), ref.weighted_sum(w)):
        assert a.shape == b.shape and relative_error(a, b) < 1e-6


def test_unsupported_layer_falls_back_with_a_warning():
    model = nn.Sequential(nn.Linear(4, 4), nn.PReLU(), nn.Linear(4, 2))
    with pytest.warns(UserWarning, match=r"PReLU has no rule \(dpgrid.training.rules.register_rule\)\): falling back"):
        engine = make_engine(model, "classification")
    assert isinstance(engine, FuncEngine)
    assert isinstance(make_engine(bag_of_words(), "classification"), FastEngine)


def test_fast_engine_refuses_weight_sharing():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    with pytest.raises(DpgridError, match="used twice"):
        FastEngine(model, "classification")(torch.rand(2, 3), torch.tensor([0, 1]))


def clipped_sum_moves(model, engine, clip=1e-4):
    """How far changing one sample moves the clipped sum, in units of the bound C."""
    x = torch.randn(8, 4, dtype=torch.float64)
    y = torch.randint(0, 2, (8,))
    def clipped(x):
        grads = engine(model, "classification")(x, y)
        sums = grads.weighted_sum(torch.clamp(clip / grads.norms.clamp_min(1e-12), max=1.0))
        return torch.cat([s.flatten() for s in sums])
    neighbour = x.clone()
    neighbour[0] = 10 * torch.randn(4, dtype=torch.float64)
    return float((clipped(x) - clipped(neighbour)).norm() / clip)


@pytest.mark.parametrize("affine", [True, False])
def test_models_that_mix_samples_are_refused(affine):
    """BatchNorm in training mode: one sample moves the other samples' clipped gradients too, so the
    released sum moves by more than the replace-one bound 2C (shown with the bare fast engine, which sees
    no parameter in a BatchNorm without affine), and make_engine refuses it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, affine=affine), nn.ReLU(), nn.Linear(6, 2)).double()
    if not affine:
        assert clipped_sum_moves(model, FastEngine) > 3  # 1.5 times the bound (3.4 C for this seed)
    for name in ("fast", "func"):
        with pytest.raises(DpgridError, match=r"model: 1 \(BatchNorm1d\) mixes the samples"):
            make_engine(model, "classification", name)
    model.eval()  # frozen statistics mix nothing
    make_engine(model, "classification", "func")


def test_tied_weights_are_refused_by_the_fast_engine_and_exact_in_func():
    first, second = nn.Linear(4, 4).double(), nn.Linear(4, 4).double()
    second.weight = first.weight
    model = nn.Sequential(first, nn.Tanh(), second, nn.Tanh(), nn.Linear(4, 2).double())
    with pytest.raises(DpgridError, match="model: 0 and 2 share a parameter"):
        make_engine(model, "classification", "fast")
    assert clipped_sum_moves(model, FuncEngine) <= 2.0 + 1e-9  # replace-one: at most 2 C


@pytest.mark.parametrize("engine", [FastEngine, FuncEngine])
def test_empty_batch_gives_zero_sums(engine):
    model = bag_of_words(2, 50)
    grads = engine(model, "classification")(torch.zeros(0, 100), torch.zeros(0, dtype=torch.long))
    assert grads.size == 0 and grads.norms.shape == (0,)
    assert all((t == 0).all() for t in grads.weighted_sum(torch.zeros(0)))


def test_evaluation_forward_does_not_record():
    model = small_cnn()
    engine = FastEngine(model, "classification")
    with torch.inference_mode():
        model(torch.rand(2, 1, 9, 9))
    grads = engine(torch.rand(2, 1, 9, 9), torch.tensor([0, 1]))
    assert grads.norms.shape == (2,)


@pytest.mark.parametrize("engine", [FastEngine, FuncEngine])
@pytest.mark.parametrize("clip_at", ["median", "all_clipped", "none_clipped"])
def test_weighted_sums_of_disjoint_and_overlapping_weights(engine, clip_at):
    """Online asks for sums over unclipped samples and of q_i (disjoint supports) in one call."""
    model, x, y, task, reference = float64_case("cnn", seed=2)
    norms = reference.norm(dim=1)
    clip = {"median": norms.median(), "all_clipped": norms.min() / 2, "none_clipped": norms.max() * 2}[clip_at]
    unclipped = (norms <= clip).double()
    q = (1 - unclipped) / norms
    grads = engine(model, task)(x, y)
    dense = torch.rand(len(x), dtype=torch.float64)
    for group in [(unclipped, q), (unclipped, q, dense)]:  # disjoint supports, then overlapping
        for weights, got in zip(group, grads.weighted_sums(*group)):
            flat = torch.cat([t.flatten() for t in got])
            if (weights == 0).all():
                assert flat.abs().max() == 0
            else:
                assert relative_error(flat, weights @ reference) < 1e-6


def test_unfolded_correlation_is_the_grouped_one_across_chunks():
    """The two ways of computing per-sample correlations agree (float64), with chunks that split the batch."""
    from dpgrid.training.rules.convolution import correlate_by_unfolding, correlate_per_sample

    torch.manual_seed(2)
    x, kernels = torch.randn(10, 3, 9, 8, dtype=torch.float64), torch.randn(10, 5, 7, 7, dtype=torch.float64)
    for padding in ((0, 0), (1, 2)):
        grouped = correlate_per_sample(x, kernels, padding).permute(1, 2, 0, 3, 4)
        assert torch.allclose(correlate_by_unfolding(x, kernels, padding, chunk=4), grouped, rtol=1e-12, atol=1e-12)


LAYERS = {"strided": lambda c: nn.Conv2d(c, 6, 3, stride=2, padding=1, dilation=2), "plain": lambda c: nn.Conv2d(c, 6, 4),
          "same": lambda c: nn.Conv2d(c, 6, 3, padding="same"), "transposed": lambda c: nn.ConvTranspose2d(c, 6, 3),
          "transposed_to_one": lambda c: nn.ConvTranspose2d(c, 1, 3),
          "grouped": lambda c: nn.Conv2d(c, 6, 3, stride=2, groups=c),
          "transposed_strided": lambda c: nn.ConvTranspose2d(c, 6, 3, stride=2, padding=1, output_padding=1, groups=c)}


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("layer", LAYERS)
def test_each_method_in_chunks_gives_each_samples_own_gradient(layer, channels):
    """Each way of computing a convolution's per-sample gradients that is offered for the layer, whole and in chunks
    that split the batch unevenly (10 samples in chunks of 4: the engine's tests run on batches smaller than the
    built-in chunks), is each sample's own gradient (float64, against autograd on each sample alone), with one input
    channel and with three."""
    torch.manual_seed(4)
    module = LAYERS[layer](channels).double()
    a = torch.randn(10, channels, 11, 11, dtype=torch.float64)
    g = torch.randn_like(module(a))
    own = torch.stack([torch.autograd.grad((module(a[i:i + 1]) * g[i:i + 1]).sum(), module.weight)[0]
                       for i in range(len(a))])
    methods = {"grouped": convolutions.grouped, "depthwise": convolutions.depthwise,
               "backward": convolutions.backward_weight_kernel}
    offered = {name.rstrip("0123456789") for name in applicable(module)} & set(methods)
    assert "backward" in offered
    for name in offered:
        per_sample = methods[name]
        for computed in (per_sample(module, a, g), convolutions.in_chunks(per_sample, 4)(module, a, g)):
            assert computed.shape == own.shape and torch.allclose(computed, own, rtol=1e-12, atol=1e-12), name


def test_the_method_choice_times_the_applicable_methods_once_per_shape_and_keeps_the_fastest(monkeypatch):
    calls = []
    monkeypatch.setattr(MethodChoice, "measure", staticmethod(lambda forms, device: calls.extend(forms) or
                        {name: {"grouped": 3.0, "unfold16": 1.0}.get(name, 2.0) for name in forms}))
    model = wide_convs().double()
    engine = FastEngine(model, "classification", MethodChoice("auto"))
    x, y = torch.rand(6, 2, 9, 9, dtype=torch.float64), torch.randint(0, 3, (6,))
    engine(x, y).weighted_sum(torch.ones(6, dtype=torch.float64))
    assert calls == []  # a sum asked before any norm needs no per-sample gradient
    engine(x, y).norms
    offered = 4 * (len(CONV_METHODS) - 1) + 1  # four layer shapes, every method each (depthwise: the 8 -> 1 layer's)
    assert len(calls) == offered and calls.count("depthwise64") == 1
    engine(x, y).norms
    assert len(calls) == offered  # measured once per shape
    assert engine.methods.summary() == "unfold16,unfold16,unfold16,unfold16"
    assert all(line.count(" ms") == len(CONV_METHODS) - 1 + ("ConvTranspose2d 8->1" in line)
               and "unfold16 (unfold16 1000.0 ms, grouped64 2000.0 ms" in line and "grouped 3000.0 ms" in line
               for line in engine.methods.describe())


def test_a_strided_convolution_is_given_only_the_methods_that_compute_it():
    assert applicable(nn.Conv2d(2, 3, 3, stride=2)) == ["grouped", "grouped64", "backward32", "backward128"]
    assert applicable(nn.Conv2d(2, 3, 3, dilation=2)) == ["grouped", "grouped64", "backward32", "backward128"]
    assert applicable(nn.Conv2d(1, 3, 3, stride=2)) == ["grouped", "grouped64", "depthwise64", "backward32",
                                                        "backward128"]
    everything_but_depthwise = [name for name in CONV_METHODS if name != "depthwise64"]
    assert applicable(nn.Conv2d(2, 3, 3, padding="same")) == everything_but_depthwise
    assert applicable(nn.Conv2d(2, 3, 3, padding=1)) == everything_but_depthwise
    assert applicable(nn.Conv2d(1, 3, 3, padding=1)) == applicable(nn.ConvTranspose2d(3, 1, 3)) == list(CONV_METHODS)
    assert applicable(nn.ConvTranspose2d(1, 3, 3)) == everything_but_depthwise
    wide = nn.Conv2d(1, 64, 3)  # 64 large single-channel images, copied once per kernel: 1 GiB; unfolded: 150 MiB
    assert applicable(wide, torch.empty(2, 1, 256, 256), torch.empty(2, 64, 254, 254)) == [
        "grouped", "grouped64", "backward32", "backward128", "unfold16", "unfold64"]
    assert applicable(wide, torch.empty(2, 1, 28, 28), torch.empty(2, 64, 26, 26)) == list(CONV_METHODS)
    deep = nn.Conv2d(64, 64, 3)  # unfolded in chunks of 16: 2.3 GiB; of 64: 9 GiB
    assert applicable(deep, torch.empty(2, 64, 224, 224), torch.empty(2, 64, 222, 222)) == [
        "grouped", "grouped64", "backward32", "backward128"]
    forced = MethodChoice("unfold64")  # not offered for this layer: its first form, measured nothing
    assert forced.pick("key", "a strided layer", {"grouped": lambda: "grouped's", "backward32": lambda: 0}) == "grouped's"
    assert forced.describe() == ["a strided layer: grouped (train.per_sample_method)"]
    assert applicable(nn.Conv2d(2, 4, 3, groups=2)) == ["backward32", "backward128"]
    assert applicable(nn.ConvTranspose2d(2, 3, 3, stride=2)) == ["backward32", "backward128"]


def test_the_config_offers_the_forms_the_rules_have():
    """train.per_sample_method names every form a rule offers: the convolutions' methods and Linear's two."""
    from dpgrid.config.checks import PER_SAMPLE_METHODS
    from dpgrid.training.rules import linear

    assert set(PER_SAMPLE_METHODS) == set(CONV_METHODS) | {"ghost", "per_sample"}
    for form in ("ghost", "per_sample"):  # each forces a Linear layer on sequences
        choice, layer = MethodChoice(form), nn.Linear(4, 3)
        linear.LinearRule(layer, torch.randn(5, 6, 4), torch.randn(5, 6, 3), choice, ("weight", "bias")).sq_norms()
        assert choice.summary() == form


def test_the_old_key_of_the_per_sample_method_sets_the_new_one_with_a_warning():
    from dpgrid.api import compose

    with pytest.warns(UserWarning, match=r"train.conv_method is now train.per_sample_method \(it chooses the "
                                         r"per-sample form of every layer"):
        cfg = compose(["train.conv_method=grouped"])
    assert cfg.train.per_sample_method == "grouped" and "conv_method" not in cfg.train
    from dpgrid.config import compile

    with pytest.raises(DpgridError, match="train.per_sample_method"), pytest.warns(UserWarning):
        compile(compose(["train.conv_method=nonsense"]), plan=False)


@pytest.mark.parametrize("case", ["cnn", "autoencoder", "strided_conv", "wide_convs", "same_padding"])
def test_a_weighted_sum_asked_before_any_norm_is_exact_without_per_sample_gradients(case):
    """The non-private baseline's mean: the convolutions' ordinary weight gradients of the weighted output
    gradients, never their per-sample ones."""
    model, x, y, task, reference = float64_case(case)
    grads = FastEngine(model, task)(x, y)
    w = torch.rand(len(x), dtype=torch.float64)
    flat = torch.cat([t.flatten() for t in grads.weighted_sum(w)])
    assert relative_error(flat, w @ reference) < 1e-6
