"""Private step vs non-private step, measured in one process, interleaved (so that a shared, noisy machine slows both alike).

For each model at batch 512 (the paper's three, the text transformer and the ViT): the non-private SGD step; each
strategy's step exactly as `dpgrid run` executes it (engine + strategy.step); and Opacus's GradSampleModule (hooks)
with its DPOptimizer (per-sample clipping and noise) as the outside baseline, timed after the others, alone (its B x P
per-sample gradients, 230 MB to 1.1 GB at B = 512, would evict the data of whatever step ran next); on the
transformers also Opacus's ghost clipping, and fixed_threshold on the torch.func engine (what they trained at before
their layers had rules). Median of --steps timed steps after warm-up; peak memory of each step in a fresh
subprocess (ru_maxrss above the set-up).

    python scripts/bench.py [--steps 7] [--models cnn autoencoder bag_of_words transformer vit] [--json]
    python scripts/bench.py --secure --no-opacus --strategies fixed_threshold   # the cost of secure mode
    python scripts/bench.py --grid [--models mlp bag_of_words cnn] [--parallel-runs auto] [--json]  # whole grids
    python scripts/bench.py --grid --side-by-side 2 [--models mlp cnn]  # two grids' processes at once on one device
    python scripts/bench.py --trackers [--repeats 5] [--record]  # the default job with and without each tracker
    python scripts/bench.py --profile autoencoder online [--device cuda] [--json]  # where its extra time goes, by region
    python scripts/bench.py --device cuda --cuda-graphs --check benchmarks/steps_cuda_h100_captured.json  # a GPU record
    python scripts/bench.py --scattering [--data-root DATA] [--record]  # the scattering features: time and memory
    PYTHONPATH=examples python scripts/bench.py --searchpath file://$PWD/examples/dpgrid_example/conf \
        --strategies fixed_threshold per_layer --no-opacus       # a plugin's strategies, from its config folder

--secure adds three steps per model that sample their batch from a training set of the paper's size
(MNIST 60,000; AG News 120,000) as `dpgrid run` does: seeded sampling and noise (the default),
secure sampling only, and secure sampling and noise (privacy.secure_rng=true).
"""

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import replace

import torch

import dpgrid
from dpgrid import strategies
from dpgrid.config.checks import PER_SAMPLE_METHODS
from dpgrid.config.groups import options
from dpgrid.models import autoencoder, bag_of_words, cnn
from dpgrid.models.transformers import transformer, vit
from dpgrid.training.graphs import says_captures
from dpgrid.training.rules import MethodChoice
from dpgrid.training.persample import PerSampleGrads, make_engine, per_sample_losses
from dpgrid.runner import build_strategy
from dpgrid.training.threads import keep_freed_memory

# each model with its input shape, task, classes and the dataset it trains on: the paper's, and the transformers
# (token ids of 32 tokens over 20,000 words; 28 x 28 images)
MODELS = {"cnn": (cnn, (1, 28, 28), "classification", 10, "mnist"),
          "autoencoder": (autoencoder, (1, 28, 28), "reconstruction", 0, "fashion_mnist"),
          "bag_of_words": (bag_of_words, (750,), "classification", 4, "ag_news"),
          "transformer": (transformer, (32,), "classification", 4, "ag_news_tokens"),
          "vit": (vit, (1, 28, 28), "classification", 10, "mnist")}
TOKENS = 20002  # the transformer's ids: 0 (padding), 1 (other words) and 20,000 words
BATCH = 512
# the largest private step / non-private step ratio each model's strategies should keep (on a 2-core CPU)
# the largest ratio to the non-private step each model's private steps should keep (2-core CPU, 2 threads)
STEP_TARGETS = {"cnn": 1.2, "bag_of_words": 1.2, "autoencoder": 1.3, "transformer": 1.3, "vit": 1.3}
NOISE = 1.0
# on a GPU, the largest ratio of a private step captured as a CUDA graph to the non-private step captured alike
CAPTURED_TARGET = 1.25


def searchpath() -> list:
    """The override adding --searchpath's config folder (kept in the environment, for the memory subprocesses)."""
    folder = os.environ.get("DPGRID_BENCH_SEARCHPATH")
    return [f"hydra.searchpath=[{folder}]"] if folder else []


def dp_sgd_strategies() -> list:
    """The DP-SGD strategies of the config group (and of --searchpath's folder): those accounted by composition
    (the noise schedules train logistic regression full-batch)."""
    names = sorted({*options("strategy"), *plugin_options("strategy")})
    return [name for name in names if strategy_class(name).accounting == "composition"]


def strategy_class(name: str):
    return strategies.resolve(dpgrid.compose([f"strategy={name}", *searchpath()]).strategy)


def nonprivate_strategies() -> list:
    """The config group's non-private baselines: with --cuda-graphs, the non-private step captured as dpgrid takes it."""
    return [name for name in sorted(options("strategy")) if not strategy_class(name).private]


def plugin_options(group: str) -> list:
    folder = os.environ.get("DPGRID_BENCH_SEARCHPATH", "")
    path = folder[len("file://"):] if folder.startswith("file://") else None
    return sorted(p.stem for p in __import__("pathlib").Path(path, group).glob("*.yaml")) if path else []


DEVICE = torch.device(os.environ.get("DPGRID_BENCH_DEVICE", "cpu"))  # --device: where every step runs


