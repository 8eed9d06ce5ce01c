"""The CUDA path, where a GPU is present (each test is skipped, cleanly, where none is): the device's own generator
gives each run its stream whether it trains alone or stacked, nothing on the hot path of one run or of a stacked
group waits for the host (torch's sync debug mode turns any wait into an error), the group size follows the
device's free memory, secure mode draws on the device, and a grid records its device and refuses another one."""

import json

import pytest
import torch

from dpgrid.config import compile

from .command import dpgrid, one_line
from .conftest import load_cfg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
SMALL = {"train.device": "cuda", "grid.k": 2, "train.seeds": 2, "train.epochs": 1, "train.eval_every": 4}


def spec_of(strategy="online", **overrides):
    return compile(load_cfg("digits", strategy, **{**SMALL, **overrides}))


def steps_without_a_host_wait(spec, group: bool) -> None:
    """A few steps of one run (or of a stacked group of four) under torch.cuda.set_sync_debug_mode("error"), after a
    first step that may wait (the per-sample methods are measured then, the lazy CUDA state made)."""
    from dpgrid.data import load
    from dpgrid.privacy.randomness import poisson_batch
    from dpgrid.runner import build_strategy, initial_model, sources
    from dpgrid.training.persample import make_engine
    from dpgrid.training.stacked import StackedEngine, StackedModel

    data = load(spec.dataset, spec.data_root, "cuda")
    config = spec.plan.configurations[0]
    runs = [(config, s) for s in range(4 if group else 1)]
    models = [initial_model(spec, s, "cuda") for _, s in runs]
    samplers, noises = zip(*(sources(spec, c, s, "cuda") for c, s in runs))
    if group:
        stack = StackedModel(models)
        hp = {k: tuple(c[k] for c, _ in runs) for k in config if k != "config_id"}
        strategy = build_strategy(spec, stack.params, hp, list(noises))
        engine = StackedEngine(stack, data.task)
    else:
        strategy = build_strategy(spec, models[0].parameters(), config, noises[0])
        engine = make_engine(models[0], data.task, spec.train.engine)

    def step():  # as the training loop takes it: one batch per run, handed to the engine
        strategy.step(engine.gradients(data, [poisson_batch(data.n_train, spec.plan.sample_rate, s) for s in samplers]))
    without_a_host_wait(step)


def without_a_host_wait(step) -> None:
    """`step` once, then three times under torch.cuda.set_sync_debug_mode("error") (any wait for the device raises)."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


@pytest.mark.parametrize("strategy", ["fixed_threshold", "online", "fixed_quantile", "adamwosm", "dpadam"])
@pytest.mark.parametrize("group", [False, True], ids=["one run", "stacked group"])
def test_no_host_synchronisation_per_step(strategy, group):
    steps_without_a_host_wait(spec_of(strategy), group)


@pytest.mark.parametrize("name", ["transformer", "vit"])
def test_the_transformers_step_without_a_host_wait(name):
    """The layer rules (Linear on sequences, Embedding, LayerNorm) ask nothing of the host on CUDA: no dead positions
    or shared rows looked for there."""
    from dpgrid.training.persample import make_engine
    from dpgrid.models.transformers import transformer, vit

    g = torch.Generator().manual_seed(0)
    if name == "transformer":
        model, x = transformer(vocabulary=50, max_tokens=8), torch.randint(1, 52, (16, 8), generator=g)
        x[:, -2:] = 0  # padding at the end, which a CPU would drop
    else:
        model, x = vit(), torch.rand((16, 1, 28, 28), generator=g)
    model, x, y = model.cuda(), x.cuda(), torch.randint(0, 4, (16,), generator=g).cuda()
    engine = make_engine(model, "classification")

    def step():
        grads = engine(x, y)
        grads.weighted_sum(torch.clamp(1.0 / grads.norms, max=1.0))
    without_a_host_wait(step)


def test_secure_mode_draws_without_a_host_wait():
    steps_without_a_host_wait(spec_of("fixed_threshold", **{"privacy.secure_rng": True}), group=False)


def test_a_stacked_group_on_cuda_matches_its_runs_trained_alone(tmp_path):
    """float64 on the device: each run's stream from its own CUDA generator, whichever group it trains in."""
    import pandas as pd

    from dpgrid.runner import train

    for name, setting in (("alone", "1"), ("stacked", "4")):
        train(spec_of("online", **{"train.float64": True, "train.parallel_runs": setting}), tmp_path / name,
                 progress=False)
    a, b = (pd.read_csv(tmp_path / n / "curves.csv").sort_values(["config_id", "seed", "step"]) for n in ("alone",
                                                                                                         "stacked"))
    assert len(a) == len(b)
    for column in ("value", "test_loss", "clip", "lr"):
        assert b[column].tolist() == pytest.approx(a[column].tolist(), rel=1e-9), column


