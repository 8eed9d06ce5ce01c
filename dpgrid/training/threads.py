"""How many threads torch uses for a grid (train.threads). Intra-op threads help large models and hurt small
ones, and on shared cores they thrash: on a 2-core machine with other processes running, the digits default job
took 18 min with torch's default threads and 1.5 min with one. `auto` takes the cores this process may use
(its CPU affinity, a SLURM allocation), shares them among the jobs a launcher runs in parallel, and gives a
tiny model one thread."""

import contextlib
import os

SMALL_MODEL = 10_000  # parameters: below this a step is overhead-bound, and one thread is fastest


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (a cgroup or taskset), within a SLURM allocation."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    allocated = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if allocated.isdigit() and int(allocated) > 0:
        cores = min(cores, int(allocated))
    return max(1, cores)


def choose(setting: str, model_parameters: int, parallel_jobs: int = 1) -> int:
    """train.threads as a number: N as set, or auto's choice for this model and this many jobs side by side."""
    if str(setting) != "auto":
        cores = available_cores()
        if int(setting) > cores:  # more threads than cores only thrash (and torch cannot take absurd counts)
            import warnings
            warnings.warn(f"train.threads={setting} is more than the {cores} core(s) this process may use: using {cores}")
            return cores
        return int(setting)
    if model_parameters < SMALL_MODEL:
        return 1
    return max(1, available_cores() // max(1, parallel_jobs))


@contextlib.contextmanager
def exact_cuda():
    """On CUDA, within the block: no TF32 (it rounds float32 products to 10 bits of mantissa, ~1e-3 relative: the
    per-sample convolution gradients, hence the clipping, would be that far from float32's), and cuDNN's
    deterministic algorithms (a run on one GPU reproduces itself). Restored afterwards (a notebook's settings)."""
    import torch

    if not torch.cuda.is_available():
        yield
        return
    flags = (torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"), \
        (torch.backends.cudnn, "deterministic"), (torch.backends.cudnn, "benchmark")
    saved = [getattr(owner, name) for owner, name in flags]
    for (owner, name), value in zip(flags, (False, False, True, False)):
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name), value in zip(flags, saved):
            setattr(owner, name, value)


@contextlib.contextmanager
def using(threads: int):
    """torch's intra-op threads set to `threads`, and restored afterwards (a notebook's or a test's process)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
