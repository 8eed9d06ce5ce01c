"""Where a sweep's grids train on this machine: hydra/launcher=dpgrid, the launcher `dpgrid run -m` uses unless told
otherwise (hydra_plugins.dpgrid_launcher.LocalLauncher asks `side_by_side` here, and trains the grids `in_processes`
where more than one go at once, else one after another as Hydra's basic launcher).

On a CPU a grid takes every core (train.threads=auto), so the grids train one after another in this process, exactly
as Hydra's basic launcher trains them, unless hydra.launcher.side_by_side=N asks for N at once (the cores are then
shared among them). On a GPU one grid of the paper's models leaves most of the device idle: its steps take a few
milliseconds, bound by kernel launches and by the host (batches drawn, validation, Python), and the device waits in
between. Grids side by side fill those gaps (four grids of the MNIST CNN trained 3.4x faster side by side than one after
another on one H200, without CUDA graphs: docs/performance.md; the limits below are set, not measured). So on CUDA `side_by_side=auto` places as many grids
at once as the device's free memory holds, each grid's need estimated from its model, data and batch (`grid_bytes`),
at most one per core this process may use (each grid's process feeds the device from one) and at most
MAX_SIDE_BY_SIDE. Each grid then trains in a process of its own (joblib's loky processes: a fresh interpreter, no
CUDA state inherited), is told how many share the device (`side_by_side` in its own Hydra record), and shares the
cores (train.threads=auto) and the free memory (train.parallel_runs=auto's groups) among them.

A grid's numbers do not depend on where it trains: its batches and noise come from its own seeded sources."""

from __future__ import annotations

import sys

from dpgrid import DpgridError

MAX_SIDE_BY_SIDE = 8    # grids at once on one GPU at most, whatever its memory holds
MEMORY_SHARE = 0.7      # of the device's free memory, for the grids' estimated needs (the estimate is rough)
CUDA_CONTEXT = 1 << 30  # a process's CUDA context with torch's kernels, cuBLAS's and cuDNN's handles and workspaces
ACTIVATIONS_HELD = 2    # a step's activations are held about twice: its parameter-free layers' outputs, a graph's pool
SETTING = "hydra.launcher.side_by_side"


def check_setting(value) -> int:
    """hydra.launcher.side_by_side as a number of grids (0 for auto); DpgridError naming it otherwise."""
    text = str(value).strip()
    if text == "auto":
        return 0
    if not text.isdigit() or int(text) < 1:
        raise DpgridError(f"{SETTING}={value} is not a number of grids; valid: auto (on a GPU as many as its free memory "
                          "holds, on a CPU one at a time) or a whole number >= 1")
    return int(text)


def side_by_side(launcher, job_overrides) -> tuple:
    """(how many of the sweep's grids train at once, the line that says so and why)."""
    grids, asked = len(job_overrides), check_setting(launcher.side_by_side)
    if asked:
        count = min(asked, grids)
        return count, (f"{grids} grids, {count} side by side ({SETTING}={asked}), each in a process of its own; "
                       "train.threads=auto shares the cores among them")
    if grids <= 1:
        return 1, ""
    from dpgrid.config.compile import resolve_device

    configs = [launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(o)) for o in job_overrides]
    devices = {resolve_device(str(cfg.train.device)) for cfg in configs}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":  # a CPU, or grids spread over devices: one at a time
        return 1, ""
    device = next(iter(devices))
    from dpgrid.config import compile

    read = {}  # each dataset's sizes, read once
    return placed_on_gpu(grids, max(grid_bytes(compile(cfg, plan=False), device, read) for cfg in configs), device)