def test_the_group_size_follows_the_devices_free_memory():
    from dpgrid.models import build_model
    from dpgrid.training.stacked import available_memory, bytes_per_run, group_size, per_sample_sizes

    from .conftest import strategy_class

    mlp = build_model(load_cfg("digits", "online").model).cuda()
    size, why = group_size("auto", mlp, strategy_class("online"), 35, 128, torch.device("cuda"))
    per_run = bytes_per_run(mlp, 128, per_sample_sizes(mlp)[1])
    assert why == "" and size == min(35, 64, available_memory(torch.device("cuda")) // 4 // per_run)
    assert available_memory(torch.device("cuda")) == torch.cuda.mem_get_info()[0]


def test_a_grid_records_its_device_and_refuses_another_on_a_resume(tmp_path):
    out = tmp_path / "grid"
    args = ["strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=1", f"hydra.run.dir={out}"]
    assert dpgrid("run", *args, "train.device=cuda").returncode == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["device"].startswith("cuda")
    r = dpgrid("run", *args, "train.device=cpu")
    assert r.returncode == 2 and one_line(r.stderr) and "train.device is cuda" in r.stderr, r.stderr


def test_tf32_is_off_while_a_grid_trains_and_restored_after():
    from dpgrid.training.threads import exact_cuda

    torch.backends.cudnn.allow_tf32 = True
    with exact_cuda():
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.deterministic
    assert torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_the_engines_prove_themselves_on_cuda(model):
    """The first batch's proof runs where the grid trains: on CUDA the fast engine (and the stacked one) is proved and
    kept, never set aside because the proof itself mixed devices."""
    import warnings

    from dpgrid.models import build_model
    from dpgrid.training.choice import choose_engine

    device = torch.device("cuda")
    if model == "mlp":
        net, x = build_model(load_cfg("digits", "online").model), torch.rand((16, 64))
    else:
        net, x = build_model(load_cfg("mnist", "online").model), torch.rand((16, 1, 28, 28))
    y = torch.randint(0, 10, (16,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = choose_engine(net.to(device), "classification", x.to(device), y.to(device), "auto", True, "auto")
    assert chosen.name == "fast" and chosen.stacks, chosen.said


def test_a_graph_replays_the_noise_an_uncaptured_step_draws():
    """Graph-safe generators: a run's CUDA generator registered with a graph gives, replay after replay and between
    uncaptured draws, the very numbers the same seed gives uncaptured (the noise a seeded run publishes is its own)."""
    shape = (1000,)
    plain = torch.Generator(device="cuda").manual_seed(7)
    expected = [torch.randn(shape, generator=plain, device="cuda") for _ in range(5)]

    graphed = torch.Generator(device="cuda").manual_seed(7)
    out = torch.empty(shape, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = torch.randn(shape, generator=graphed, device="cuda")  # uncaptured, as a capacity's first step
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(graphed)
        with torch.cuda.graph(graph, stream=side):
            torch.randn(shape, generator=graphed, out=out)
    torch.cuda.current_stream().wait_stream(side)
    drawn = [first]
    for _ in range(2):
        graph.replay()
        drawn.append(out.clone())
    drawn.append(torch.randn(shape, generator=graphed, device="cuda"))  # uncaptured again, between replays
    graph.replay()
    drawn.append(out.clone())
    for step, (a, b) in enumerate(zip(expected, drawn)):
        assert torch.equal(a, b), f"draw {step + 1} differs"


@pytest.mark.parametrize("strategy", ["online", "fixed_quantile", "fixed_threshold", "adamwosm", "dpadam", "nodp"])
@pytest.mark.parametrize("group", [False, True], ids=["one run", "stacked group"])
def test_cuda_graphs_change_no_number_a_seeded_run_gives(strategy, group, monkeypatch):
    """train.cuda_graphs=true (captured and replayed) and false (launched) train the same runs to the same curves on
    the same device, in float64, one run and a stacked group; the captured runs did replay graphs (a capacity met twice
    is captured once), and their steps ask nothing of the host."""
    from dpgrid.data import load
    from dpgrid.runner import train_together
    from dpgrid.testing import same_numbers
    from dpgrid.training import graphs

    captures = []
    capture = graphs.Steps.capture
    monkeypatch.setattr(graphs.Steps, "capture", lambda self, rows, mask: captures.append(rows.shape[1]) or
                        capture(self, rows, mask))
    curves = {}
    for setting in (False, True):
        spec = spec_of(strategy, **{"train.float64": True, "train.epochs": 3, "train.cuda_graphs": setting})
        data = load(spec.dataset, spec.data_root, "cuda").in_float64()
        runs = [(c, s) for c in spec.plan.configurations for s in range(spec.plan.seeds)]
        curves[setting] = (train_together(spec, data, runs) if group else
                           [train_together(spec, data, [run])[0] for run in runs])
    assert same_numbers(runs, curves[False], curves[True], "launched", "captured", 1e-9) > 20
    assert captures, "no step was captured"
    if group:  # one loop: each capacity captured once, then replayed
        assert len(set(captures)) == len(captures), captures


def test_captured_steps_ask_nothing_of_the_host():
    """Once each capacity met is captured, a replayed step neither waits for the device nor launches a kernel by kernel
    (torch's sync debug mode turns a wait into an error)."""
    from dpgrid.data import load
    from dpgrid.runner import build_strategy, initial_model, sources
    from dpgrid.training.graphs import Steps, how_steps_run
    from dpgrid.training.persample import make_engine
    from dpgrid.training.train import batches

    spec = spec_of("online")
    data = load(spec.dataset, spec.data_root, "cuda")
    config = spec.plan.configurations[0]
    model = initial_model(spec, 0, "cuda")
    sampler, noise = sources(spec, config, 0, "cuda")
    strategy = build_strategy(spec, model.parameters(), config, noise)
    engine = make_engine(model, data.task, spec.train.engine)
    pad, captured, why = how_steps_run("cuda", engine, strategy, "poisson", None, True)
    assert pad and captured and why == "", why
    fixed = [torch.arange(spec.train.batch_size)] * 8  # one capacity: launched, captured, then replayed
    steps = Steps(engine, strategy, data, [iter(fixed)], pad, captured)
    steps(1)
    steps(2)
    assert len(steps.graphs) == 1
    without_a_host_wait(lambda: steps(3))
