"""Steps as a CUDA graph replays them (train.cuda_graphs, dpgrid.training.graphs), checked on the CPU: Poisson batches
padded to a few capacities, a padded row that changes nothing, state kept at fixed addresses, and nothing padded or
captured on a CPU. The capture itself is checked on CUDA (tests/test_cuda.py)."""

import math

import numpy
import pytest
import torch
from torch import nn

from dpgrid.models import cnn, mlp
from dpgrid.strategies import FixedThreshold
from dpgrid.training.graphs import MAX_GRAPHS, StateBinding, capacity, how_steps_run, padded_rows, quantum
from dpgrid.training.persample import FastEngine
from dpgrid.training.stacked import StackedEngine, StackedModel

from .conftest import fast_layer_runs

CAPTURING = ["online", "fixed_threshold", "fixed_quantile", "adamwosm", "dpadam", "nodp"]


@pytest.mark.parametrize("batch_size", [1, 64, 256, 1000, 4096])
def test_a_batch_is_padded_to_one_of_a_few_capacities(batch_size):
    """Every realised size b is padded to the next multiple of the quantum (at least one quantum), never shorter
    than b and less than a quantum longer; over 2,000 Poisson draws (seeded) the batches meet few capacities, so few
    graphs are captured: the quantum is at least sqrt(B), the size's standard deviation at most, so the draws within
    5 deviations of B (all but a chance of 1e-3 in 2,000) meet at most 11. The padding costs about half a quantum, a
    few per cent of B."""
    step = quantum(batch_size)
    assert step >= 8 and step & (step - 1) == 0 and step >= math.sqrt(batch_size)
    for size in range(0, 3 * batch_size + 20):
        padded = capacity(size, batch_size)
        assert padded % step == 0 and max(size, 1) <= padded < max(size, 1) + step
    n = 60_000
    sizes = numpy.random.default_rng(batch_size).binomial(n, batch_size / n, 2000).tolist()
    met = {capacity(b, batch_size) for b in sizes}
    assert len(met) <= 11 <= MAX_GRAPHS
    padding = sum(capacity(b, batch_size) - b for b in sizes) / len(sizes)
    assert padding <= step and padding / batch_size <= max(0.07, 8 / batch_size)


def padded_engine_pair(model_fn, x, y, task, stacked=False):
    """The engine's gradients of (x, y) as drawn, and of the same rows padded by five (rows of x, masked)."""
    torch.manual_seed(0)
    model = model_fn().double()
    rows = torch.arange(len(x))
    padded_idx, mask = padded_rows([rows], len(x) + 5, torch.float64)
    if stacked:
        engine = StackedEngine(StackedModel([model]), task)
        x3, y3 = x[None], y[None]
        return engine(x3, y3, torch.ones(1, len(x), dtype=torch.float64)), engine(x[padded_idx], y[padded_idx], mask)
    engine = FastEngine(model, task)
    return engine(x, y), engine(x[padded_idx[0]], y[padded_idx[0]], mask[0])


@pytest.mark.parametrize("model, stacked", [("mlp", False), ("cnn", False), ("mlp", True), ("cnn", True)])
def test_a_padded_row_adds_nothing(model, stacked):
    """A padded row (mask 0) has norm inf, in every group, so it is in no weighted sum (clip weights min(1, C/inf) = 0,
    online's 1[inf > C]/inf = 0) and in no count (in_batch, mean_weights): the real rows' norms and every sum are
    those of the batch as drawn, one run and a stacked group, a Linear and a convolutional model."""
    torch.manual_seed(1)
    if model == "mlp":
        x, y, fn = torch.rand(11, 64, dtype=torch.float64), torch.randint(0, 10, (11,)), mlp
    else:
        x, y, fn = torch.rand(11, 1, 28, 28, dtype=torch.float64), torch.randint(0, 10, (11,)), cnn
    drawn, padded = padded_engine_pair(fn, x, y, "classification", stacked)
    real = (..., slice(0, 11))
    assert torch.allclose(padded.norms[real], drawn.norms[real], rtol=1e-10)
    assert torch.isinf(padded.norms[..., 11:]).all() and torch.isinf(padded.group_norms[..., 11:, :]).all()
    assert torch.allclose(padded.group_norms[..., :11, :], drawn.group_norms, rtol=1e-10)
    clip = drawn.norms.median()
    for w_drawn, w_padded in [(torch.clamp(clip / drawn.norms, max=1.0), torch.clamp(clip / padded.norms, max=1.0)),
                              ((drawn.norms > clip) / drawn.norms, (padded.norms > clip) / padded.norms)]:
        for a, b in zip(drawn.weighted_sum(w_drawn), padded.weighted_sum(w_padded)):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
    assert float(padded.in_batch().sum()) == 11
    for a, b in zip(drawn.weighted_sum(drawn.mean_weights()), padded.weighted_sum(padded.mean_weights())):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("strategy", fast_layer_runs(CAPTURING, "fixed_quantile"))