def synchronize():
    """Wait for the device's queue (CUDA runs asynchronously: a timing must include the work it queued)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def inputs(model_name, n: int, g):
    """n inputs of the model: uniform pixels or features, or token ids (each text's last quarter padding)."""
    shape = MODELS[model_name][1]
    if model_name != "transformer":
        return torch.rand((n, *shape), generator=g)
    ids = torch.randint(1, TOKENS, (n, *shape), generator=g)
    ids[:, -shape[0] // 4:] = 0
    return ids


def batch(model_name):
    build, shape, task, classes, _ = MODELS[model_name]
    g = torch.Generator().manual_seed(0)
    x = inputs(model_name, BATCH, g)
    y = x if task == "reconstruction" else torch.randint(0, classes, (BATCH,), generator=g)
    return x.to(DEVICE), y.to(DEVICE), task


def nonprivate_step(model_name):
    model = MODELS[model_name][0]().to(DEVICE)
    x, y, task = batch(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        per_sample_losses(model(x), y, task).mean().backward()
        opt.step()
    return step


# as `dpgrid run` trains: glibc keeps freed memory for reuse (--default-malloc: glibc's defaults); every contender alike
if "--default-malloc" in sys.argv:  # the memory subprocesses read it from the environment
    os.environ["DPGRID_BENCH_MALLOC"] = "default"
ALLOCATOR = ("glibc defaults (--default-malloc)" if os.environ.get("DPGRID_BENCH_MALLOC") == "default"
             else keep_freed_memory() or "the allocator's defaults")
METHODS = MethodChoice(os.environ.get("DPGRID_BENCH_PER_SAMPLE_METHOD", "auto"))  # one choice for every step, as a grid


def strategy_step(model_name, strategy, engine_name, graph: bool = False, replay: bool = True):
    """The strategy's step exactly as `dpgrid run` builds it: the compiled grid of this strategy on the model's
    dataset (its protocol's momentum, its plan's multipliers), a configuration in the middle of its grid, the
    layers' per-sample forms chosen by measurement (or --per-sample-method). `graph` (CUDA): as `dpgrid run` takes it
    there, the batch padded to its capacity (B = 512 is one) and the step replayed as a CUDA graph
    (dpgrid.training.graphs; the first two steps launch it, then capture it); with `replay` False the kernels such a
    graph holds, launched one by one (what a profiler can attribute). The step's `model` is the model it trains."""
    model = MODELS[model_name][0]().to(DEVICE)
    x, y, task = batch(model_name)
    spec = dpgrid.compile(dpgrid.compose([f"dataset={MODELS[model_name][4]}", f"strategy={strategy}",
                                          f"model={model_name}", f"train.batch_size={BATCH}", *searchpath()]))
    configs = spec.plan.configurations
    s = build_strategy(spec, model.parameters(), configs[len(configs) // 2],
                       torch.Generator(device=DEVICE).manual_seed(0))
    engine = make_engine(model, task, engine_name, METHODS)
    if not graph:
        def step():
            s.step(engine(x, y))
        step.model = model
        return step
    import itertools

    from dpgrid.data import Data
    from dpgrid.training.graphs import Steps, how_steps_run

    padded, captured, why = how_steps_run(DEVICE, engine, s, "poisson", None, True)
    if not captured:
        raise SystemExit(f"--cuda-graphs: {strategy}'s step on {model_name} is not captured: {why}")
    steps = Steps(engine, s, Data(x, y, x[:1], y[:1], task), [itertools.repeat(torch.arange(BATCH))], padded,
                  captured and replay)
    count = itertools.count(1)

    def step():
        steps(next(count))
    step.model = model
    return step


N_TRAIN = {"cnn": 60000, "autoencoder": 60000, "bag_of_words": 120000, "transformer": 120000, "vit": 60000}
SECURE_MODES = {"sampled:seeded": (False, False), "sampled:secure_sampling": (True, False),
                "sampled:secure": (True, True)}


def sampled_step(model_name, mode, engine_name):
    """fixed_threshold's step on a Poisson batch drawn from N examples, seeded or secure (SECURE_MODES)."""
    from dpgrid.privacy.randomness import SecureRandom, poisson_batch

    secure_sampling, secure_noise = SECURE_MODES[mode]
    build, shape, task, classes, _ = MODELS[model_name]
    model, n = build().to(DEVICE), N_TRAIN[model_name]
    g = torch.Generator().manual_seed(0)
    x = inputs(model_name, n, g)
    y = x if task == "reconstruction" else torch.randint(0, classes, (n,), generator=g)
    x, y = x.to(DEVICE), y.to(DEVICE)
    sampler = SecureRandom() if secure_sampling else torch.Generator().manual_seed(1)
    noise = SecureRandom() if secure_noise else torch.Generator(device=DEVICE).manual_seed(2)
    s = strategies.FixedThreshold(model.parameters(), hp={"lr": 0.1, "clip": 1.0}, noise=strategies.Noise(NOISE),
                                  batch_size=BATCH, options={}, generator=noise)
    engine = make_engine(model, task, engine_name, METHODS)

    def step():
        idx = poisson_batch(n, BATCH / n, sampler)
        if DEVICE.type == "cuda":  # as the training loop copies it: pinned, non-blocking
            idx = idx.pin_memory().to(DEVICE, non_blocking=True)
        s.step(engine(x[idx], y[idx]))
    return step


def opacus_step(model_name):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    model = GradSampleModule(MODELS[model_name][0]().to(DEVICE))
    x, y, task = batch(model_name)
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), noise_multiplier=NOISE, max_grad_norm=1.0,
                      expected_batch_size=BATCH)

    def step():
        opt.zero_grad(set_to_none=True)
        per_sample_losses(model(x), y, task).mean().backward()
        opt.step()
    return step


def opacus_ghost_step(model_name):
    """Opacus's ghost clipping (GradSampleModuleFastGradientClipping: two backward passes, the norms from the first)
    with its DPOptimizerFastGradientClipping: Opacus's fastest private step where it serves the model's layers."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    model = GradSampleModuleFastGradientClipping(MODELS[model_name][0]().to(DEVICE), max_grad_norm=1.0)
    x, y, task = batch(model_name)
    opt = DPOptimizerFastGradientClipping(torch.optim.SGD(model.parameters(), lr=0.01), noise_multiplier=NOISE,
                                          max_grad_norm=1.0, expected_batch_size=BATCH)
    criterion = DPLossFastGradientClipping(model, opt, torch.nn.CrossEntropyLoss(reduction="mean") if
                                           task == "classification" else torch.nn.MSELoss(reduction="mean"))

    def step():
        opt.zero_grad(set_to_none=True)
        criterion(model(x), y).backward()
        opt.step()
    return step


def fallback_step(model_name):
    """FixedThreshold's step on the torch.func engine: what a model trains at when no rule serves a layer of it (the
    transformers before dpgrid had rules for Embedding, LayerNorm and Linear on sequences)."""
    name = next(n for n in dp_sgd_strategies()
                if strategies.resolve(dpgrid.compose([f"strategy={n}"]).strategy) is strategies.FixedThreshold)
    return strategy_step(model_name, name, "func")


# the steps timed after dpgrid's, alone (each evicts the others' data: B x P per-sample gradients): Opacus's
# private steps and the torch.func fallback; which models each is timed on
RIVALS = {"opacus": (opacus_step, tuple(MODELS)), "opacus_ghost": (opacus_ghost_step, ("transformer", "vit")),
          "func": (fallback_step, ("transformer", "vit"))}


def proof_seconds(model_name, repeats: int = 3) -> dict:
    """What a grid of this model pays before it trains, best of `repeats` after one: the train-mode check that it keeps
    samples apart at both ends of its Poisson batch sizes (dpgrid.training.apart, at B = BATCH of its dataset's N), and
    the proof (dpgrid.training.proof: the layout found on two batch sizes from the largest, and the fast engine compared
    with per-sample autograd through the same train-mode forward, in float64)."""
    from dpgrid.training.apart import check_sizes, mixing
    from dpgrid.training.proof import prove

    model = MODELS[model_name][0]().to(DEVICE)
    x, y, task = batch(model_name)
    sizes = check_sizes(BATCH, BATCH / N_TRAIN[model_name], N_TRAIN[model_name])
    timed = {"apart": lambda: mixing(model, x[:64], sizes),
             "proof": lambda: prove(model, task, x[:64], y[:64], stacked_too=False, size=max(sizes))}
    found = {"sizes": list(sizes)}
    for name, work in timed.items():
        best = float("inf")
        for _ in range(repeats + 1):
            start = time.perf_counter()
            work()
            synchronize()
            best = min(best, time.perf_counter() - start)
        found[f"{name}_seconds"] = best
    found["seconds"] = found["apart_seconds"] + found["proof_seconds"]
    return found


def make_step(model_name, method, engine_name):
    if method == "nonprivate":
        return nonprivate_step(model_name)
    if method in RIVALS:
        return RIVALS[method][0](model_name)
    if method in SECURE_MODES:
        return sampled_step(model_name, method, engine_name)
    if method.endswith(GRAPHED):
        return strategy_step(model_name, method.removesuffix(GRAPHED), engine_name, graph=True)
    return strategy_step(model_name, method, engine_name)


GRAPHED = "+graph"  # --cuda-graphs: a strategy's step replayed as a CUDA graph, as `dpgrid run` takes it on CUDA


def peak_rss_mb() -> float:
    """Peak resident memory of this process image. VmHWM, not ru_maxrss: Linux carries a forked
    parent's peak into the child's ru_maxrss across exec, which would hide the child's own peak."""
    try:
        with open("/proc/self/status") as f:
            return int(f.read().split("VmHWM:")[1].split()[0]) / 1024
    except (OSError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_in_fresh_process(setup: str, work: str, cuda: bool = False) -> float:
    """Peak memory (MB) that `work` adds above `setup` (Python statements using this module as `bench`), in a fresh
    process so peaks do not mix: resident memory, or with `cuda` the device memory torch allocated."""
    measure = ("bench.torch.cuda.max_memory_allocated(bench.DEVICE) / 2 ** 20" if cuda else "bench.peak_rss_mb()")
    base = "bench.torch.cuda.memory_allocated(bench.DEVICE) / 2 ** 20" if cuda else "bench.peak_rss_mb()"
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import bench; {setup}; "
            f"base = {base}; {work}; print({measure} - base)")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def peak_memory_mb(model_name, method, engine_name) -> float:
    """Peak memory a step adds above its set-up: resident memory on a CPU, allocated device memory on CUDA."""
    if DEVICE.type == "cuda":
        return peak_in_fresh_process(f"step = bench.make_step({model_name!r}, {method!r}, {engine_name!r}); "
                                     "bench.torch.cuda.reset_peak_memory_stats()",
                                     "[step() for _ in range(3)]; bench.synchronize()", cuda=True)
    return peak_in_fresh_process(f"step = bench.make_step({model_name!r}, {method!r}, {engine_name!r})",
                                 "[step() for _ in range(3)]")


# --grid: a whole grid (K configurations x 5 seeds) of online, trained one run at a time and stacked
# (train.parallel_runs=auto); (dataset config, K, steps per run, N of the synthetic training set)
GRIDS = {"mlp": ("digits", 7, 100, 1437), "bag_of_words": ("ag_news", 7, 20, 8192), "cnn": ("mnist", 2, 4, 8192),
         "autoencoder": ("fashion_mnist", 2, 4, 8192)}
# the speedup each grid should reach on a 2-core CPU (the convolutions: never slower)
GRID_TARGETS = {"mlp": 4.0, "bag_of_words": 4.0, "cnn": 1.0, "autoencoder": 1.0}


def matmul_floor_s(model, batch_size: int, repeats: int = 50):
    """Seconds per step of the matmuls no private step of `model` avoids, timed alone: each Linear layer's
    forward and weight gradient, and the input gradient of every layer but the first. Stacking, or anything else
    that still does them, cannot take a run-step below this. None for models with other parameterised layers."""
    if not all(isinstance(m, torch.nn.Linear) or not list(m.parameters()) for m in model):
        return None
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(batch_size, m.in_features) for m in layers]
    out_grads = [torch.randn(batch_size, m.out_features) for m in layers]

    def step():
        for i, (m, a, g) in enumerate(zip(layers, inputs, out_grads)):
            torch.addmm(m.bias, a, m.weight.t()) if m.bias is not None else a @ m.weight.t()
            g.t() @ a
            if i > 0:
                g @ m.weight

    with torch.no_grad():
        for _ in range(5):
            step()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def grid_job(model_name, mode, setting="auto"):
    """A callable training the whole --grid grid of `model_name` one at a time (mode "sequential") or as
    `dpgrid run` groups it with train.parallel_runs=`setting` ("parallel"); validation once, at the end."""
    from dpgrid.config import check_loaded
    from dpgrid.data import Data, load
    from dpgrid.models import build_model
    from dpgrid.runner import train_together
    from dpgrid.training.stacked import group_size

    dataset, k, steps, n = GRIDS[model_name]
    graphs = os.environ.get("DPGRID_BENCH_CUDA_GRAPHS", "false")  # --cuda-graphs (the memory subprocesses read it)
    spec = dpgrid.compile(dpgrid.compose([f"dataset={dataset}", "strategy=online", f"grid.k={k}", "train.seeds=5",
                                          f"train.eval_every={steps}", f"train.device={DEVICE}",
                                          f"train.cuda_graphs={graphs}"]), n)
    if model_name == "mlp":  # the real digits
        data = load(spec.dataset, spec.data_root, DEVICE)
    else:
        shape, task, classes = MODELS[model_name][1:4]
        g = torch.Generator().manual_seed(0)
        x = torch.rand((n + 512, *shape), generator=g)
        y = x if task == "reconstruction" else torch.randint(0, classes, (n + 512,), generator=g)
        data = Data(*(t.to(DEVICE) for t in (x[:n], y[:n], x[n:], y[n:])), task)
    check_loaded(spec, data.n_train)
    spec = replace(spec, plan=replace(spec.plan, steps=steps))  # enough steps to time, not the dataset's T
    runs = [(c, s) for c in spec.plan.configurations for s in range(5)]
    model = build_model(spec.model)
    size = 1 if mode == "sequential" else group_size(setting, model, spec.strategy_cls, len(runs),
                                                     spec.plan.batch_size, DEVICE, data.x_train[:1])[0]

    methods = MethodChoice(spec.train.per_sample_method)  # one choice of each layer's form per grid, as a run makes

    def job():
        for start in range(0, len(runs), size):
            train_together(spec, data, runs[start:start + size], per_sample_methods=methods)
    job.runs, job.size, job.model, job.batch_size = len(runs), size, model, spec.plan.batch_size
    return job


def grid_peak_mb(model_name, mode, setting) -> float:
    """Peak memory of one pass of grid_job above its set-up (resident memory, or CUDA's allocated memory)."""
    if DEVICE.type == "cuda":
        return peak_in_fresh_process(f"job = bench.grid_job({model_name!r}, {mode!r}, {setting!r}); "
                                     "bench.torch.cuda.reset_peak_memory_stats()", "job(); bench.synchronize()",
                                     cuda=True)
    return peak_in_fresh_process(f"job = bench.grid_job({model_name!r}, {mode!r}, {setting!r})", "job()")


def bench_grids(models: list, repeats: int, memory: bool, setting: str = "auto") -> list:
    """{"model", "runs", "group", "sequential_s", "parallel_s", "speedup", "peak_mb"} per model: medians of
    `repeats` passes, the two modes interleaved (a noisy machine slows both alike)."""
    rows = []
    for model_name in models:
        jobs = {mode: grid_job(model_name, mode, setting) for mode in ("sequential", "parallel")}
        seconds = interleaved(jobs, repeats)
        sequential, parallel = seconds["sequential"], seconds["parallel"]
        run_steps = jobs["parallel"].runs * GRIDS[model_name][2]
        floor = matmul_floor_s(jobs["sequential"].model, jobs["sequential"].batch_size)
        rows.append({"model": model_name, "runs": jobs["parallel"].runs, "group": jobs["parallel"].size,
                     "steps_per_run": GRIDS[model_name][2], "sequential_s": sequential, "parallel_s": parallel,
                     "speedup": sequential / parallel, "target": GRID_TARGETS[model_name],
                     "met": sequential / parallel >= GRID_TARGETS[model_name],
                     # the most any method that keeps the step's matmuls could gain over one run at a time
                     "matmul_floor_ms": floor * 1e3 if floor else None,
                     "ceiling": sequential / run_steps / floor if floor else None,
                     "peak_mb": grid_peak_mb(model_name, "parallel", setting) if memory else None})
    return rows


def started_grids(model_name: str, jobs: int, setting: str, threads: int) -> list:
    """`jobs` fresh processes, each with its grid_job of `model_name` set up (data loaded, model built) and waiting
    for a line on its stdin to start; torch uses `threads` threads in each (train.threads=auto shares the cores among
    a launcher's parallel jobs)."""
    code = (f"import sys, time; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import bench; "
            f"bench.torch.set_num_threads({threads}); job = bench.grid_job({model_name!r}, 'parallel', {setting!r}); "
            "print('ready', flush=True); sys.stdin.readline(); start = time.time(); job(); bench.synchronize(); "
            "print(start, time.time(), flush=True)")
    processes = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for _ in range(jobs)]
    for process in processes:
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"--side-by-side: a {model_name} grid process failed to set up")
    return processes