def placed_on_gpu(grids: int, need: int, device) -> tuple:
    """(grids at once on the CUDA `device`, the line): as many as MEMORY_SHARE of its free memory holds at `need`
    bytes each, at most one per core this process may use and MAX_SIDE_BY_SIDE."""
    import torch

    from dpgrid.training.threads import available_cores

    free = torch.cuda.mem_get_info(device)[0]
    fit, cores = int(MEMORY_SHARE * free // max(1, need)), available_cores()
    count = max(1, min(grids, MAX_SIDE_BY_SIDE, cores, fit))
    bound = ("the sweep's grids" if count == grids else f"at most {MAX_SIDE_BY_SIDE} per GPU" if count == MAX_SIDE_BY_SIDE
             else f"one per core of the {cores} this process may use" if count == cores
             else f"what {MEMORY_SHARE:.0%} of its free memory holds")
    return count, (f"{grids} grids on {device} ({torch.cuda.get_device_name(device)}), {count} side by side ({bound}; "
                   f"each needs about {need / 2 ** 30:.1f} GiB of the {free / 2 ** 30:.1f} GiB free), each in a process "
                   f"of its own; {SETTING}=N sets how many")


def grid_bytes(spec, device, cache: dict) -> int:
    """What one grid (`spec`, compiled with or without its plan) holds on the device at its peak, estimated before it
    trains: a process's CUDA
    context, its data, and its largest group's steps (each run's state and the activations of a Poisson batch padded
    to 1.5 B, dpgrid.training.stacked.bytes_per_run, held ACTIVATIONS_HELD times) with the per-sample forms' measured
    workspace (dpgrid.training.rules.convolution.WORKSPACE_BYTES). The data is read once per dataset (`cache`). One
    MNIST cell (the CNN's runs one at a time) peaked at 2,511 MiB on an H100, its CUDA context included
    (docs/performance.md); this says 3.0 GiB for an MNIST grid."""
    from dpgrid.data import load
    from dpgrid.models import starting_model
    from dpgrid.training.rules.convolution import WORKSPACE_BYTES
    from dpgrid.training.stacked import bytes_per_run, group_size

    key = (spec.dataset.name, spec.data_root)
    if key not in cache:
        data = load(spec.dataset, spec.data_root)
        tensors = {id(t): t for t in (data.x_train, data.y_train, data.x_test, data.y_test)}.values()  # targets as inputs
        cache[key] = (sum(t.numel() * t.element_size() for t in tensors), data.x_train[:1].clone())
    data_bytes, sample = cache[key]
    model = starting_model(spec)
    runs = len(spec.to_train) * spec.train.seeds
    group = group_size(spec.train.parallel_runs, model, spec.strategy_cls, runs, spec.train.batch_size, device,
                       sample)[0]
    step = ACTIVATIONS_HELD * bytes_per_run(model, spec.train.batch_size, activation_elements(model, sample))
    return CUDA_CONTEXT + data_bytes + group * step + WORKSPACE_BYTES


def activation_elements(model, sample) -> int:
    """The elements of one sample's input and of every leaf module's output, followed on the meta device (no
    arithmetic); where the model does not run there, its parameters' count stands in."""
    import copy

    import torch

    meta, total = copy.deepcopy(model).to("meta"), [sample.numel()]

    def count(module, inputs, output):
        if torch.is_tensor(output):
            total.append(output[:1].numel())
    for module in meta.modules():
        if not list(module.children()):
            module.register_forward_hook(count)
    try:
        with torch.no_grad():
            meta(sample[:1].to("meta"))
    except Exception:  # noqa: BLE001  (a forward that reads numbers: the estimate stays rough)
        return sample.numel() + sum(p.numel() for p in model.parameters())
    return sum(total)


def in_processes(launcher, job_overrides, initial_job_idx: int, count: int, line: str) -> list:
    """The grids in `count` processes at once (joblib's loky processes, as Hydra's joblib launcher runs them), said in
    `line` first, each told `count` through its Hydra record (hydra.launcher.side_by_side). A grid that ends in its
    one-line error does not stop the others; once they have finished, the sweep ends in one line naming it, with its
    exit code."""
    from pathlib import Path

    from hydra.core.singleton import Singleton
    from joblib import Parallel, delayed

    print(f"dpgrid: {line}", file=sys.stderr, flush=True)
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    state = Singleton.get_state()
    returns = Parallel(n_jobs=count, backend="loky")(
        delayed(one_job)(initial_job_idx + at, list(overrides), launcher.hydra_context, launcher.config,
                         launcher.task_function, state, count)
        for at, overrides in enumerate(job_overrides))
    ended = [(overrides, r.code) for overrides, r in zip(job_overrides, returns) if isinstance(r, SystemExit)]
    if ended:  # each said why in its own line, from its own process
        codes = [code for _, code in ended if isinstance(code, int) and code]
        raise DpgridError(f"{len(ended)} of the sweep's {len(job_overrides)} grids ended before finishing, each in its "
                          f"line above ({' | '.join(' '.join(o) for o, _ in ended)}); the other grids finished",
                          exit_code=codes[0] if codes else 1)
    return returns


def one_job(idx: int, overrides: list, hydra_context, config, task_function, state: dict, count: int):
    """One grid in a worker process, as Hydra runs a sweep's job (its sweep config, its folder, its record), its
    warnings said as `dpgrid` says them."""
    import warnings

    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals
    from omegaconf import open_dict

    warnings.filterwarnings("ignore", module="opacus")  # as dpgrid.commands.cli.main
    warnings.formatwarning = lambda message, *args, **kwargs: f"dpgrid: warning: {message}\n"
    setup_globals()
    Singleton.set_state(state)
    cfg = hydra_context.config_loader.load_sweep_config(config, overrides)
    with open_dict(cfg):
        cfg.hydra.job.id, cfg.hydra.job.num = f"{cfg.hydra.job.name}_{idx}", idx
        cfg.hydra.launcher.side_by_side = count
    HydraConfig.instance().set_config(cfg)
    try:
        return run_job(hydra_context=hydra_context, config=cfg, task_function=task_function,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except SystemExit as ended:  # a grid refused or stopped (its line said): the grids beside it go on
        return ended


def placed(launcher) -> int:
    """How many grids the launcher placed side by side with this one (1: one after another)."""
    try:
        return max(1, check_setting(launcher.get("side_by_side", "auto")))
    except DpgridError:
        return 1