def test_every_capturing_strategy_gets_its_numbers_on_padded_batches(strategy):
    """Each built-in strategy that says `captures = True` trains a small grid (float64) to the same curves on its
    batches as drawn and padded to capacities, one run at a time and as a stacked group: what CUDA graphs replay."""
    from dpgrid.testing import check_padded

    assert check_padded(strategy) > 100


def test_check_padded_catches_a_step_that_counts_padded_rows(tmp_path, monkeypatch):
    """fixed_quantile's count written without the mask (sum_i (1[n_i <= C] - 1/2) over every row it is handed) counts
    each padded row as -1/2: the helper names the first value that differs."""
    from dpgrid.testing import check_padded

    (tmp_path / "unmasked.py").write_text(
        "import torch\nfrom dpgrid.strategies import FixedQuantile\n\n\nclass Unmasked(FixedQuantile):\n"
        "    captures = True\n\n    def step(self, grads):\n"
        "        clipped_sum = grads.weighted_sum(self.clip_weights(grads.norms))\n"
        "        g_tilde = self.noisy_mean(clipped_sum, self.noise.queries['noise_multiplier_grad'] * self.clip)\n"
        "        below = (grads.norms <= self.per_run(self.clip, grads.norms)).to(self.clip.dtype)\n"
        "        b_tilde = self.noisy_mean([(below - 0.5).sum(-1)], self.noise.queries['count_noise_std'])[0] + 0.5\n"
        "        self.descend(g_tilde, self.lr)\n"
        "        self.clip = self.clip * torch.exp(-self.clip_lr * (b_tilde - self.quantile))\n")
    conf = tmp_path / "conf" / "strategy"
    conf.mkdir(parents=True)
    (conf / "unmasked.yaml").write_text("defaults:\n  - fixed_quantile\n  - _self_\n_target_: unmasked.Unmasked\n"
                                        "name: unmasked\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AssertionError, match="as drawn, .* padded"):
        check_padded("unmasked", f"hydra.searchpath=[file://{tmp_path / 'conf'}]")


def test_nothing_is_padded_or_captured_where_a_graph_cannot_serve():
    """On a CPU the steps are launched as before (capture costs nothing there); on CUDA a strategy that does not say
    `captures = True` (a subclass that writes its own step does not inherit it), shuffled batches, a watched run, an engine without padded batches or noise drawn on the CPU
    (secure mode) is not padded either, each for its one-line reason; train.cuda_graphs=false pads (the same numbers)
    but does not capture."""
    model = mlp()
    engine = FastEngine(model, "classification")
    cuda_noise = torch.Generator()  # a CPU generator: the CUDA case below is refused for its noise source

    def strategy(cls=FixedThreshold, generator=cuda_noise):
        return cls(model.parameters(), hp={"lr": 0.1, "clip": 1.0}, batch_size=8, options={}, generator=generator,
                   noise=None)

    assert how_steps_run("cpu", engine, strategy(), "poisson", None, True) == (False, False, "not on CUDA")
    assert how_steps_run("cpu", engine, strategy(), "poisson", None, True, padded=True)[:2] == (True, False)

    class Plain(FixedThreshold):
        captures = False

    class Scheduled(FixedThreshold):  # reads t on the host: a graph would replay the first t it saw
        def step(self, grads):
            self.clip = self.clip * (1 - self.progress.step / 100)
            super().step(grads)

    for why, args in [("Plain does not say `captures = True`", (strategy(Plain), "poisson", None)),
                      ("Scheduled does not say `captures = True`", (strategy(Scheduled), "poisson", None)),
                      ("train.sampling is not poisson", (strategy(), "shuffle", None)),
                      ("an observed run's step is watched", (strategy(), "poisson", object())),
                      ("privacy.secure_rng draws it on the CPU", (strategy(), "poisson", None))]:
        pad, captured, said = how_steps_run("cuda", engine, args[0], args[1], args[2], True)
        assert (pad, captured) == (False, False) and why in said
    from dpgrid.training.persample import FuncEngine

    pad, captured, said = how_steps_run("cuda", FuncEngine(model, "classification"), strategy(), "poisson", None, True)
    assert (pad, captured) == (False, False) and "FuncEngine takes no padded batch" in said


class Rebinding:
    """A strategy's state as steps leave it: a tensor rebound, a list rebound, a list changed in place."""

    def __init__(self):
        self.clip, self.prev, self.velocity, self.name = torch.tensor(1.0), [torch.zeros(3)], [torch.zeros(2)], "x"
        self.moments = {"m": torch.zeros(2)}

    def step(self):
        self.clip = self.clip * 2
        self.prev = [self.prev[0] + 1]
        self.velocity[0].add_(1)
        self.moments = {"m": self.moments["m"] - 1}


def test_state_a_step_rebinds_is_copied_back_to_where_the_graph_reads_it():
    """After each step the strategy's attributes are the tensors held after the first step (a graph reads those), with
    the values the step computed; a list of another length, or state first made in a captured step, is refused."""
    strategy = Rebinding()
    strategy.step()
    binding = StateBinding(strategy)
    held = strategy.clip, strategy.prev, strategy.prev[0], strategy.velocity, strategy.moments, strategy.moments["m"]
    for expected in (4.0, 8.0, 16.0):
        strategy.step()
        binding.restore()
        assert all(a is b for a, b in zip((strategy.clip, strategy.prev, strategy.prev[0], strategy.velocity,
                                           strategy.moments, strategy.moments["m"]), held))
        assert float(strategy.clip) == expected
    assert strategy.prev[0].tolist() == [4.0] * 3 and strategy.velocity[0].tolist() == [4.0] * 2
    assert strategy.moments["m"].tolist() == [-4.0] * 2
    strategy.prev = [torch.zeros(3), torch.zeros(3)]
    with pytest.raises(RuntimeError, match="changed its shape"):
        binding.restore()
    strategy = Rebinding()
    strategy.step()
    binding = StateBinding(strategy)
    strategy.later = torch.zeros(1)
    with pytest.raises(RuntimeError, match="first appeared in a captured step"):
        binding.restore(capturing=True)
    binding.restore()
    assert "later" in binding.held


def test_a_tiny_module_pads_through_the_training_loop():
    """The loop's padded path (forced on the CPU) takes every step through engine.padded and trains the same run as
    the plain path: one run of fixed_threshold on a one-layer model, step for step."""
    from dpgrid.training.graphs import Steps

    torch.manual_seed(0)
    x, y = torch.rand(200, 5, dtype=torch.float64), torch.randint(0, 3, (200,))

    class Data:
        x_train, y_train, n_train = x, y, 200

    def trained(padded):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 3)).double()
        engine = FastEngine(model, "classification")
        calls = []
        engine.padded = (lambda original: lambda *a: calls.append(len(a[1][0])) or original(*a))(engine.padded)
        strategy = FixedThreshold(model.parameters(), hp={"lr": 0.5, "clip": 0.1}, batch_size=20, options={},
                                  generator=torch.Generator().manual_seed(3), noise=_noise())
        sampler = iter([torch.randperm(200, generator=torch.Generator().manual_seed(s))[:17 + s % 5] for s in range(6)])
        steps = Steps(engine, strategy, Data, [sampler], padded=padded)
        for step in range(1, 7):
            steps(step)
        return [p.detach().clone() for p in model.parameters()], calls

    plain, no_calls = trained(False)
    padded, calls = trained(True)
    assert no_calls == [] and calls and all(c % quantum(20) == 0 for c in calls)
    for a, b in zip(plain, padded):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)