def timed_grids(processes: list) -> tuple:
    """(first start, last end) of the set-up grid processes, each told to start at once."""
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    spans = [tuple(map(float, process.communicate()[0].split()[-2:])) for process in processes]
    if any(process.returncode for process in processes):
        raise SystemExit("--side-by-side: a grid process failed")
    return min(s for s, _ in spans), max(e for _, e in spans)


def bench_side_by_side(models: list, jobs: int, repeats: int, setting: str = "auto") -> list:
    """{"model", "grids", "one_after_another_s", "side_by_side_s", "speedup"} per model: `jobs` copies of the model's
    --grid grid (as `dpgrid run` groups it, train.parallel_runs=`setting`), each in its own process as a launcher's
    sweep runs them: one after another (all the cores each) against side by side (the cores shared among them), set-up
    excluded, medians of `repeats` rounds, the two modes alternating."""
    cores = torch.get_num_threads()
    rows = []
    for model_name in models:
        apart, together = [], []
        for _ in range(repeats):
            apart.append(sum(end - start for start, end in (timed_grids(started_grids(model_name, 1, setting, cores))
                                                            for _ in range(jobs))))
            start, end = timed_grids(started_grids(model_name, jobs, setting, max(1, cores // jobs)))
            together.append(end - start)
        one_after_another, side_by_side = statistics.median(apart), statistics.median(together)
        rows.append({"model": model_name, "grids": jobs, "one_after_another_s": one_after_another,
                     "side_by_side_s": side_by_side, "speedup": one_after_another / side_by_side})
    return rows


TRACKERS = ("none", "mlflow", "tensorboard")
TRACKER_TARGET = 1.05  # the most a tracker may add to the default job, as a ratio of whole-process times


def bench_trackers(repeats: int, trackers=TRACKERS) -> dict:
    """The default job (`dpgrid run`, digits) as whole processes without a tracker and with each, interleaved round by
    round (a busy machine slows them alike): the median seconds of each (wall, and CPU of the grid's process and its
    tracker's worker together), and the median of each round's wall ratio to the job without one. Each run trains
    into a fresh directory; a tracker's store is kept between runs, as a user's is."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="dpgrid-trackers-")
    seconds, cpu = {t: [] for t in trackers}, {t: [] for t in trackers}
    try:
        for repeat in range(repeats + 1):  # the first round is a warm-up: imports cached, stores made
            for tracker in trackers:
                here = os.path.join(folder, tracker)
                shutil.rmtree(os.path.join(here, "outputs", "digits"), ignore_errors=True)
                os.makedirs(here, exist_ok=True)
                command = [sys.executable, "-m", "dpgrid", "run", *([] if tracker == "none" else [f"tracker={tracker}"])]
                start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run(command, cwd=here, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the grid's process and its tracker's worker
                if repeat:
                    seconds[tracker].append(time.perf_counter() - start)
                    cpu[tracker].append(after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = []
    for tracker in trackers:
        ratios = [a / b for a, b in zip(seconds[tracker], seconds["none"])]
        rows.append({"tracker": tracker, "seconds": statistics.median(seconds[tracker]),
                     "cpu_s": statistics.median(cpu[tracker]),
                     "min_s": min(seconds[tracker]), "max_s": max(seconds[tracker]), "repeats": repeats,
                     "ratio_to_none": statistics.median(ratios), "target": TRACKER_TARGET,
                     "met": statistics.median(ratios) <= TRACKER_TARGET})
    return {"job": "dpgrid run (the default job: online on digits, k = 7, 5 seeds)", "trackers": rows}


RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "steps.json")
TRACKER_RECORD = os.path.join(os.path.dirname(RECORD), "trackers.json")
DRIFT = 0.10  # a ratio that moved by more than this (relative) against the record is flagged


def device_name() -> str:
    """What runs the steps: the CPU's model name, or the GPU's."""
    return torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else cpu_name()


def device_type(machine: dict) -> str:
    """cpu or cuda: where a record's steps ran (records made before it was written say it by a device that is no CPU)."""
    return machine.get("device_type") or ("cuda" if machine.get("device", machine.get("cpu")) != machine.get("cpu")
                                          else "cpu")


def cpu_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def ratios(report: dict) -> dict:
    """{"model strategy": private step / non-private step, "model opacus": Opacus's / non-private} of a report; a
    captured step's (`<strategy>+graph`) to the captured non-private step."""
    found = {f"{r['model']} {r['strategy']}": r.get("ratio_to_captured_nonprivate", r["ratio_to_nonprivate"])
             for r in report["results"]}
    found.update({f"{r['model']} {r.get('method', 'opacus')}": r["ratio_to_nonprivate"] for r in report.get("opacus", [])})
    return found


def compare(report: dict, record: dict) -> list:
    """(name, recorded ratio, measured ratio, moved) for every ratio both hold; moved: by more than DRIFT."""
    old, new = ratios(record), ratios(report)
    return [(name, old[name], new[name], abs(new[name] / old[name] - 1) > DRIFT) for name in sorted(old) if name in new]


REGION = "dpgrid: "  # the prefix of the regions --profile names for torch's profiler
OTHER = "engine: the rest (batch gather, loss, masks)"


@contextlib.contextmanager
def regions(model, strategy_classes=()):
    """Name a step's regions for torch's profiler (torch.profiler.record_function) while the block runs: each leaf
    module's forward; each layer rule's work, layer by layer (its construction as the backward reaches the layer, the
    per-sample gradients a convolution materialises, the norms, the weighted sums); and the strategy's parts (clip
    weights, noise draw, noisy mean, update, the rest of its step). Nothing is named outside the block."""
    from torch.autograd.profiler import record_function

    from dpgrid.strategies import base
    from dpgrid.training.rules import RULES, LayerRule
    from dpgrid.training.rules.convolution import ConvRule

    names = {id(m): f"{name or 'model'} ({type(m).__name__})" for name, m in model.named_modules()}

    def layer(module):
        return names.get(id(module), type(module).__name__)

    def named(label_of, function):
        def wrapped(*args, **kwargs):
            with record_function(REGION + label_of(*args)):
                return function(*args, **kwargs)
        return wrapped

    kept = []  # (owner, attribute, original) to put back

    def replace_attribute(owner, attribute, value):
        kept.append((owner, attribute, owner.__dict__[attribute]))
        setattr(owner, attribute, value)

    owners = {klass for rule in set(RULES.values()) for klass in rule.__mro__ if issubclass(klass, LayerRule)}
    for owner in owners:
        for attribute, what in (("sq_norms", "norms"), ("weighted_sum", "weighted sums")):
            if attribute in owner.__dict__:
                replace_attribute(owner, attribute, named(lambda self, *_, w=what: f"{layer(self.module)}: {w}",
                                                          owner.__dict__[attribute]))
    built = LayerRule.__dict__["from_recorded"].__func__
    replace_attribute(LayerRule, "from_recorded", classmethod(named(
        lambda cls, module, *_: f"{layer(module)}: rule built in the backward", built)))
    per_sample = ConvRule.__dict__["wg"].fget
    replace_attribute(ConvRule, "wg", property(named(lambda self: f"{layer(self.module)}: per-sample gradients",
                                                      per_sample)))
    for attribute, what in (("clip_weights", "strategy: clip weights"), ("noisy_mean_flat", "strategy: noisy mean"),
                            ("descend", "strategy: update")):
        replace_attribute(base.Strategy, attribute, named(lambda *_, w=what: w, base.Strategy.__dict__[attribute]))
    replace_attribute(base, "standard_normal", named(lambda *_: "strategy: noise draw", base.standard_normal))
    for klass in {next(k for k in c.__mro__ if "step" in k.__dict__) for c in strategy_classes}:
        replace_attribute(klass, "step", named(lambda *_: "strategy: the rest of its step", klass.__dict__["step"]))
    norms = PerSampleGrads.__dict__["norms"].fget
    replace_attribute(PerSampleGrads, "norms", property(named(lambda *_: "engine: norms over the layers", norms)))
    replace_attribute(PerSampleGrads, "weighted_sums", named(lambda *_: "engine: weighted sums over the layers",
                                                             PerSampleGrads.__dict__["weighted_sums"]))
    opened, hooks = {}, []
    for module in model.modules():
        if not list(module.children()):
            label = f"forward {layer(module)}"
            hooks.append(module.register_forward_pre_hook(
                lambda m, _, label=label: opened.setdefault(id(m), []).append(record_function(REGION + label).__enter__())))
            hooks.append(module.register_forward_hook(lambda m, *_: opened[id(m)].pop().__exit__(None, None, None)))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for owner, attribute, original in reversed(kept):
            setattr(owner, attribute, original)


def region_of(event) -> str:
    """The innermost named region an operator ran in; outside any, its backward node's (the autograd engine's
    evaluate_function) or OTHER."""
    outer = event
    while event is not None:
        if event.name.startswith(REGION):
            return event.name[len(REGION):]
        outer, event = event, event.cpu_parent
    backward = "autograd::engine::evaluate_function: "
    return f"backward: {outer.name[len(backward):]}" if outer.name.startswith(backward) else OTHER


def region_times(prof, steps: int, cuda: bool) -> dict:
    """{region: [milliseconds per step, launches per step]}: on CUDA the device time of the kernels each region's
    operators launched and their count, on a CPU the operators' self CPU time and the count of leaf operators."""
    from torch.autograd import DeviceType

    found = {}
    for event in prof.events():
        if event.device_type != DeviceType.CPU:
            continue
        if cuda:
            own, launches = event.self_device_time_total, len(getattr(event, "kernels", []))
        else:
            own = event.self_cpu_time_total
            launches = int(event.name.startswith("aten::") and not any(c.name.startswith("aten::")
                                                                        for c in event.cpu_children))
        if own or launches:
            row = found.setdefault(region_of(event), [0.0, 0.0])
            row[0] += own / steps / 1e3
            row[1] += launches / steps
    return found


PROFILED = {}  # (model, strategy, steps) -> its regions' times, in this process


def profile(model_name: str, strategy: str, engine_name: str, steps: int = 5) -> dict:
    """Where a private step's time goes beside the non-private baseline's (the config group's non-private strategy
    through the same engine: the step `<strategy>+graph` is compared with on CUDA), region by region and layer by
    layer (`regions`), under torch's profiler, `steps` of each after a warm-up. On CUDA each step is padded as a
    CUDA graph replays it and its kernels launched one by one: the device time of its kernels is what a replay runs
    (a replay saves the launches and the gaps between them, not the kernels); the captured steps themselves are timed
    too. On a CPU, the operators' self CPU time."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    cuda = DEVICE.type == "cuda"
    baseline = nonprivate_strategies()[0]
    times = {}
    for name in (baseline, strategy):
        if (model_name, name, steps) in PROFILED:  # the baseline, profiled once per model
            times[name] = PROFILED[model_name, name, steps]
            continue
        step = strategy_step(model_name, name, engine_name, graph=cuda, replay=False)
        warm([step], 3)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with regions(step.model, [strategy_class(name)]), torch_profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            synchronize()
        times[name] = PROFILED[model_name, name, steps] = region_times(prof, steps, cuda)
    rows = [{"region": region, "nonprivate_ms": times[baseline].get(region, [0, 0])[0],
             "private_ms": times[strategy].get(region, [0, 0])[0],
             "nonprivate_launches": times[baseline].get(region, [0, 0])[1],
             "private_launches": times[strategy].get(region, [0, 0])[1]}
            for region in set(times[baseline]) | set(times[strategy])]
    for row in rows:
        row["difference_ms"] = row["private_ms"] - row["nonprivate_ms"]
    rows.sort(key=lambda r: -abs(r["difference_ms"]))
    found = {"model": model_name, "strategy": strategy, "baseline": baseline, "device": device_name(), "steps": steps,
             "measures": "device time of the kernels (ms per step), launched as a graph replays them" if cuda else
             "self CPU time of the operators (ms per step)", "regions": rows,
             "nonprivate_ms": sum(r["nonprivate_ms"] for r in rows), "private_ms": sum(r["private_ms"] for r in rows),
             "nonprivate_launches": sum(r["nonprivate_launches"] for r in rows),
             "private_launches": sum(r["private_launches"] for r in rows)}
    if cuda:  # what the captured steps take, interleaved, against the sums of their kernels' times
        captured = {name: strategy_step(model_name, name, engine_name, graph=True) for name in (baseline, strategy)}
        warm(captured.values(), 3)
        seconds = interleaved(captured, 50)
        found["captured_ms"] = {name: seconds[name] * 1e3 for name in captured}
        found["captured_ratio"] = seconds[strategy] / seconds[baseline]
    return found


def print_profile(found: dict) -> None:
    print(f"{found['model']}: {found['strategy']} against {found['baseline']}, {found['measures']}, {found['steps']} "
          f"steps each after warm-up, on {found['device']}")
    print(f"{'region':<58} {found['baseline']:>9} {found['strategy']:>15} {'difference':>11} {'launches':>13}")
    for r in found["regions"]:
        if max(r["nonprivate_ms"], r["private_ms"]) < 0.0005 * max(found["private_ms"], 1e-9):
            continue
        print(f"{r['region'][:58]:<58} {r['nonprivate_ms']:>9.3f} {r['private_ms']:>15.3f} {r['difference_ms']:>+11.3f} "
              f"{r['nonprivate_launches']:>6.0f} {r['private_launches']:>6.0f}")
    print(f"{'total':<58} {found['nonprivate_ms']:>9.3f} {found['private_ms']:>15.3f} "
          f"{found['private_ms'] - found['nonprivate_ms']:>+11.3f} {found['nonprivate_launches']:>6.0f} "
          f"{found['private_launches']:>6.0f}")
    if "captured_ms" in found:
        ms = found["captured_ms"]
        print(f"captured steps (medians of 50, interleaved): {found['baseline']} {ms[found['baseline']]:.3f} ms, "
              f"{found['strategy']} {ms[found['strategy']]:.3f} ms: {found['captured_ratio']:.2f}x")


def warm(steps, count: int) -> None:
    for step in steps:
        for _ in range(count):
            step()
    synchronize()


def interleaved(steps: dict, repeats: int) -> dict:
    """The median seconds of each step, timed round-robin `repeats` times: machine noise hits every step alike."""
    times = {m: [] for m in steps}
    for _ in range(repeats):
        for m, step in steps.items():
            synchronize()
            start = time.perf_counter()
            step()
            synchronize()
            times[m].append(time.perf_counter() - start)
    return {m: statistics.median(t) for m, t in times.items()}


SCATTERING_RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "scattering_cpu.json")
FEATURES_SCRIPT = """
import resource, sys, time
from dpgrid.data.datasets import load_idx
from dpgrid.data.features import with_features
from dpgrid.models.scattering import Scattering2d
data = load_idx(sys.argv[1], "MNIST")
start = time.perf_counter()
features, said = with_features(Scattering2d(2, 8, (28, 28)), data, "mnist")
if sys.argv[2] == "read":
    features.x_train.sum()  # every page of the features read, as an epoch of training reads them
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def bench_scattering(data_root, repeats: int) -> dict:
    """The scattering transform (J = 2, L = 8, 28 x 28) per 1,000 images, dpgrid's against kymatio's where it is
    installed; with data_root, MNIST's 70,000 images' features computed and kept, then read back, each in a fresh
    process: seconds and peak resident memory (the second reads every page of the training features, as an epoch of
    training does; the pages are file-backed, the operating system's cache)."""
    import tempfile

    from dpgrid.data import features
    from dpgrid.models.scattering import Scattering2d

    x = (torch.rand(1000, 1, 28, 28) > 0.8).float() * torch.rand(1000, 1, 28, 28)
    found = {"load_average": os.getloadavg(), "chunk": features.CHUNK}

    def per_1000(stage) -> float:  # the features' own chunks, after one warm-up pass; the median of `repeats`
        times = []
        with torch.no_grad():
            for _ in range(repeats + 1):
                start = time.perf_counter()
                for first in range(0, len(x), features.CHUNK):
                    stage(x[first:first + features.CHUNK])
                times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    found["dpgrid_s_per_1000"] = per_1000(Scattering2d(2, 8, (28, 28)))
    try:
        from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

        found["kymatio_s_per_1000"] = per_1000(ScatteringTorch2D(J=2, shape=(28, 28), L=8))
    except ImportError:
        found["kymatio_s_per_1000"] = None
    if data_root:
        with tempfile.TemporaryDirectory() as folder:
            env = {**os.environ, "DPGRID_FEATURES": folder}
            for what, touch in (("computed", "no"), ("read_back", "read")):  # computing, then a grid's reading
                out = subprocess.run([sys.executable, "-c", FEATURES_SCRIPT, data_root, touch], env=env,
                                     capture_output=True, text=True, check=True).stdout.split()
                found[f"mnist_{what}_s"], found[f"mnist_{what}_peak_mb"] = float(out[0]), float(out[1])
    return found


def main():
    if "--scattering" in sys.argv:
        scattering = argparse.ArgumentParser(description="the scattering transform's and the features cache's time and "
                                             "memory (dpgrid.models.scattering, dpgrid.data.features)")
        scattering.add_argument("--scattering", action="store_true")
        scattering.add_argument("--data-root", help="where MNIST/raw lies: also time its features, computed and read")
        scattering.add_argument("--repeats", type=int, default=3)
        scattering.add_argument("--record", nargs="?", const=SCATTERING_RECORD, default=None)
        args = scattering.parse_args()
        report = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                              "torch": torch.__version__}, "scattering": bench_scattering(args.data_root, args.repeats)}
        print(json.dumps(report, indent=2))
        if args.record:
            said = ["DATA" if a == args.data_root else a for a in sys.argv[1:]]  # no path of this machine
            report.update(commit=commit(), command="python scripts/bench.py " + " ".join(said),
                          date=time.strftime("%Y-%m-%d"))
            with open(args.record, "w") as f:
                f.write(json.dumps(report, indent=2) + "\n")
        return
    if "--searchpath" in sys.argv:  # before the strategies are listed: its folder adds to them
        os.environ["DPGRID_BENCH_SEARCHPATH"] = sys.argv[sys.argv.index("--searchpath") + 1]
    if "--device" in sys.argv:  # before anything is built; the memory subprocesses read it from the environment
        os.environ["DPGRID_BENCH_DEVICE"] = sys.argv[sys.argv.index("--device") + 1]
        globals()["DEVICE"] = torch.device(os.environ["DPGRID_BENCH_DEVICE"])
    if "--cuda-graphs" in sys.argv:
        os.environ["DPGRID_BENCH_CUDA_GRAPHS"] = "true"
    if "--per-sample-method" in sys.argv:  # the memory subprocesses build their steps from the environment too
        os.environ["DPGRID_BENCH_PER_SAMPLE_METHOD"] = sys.argv[sys.argv.index("--per-sample-method") + 1]
        METHODS.setting = os.environ["DPGRID_BENCH_PER_SAMPLE_METHOD"]
    strategies_found = dp_sgd_strategies()
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--searchpath", help="a config folder (file://...) whose strategies join the benchmark")
    parser.add_argument("--trackers", action="store_true", help="time the default job (`dpgrid run`) without a tracker "
                        "and with tracker=mlflow and tracker=tensorboard, as whole processes (--repeats rounds)")
    parser.add_argument("--steps", type=int, default=7, help="timed steps per method, at least (median reported)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="small models repeat until the non-private steps take about this long")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first, per method")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="the models to time")
    parser.add_argument("--strategies", nargs="+", default=strategies_found, choices=strategies_found,
                        help="the private steps to time beside the non-private one")
    parser.add_argument("--engine", default="fast", choices=["fast", "func"],
                        help="the per-sample engine (train.engine)")
    parser.add_argument("--no-opacus", action="store_true", help="skip Opacus's steps and the torch.func fallback's "
                        "(timed apart, after dpgrid's)")
    parser.add_argument("--secure", action="store_true", help="also time seeded vs secure sampling and noise")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    parser.add_argument("--grid", action="store_true", help="time whole grids one run at a time vs stacked "
                        "(train.parallel_runs=auto) instead of single steps; --models from " + ", ".join(GRIDS))
    parser.add_argument("--repeats", type=int, default=3, help="--grid: passes per mode (median reported)")
    parser.add_argument("--parallel-runs", default="auto", help="--grid: train.parallel_runs of the stacked mode")
    parser.add_argument("--side-by-side", type=int, metavar="N", help="--grid: N copies of each grid in N processes, "
                        "one after another against side by side on this device (a launcher's parallel jobs)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where the steps and grids run (CUDA timings "
                        "synchronised, peak memory the device's)")
    parser.add_argument("--cuda-graphs", action="store_true", help="with --device cuda: also time each strategy that "
                        "says `captures = True`, and the non-private baseline, replayed as a CUDA graph (<strategy>+graph), as dpgrid run "
                        "takes them there; with --grid: train.cuda_graphs=true for the grids (false without it)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's malloc at its defaults (dpgrid run keeps freed memory for reuse)")
    parser.add_argument("--per-sample-method", default="auto", choices=["auto", *PER_SAMPLE_METHODS],
                        help="each layer's per-sample form (train.per_sample_method; auto: measured on the first batch)")
    parser.add_argument("--record", nargs="?", const=RECORD, default=None,
                        help="write the report as the benchmark record (default benchmarks/steps.json), with the "
                        "machine, the commit and the command")
    parser.add_argument("--profile", nargs="*", metavar="MODEL STRATEGY",
                        help="where the private step's time goes beside the non-private baseline's, region by region "
                        "and layer by layer (torch's profiler; on CUDA each kernel's device time): MODEL STRATEGY, or "
                        "each of --models and --strategies without them")
    parser.add_argument("--check", nargs="?", const=RECORD, default=None,
                        help="run the steps of the record (default benchmarks/steps.json) and flag every ratio that "
                        f"moved by more than {DRIFT * 100:.0f}%%; exit 1 if any did")
    if "--grid" in sys.argv:
        parser.set_defaults(models=list(GRIDS))
        for action in parser._actions:
            if action.dest == "models":
                action.choices = list(GRIDS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.profile is not None:
        if len(args.profile) not in (0, 2):
            parser.error("--profile takes MODEL STRATEGY, or nothing (each of --models and --strategies)")
        pairs = [tuple(args.profile)] if args.profile else [(m, s) for m in args.models for s in args.strategies]
        found = []
        for model_name, strategy in pairs:
            found.append(profile(model_name, strategy, args.engine))
            if not args.json:
                print_profile(found[-1])
        if args.json:
            print(json.dumps({"machine": {"device": device_name(), "cpu": cpu_name(), "torch": torch.__version__},
                              "profiles": found}, indent=2))
        return
    if args.trackers:
        found = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
                             "load_average": os.getloadavg()[0]},
                 **bench_trackers(args.repeats), "commit": commit(),
                 "command": "python scripts/bench.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d")}
        if args.record:
            with open(args.record if args.record != RECORD else TRACKER_RECORD, "w") as f:
                json.dump(found, f, indent=2)
        if args.json:
            print(json.dumps(found, indent=2))
            return
        print(f"machine: {found['machine']}\n{found['job']}")
        print(f"{'tracker':<12} {'median s':>9} {'min s':>7} {'max s':>7} {'cpu s':>7} {'ratio':>7} {'target':>7}")
        for r in found["trackers"]:
            print(f"{r['tracker']:<12} {r['seconds']:>9.2f} {r['min_s']:>7.2f} {r['max_s']:>7.2f} {r['cpu_s']:>7.2f} "
                  f"{r['ratio_to_none']:>7.3f} {r['target']:>6.2f}{'' if r['met'] else '!'}")
        print("ratio: the median over rounds of each round's time over the job's without a tracker (! over target)")
        return
    if args.grid:
        machine = {"cpu": cpu_name(), "device": device_name(), "cores": os.cpu_count(),
                   "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "allocator": ALLOCATOR,
                   "cuda_graphs": args.cuda_graphs}
        if args.side_by_side:
            rows = bench_side_by_side(args.models, args.side_by_side, args.repeats, args.parallel_runs)
            if args.json:
                print(json.dumps({"machine": machine, "side_by_side": rows}, indent=2))
                return
            print(f"machine: {machine}")
            print(f"{'model':<13} {'grids':>6} {'one after another s':>20} {'side by side s':>15} {'speedup':>8}")
            for r in rows:
                print(f"{r['model']:<13} {r['grids']:>6} {r['one_after_another_s']:>20.2f} {r['side_by_side_s']:>15.2f} "
                      f"{r['speedup']:>8.2f}")
            return
        rows = bench_grids(args.models, args.repeats, not args.no_memory, args.parallel_runs)
        if args.json:
            print(json.dumps({"machine": machine, "grid": rows}, indent=2))
            return
        print(f"machine: {machine}")
        print(f"{'model':<13} {'runs':>5} {'group':>6} {'one at a time s':>16} {'stacked s':>10} {'speedup':>8} "
              f"{'target':>7} {'ceiling':>8} {'peak MB':>8}")
        nan = float("nan")
        for r in rows:
            print(f"{r['model']:<13} {r['runs']:>5} {r['group']:>6} {r['sequential_s']:>16.2f} {r['parallel_s']:>10.2f} "
                  f"{r['speedup']:>8.2f} {r['target']:>6.1f}{'' if r['met'] else '!'} "
                  f"{r['ceiling'] if r['ceiling'] is not None else nan:>8.2f} "
                  f"{r['peak_mb'] if r['peak_mb'] is not None else nan:>8.0f}")
        print("target: the speedup to reach on a 2-core CPU (! not met); ceiling: one run at a time's time per "
              "run-step over the matmuls no private step avoids, timed alone (the most any method keeping them gains)")
        return

    record = None
    if args.check:
        with open(args.check) as f:
            record = json.load(f)
        args.models = sorted({r["model"] for r in record["results"]})
        measured = {r["strategy"].removesuffix(GRAPHED) for r in record["results"]}
        args.strategies = sorted(measured & set(strategies_found))
        args.no_opacus = not record.get("opacus")
        args.cuda_graphs = any(r["strategy"].endswith(GRAPHED) for r in record["results"])
        if device_type(record["machine"]) != DEVICE.type:
            raise SystemExit(f"--check {args.check}: measured on {record['machine'].get('device')} "
                             f"({device_type(record['machine'])}); check it with --device "
                             f"{device_type(record['machine'])} on such a machine")
    report = {"machine": {"cpu": cpu_name(), "device": device_name(), "device_type": DEVICE.type, "cores": os.cpu_count(),
                          "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                          "allocator": ALLOCATOR, "batch_size": BATCH, "engine": args.engine},
              "nonprivate": [], "results": [], "opacus": []}
    for model_name in args.models:
        methods = ["nonprivate", *args.strategies] + (list(SECURE_MODES) if args.secure else [])
        if args.cuda_graphs:
            if DEVICE.type != "cuda":
                raise SystemExit("--cuda-graphs needs --device cuda: a CPU step is never captured")
            methods += [f"{name}{GRAPHED}" for name in [*args.strategies, *nonprivate_strategies()]
                        if says_captures(strategy_class(name))]
        steps = {m: make_step(model_name, m, args.engine) for m in methods}
        warm(steps.values(), args.warmup)
        start = time.perf_counter()
        steps["nonprivate"]()
        synchronize()
        repeats = max(args.steps, int(args.seconds / (time.perf_counter() - start)))
        seconds = interleaved(steps, repeats)
        ratios = {m: seconds[m] / seconds["nonprivate"] for m in methods}
        if not args.no_opacus:  # timed after, alone: its per-sample gradients (B x P numbers) evict the others' data
            for rival_name in [name for name, (_, models) in RIVALS.items() if model_name in models]:
                rival = {rival_name: make_step(model_name, rival_name, args.engine)}
                warm(rival.values(), args.warmup)
                methods.append(rival_name)
                seconds[rival_name] = interleaved(rival, repeats)[rival_name]
                ratios[rival_name] = seconds[rival_name] / seconds["nonprivate"]
        for m in methods:
            row = {"model": model_name, "seconds": seconds[m], "repeats": repeats, "ratio_to_nonprivate": ratios[m]}
            if not args.no_memory:
                row["peak_mb"] = peak_memory_mb(model_name, m, args.engine)
            if m == "nonprivate":
                report["nonprivate"].append(row)
            elif m in RIVALS:
                report["opacus"].append({**row, "method": m})
            elif m in SECURE_MODES:
                report.setdefault("secure", []).append({"model": model_name, "mode": m, **{k: v for k, v in row.items() if k != "model"}})
            else:
                row = {"model": model_name, "strategy": m, **{k: v for k, v in row.items() if k != "model"}}
                if m.endswith(GRAPHED):  # against the non-private step as dpgrid captures it: the fair baseline there
                    baseline = f"{nonprivate_strategies()[0]}{GRAPHED}"
                    row["ratio_to_captured_nonprivate"] = seconds[m] / seconds[baseline]
                    target, ratio = CAPTURED_TARGET, row["ratio_to_captured_nonprivate"]
                else:
                    target, ratio = STEP_TARGETS.get(model_name) if DEVICE.type == "cpu" else None, row["ratio_to_nonprivate"]
                report["results"].append({**row, "target_ratio": target, "met": None if target is None else ratio <= target})
    report["proof"] = [{"model": m, **proof_seconds(m)} for m in args.models]
    report["per_sample_methods"] = METHODS.describe()
    if args.record:
        report.update(commit=commit(), command="python scripts/bench.py " + " ".join(sys.argv[1:]),
                      date=time.strftime("%Y-%m-%d"))
        os.makedirs(os.path.dirname(os.path.abspath(args.record)), exist_ok=True)
        with open(args.record, "w") as f:
            f.write(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"machine: {report['machine']}")
    for line in report["per_sample_methods"]:
        print(f"per-sample method: {line}")
    print(f"{'model':<13} {'step':<22} {'seconds':>8} {'ratio':>6} {'captured':>9} {'target':>7} {'peak MB':>8}")
    for r in report["nonprivate"] + report["results"] + report["opacus"]:
        name = r.get("strategy", r.get("method", "nonprivate"))
        target = f"{r['target_ratio']:.2f}{'' if r['met'] else '!'}" if r.get("target_ratio") else ""
        print(f"{r['model']:<13} {name:<22} {r['seconds']:>8.4f} {r['ratio_to_nonprivate']:>6.2f} "
              f"{r.get('ratio_to_captured_nonprivate', float('nan')):>9.2f} {target:>7} "
              f"{r.get('peak_mb', float('nan')):>8.0f}")
    for r in report["proof"]:
        print(f"{r['model']}: before a grid trains, {r['seconds']:.3f} s once: samples kept apart at batch sizes "
              f"{' and '.join(str(n) for n in r['sizes'])} (dpgrid.training.apart) {r['apart_seconds']:.3f} s, the proof "
              f"at {max(r['sizes'])} (dpgrid.training.proof) {r['proof_seconds']:.3f} s")
    if any(r["target_ratio"] for r in report["results"]):
        print("ratio: to the non-private step (launched); captured: a captured step's to the captured non-private step; "
              f"target: the largest ratio a step should keep, on a 2-core CPU, or captured on a GPU ({CAPTURED_TARGET}) "
              "(! not met)")
    for model_name in args.models:
        secure = {r["mode"]: r["seconds"] for r in report.get("secure", []) if r["model"] == model_name}
        if secure:
            print(f"{model_name}: sampled step (N = {N_TRAIN[model_name]:,}) seeded {secure['sampled:seeded']:.4f} s; "
                  f"secure sampling x{secure['sampled:secure_sampling'] / secure['sampled:seeded']:.3f}; "
                  f"secure sampling and noise x{secure['sampled:secure'] / secure['sampled:seeded']:.3f}")
    for o in report["opacus"]:
        fastest = max((r for r in report["results"] if r["model"] == o["model"]), key=lambda r: r["seconds"])
        rival = {"opacus": "Opacus hooks", "opacus_ghost": "Opacus ghost clipping",
                 "func": "the torch.func fallback"}[o.get("method", "opacus")]
        print(f"{o['model']}: slowest dpgrid strategy ({fastest['strategy']}) is {o['seconds'] / fastest['seconds']:.1f}x "
              f"faster than {rival}")
    if record is not None:
        moved = compare(report, record)
        print(f"against the record ({record.get('commit')}, {record.get('date')}, {record['machine'].get('cpu')}): "
              f"ratios that moved by more than {DRIFT:.0%} are flagged !")
        for name, old, new, flag in moved:
            print(f"  {name:<30} {old:>6.2f} -> {new:>6.2f}{' !' if flag else ''}")
        if any(flag for *_, flag in moved):
            raise SystemExit(1)


if __name__ == "__main__":
    from dpgrid.training.threads import exact_cuda

    with exact_cuda():  # as `dpgrid run` computes on CUDA: no TF32, cuDNN's deterministic algorithms
        main()