def _noise():
    from dpgrid.strategies.base import Noise

    return Noise(noise_multiplier=1.0)


def test_a_capacity_is_launched_first_captured_second_and_replayed_after(monkeypatch):
    """The schedule of a captured loop, its CUDA calls stubbed (the capture itself is tests/test_cuda.py's): a
    capacity's first step is launched (it measures the per-sample forms and makes the lazy state), its second captured
    and replayed, later ones replayed with the batch copied into the graph's buffers; beyond MAX_GRAPHS capacities the
    rest are launched."""
    import contextlib

    from dpgrid.training import graphs

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(graphs.torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(graphs.torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(graphs.torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(graphs.torch.Tensor, "pin_memory", lambda self: self)
    said = []

    class Graph:
        def __init__(self, size):
            self.size = size

        def replay(self):
            said.append(("replay", self.size))

    def capture(rows, mask):
        said.append(("capture", rows.shape[1]))
        return graphs.Captured(Graph(rows.shape[1]), rows.clone(), mask.clone())

    class Data:
        x_train = torch.zeros(400, 2)

    sizes = [30, 31, 29, 50, 32, 49, 70]  # capacities (quantum 8 at B = 32): 32, 32, 32, 56, 32, 56, 72
    strategy = type("S", (), {"batch_size": 32})()
    steps = graphs.Steps(None, strategy, Data, [iter([torch.arange(n) for n in sizes])], padded=True, captured=True)
    monkeypatch.setattr(steps, "launch", lambda rows, mask: said.append(("launch", rows.shape[1])))
    monkeypatch.setattr(steps, "capture", capture)
    for step in range(1, len(sizes) + 1):
        steps(step)
    assert said == [("launch", 32), ("capture", 32), ("replay", 32), ("replay", 32), ("launch", 56), ("replay", 32),
                    ("capture", 56), ("replay", 56), ("launch", 72)]
    assert steps.graphs[32].rows[0, :32].tolist() == list(range(32))  # the last batch of that capacity, copied in
    assert steps.graphs[32].mask[0].sum() == 32

    said.clear()
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 1)
    steps = graphs.Steps(None, strategy, Data, [iter([torch.arange(n) for n in [30, 30, 50, 50, 50]])], padded=True,
                         captured=True)
    monkeypatch.setattr(steps, "launch", lambda rows, mask: said.append(("launch", rows.shape[1])))
    monkeypatch.setattr(steps, "capture", capture)
    for step in range(1, 6):
        steps(step)
    assert said == [("launch", 32), ("capture", 32), ("replay", 32), ("launch", 56), ("launch", 56), ("launch", 56)]
