"""How the process computes a grid: how many threads torch uses (train.threads), and how freed memory is kept.

Threads (train.threads). Intra-op threads help large models and hurt small
ones, and on shared cores they thrash: on a 2-core machine with other processes running, the digits default job
took 18 min with torch's default threads and 1.5 min with one. `auto` takes the cores this process may use
(its CPU affinity, a SLURM allocation), shares them among the jobs a launcher runs in parallel, and gives a
tiny model one thread."""

import contextlib
import ctypes
import ctypes.util
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


# glibc's malloc trims the top of its heap whenever more than M_TRIM_THRESHOLD is free there (by default twice
# its dynamic mmap threshold, at most 64 MiB) and serves larger blocks by mmap, so a step's big fresh tensors
# (the CNN's 24 MiB activations and 16 MiB per-sample gradients at B = 512) are page-faulted in and zeroed by the
# kernel again on every step. Measured with scripts/bench.py on a 2-core AMD EPYC (torch 2.13.0 CPU): the MNIST
# CNN's non-private step 0.188 -> 0.099 s and fixed_threshold's 0.226 -> 0.154 s; the autoencoder's 0.33 -> 0.25
# and 0.55 -> 0.43 s. Peak memory does not change; what a grid freed stays with the process until it ends
# (malloc_trim gives it back).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_HEAP = (32 << 20, 1 << 30)  # mmap above 32 MiB (glibc's largest threshold), trim above 1 GiB free
ALLOCATOR_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_",
                      "GLIBC_TUNABLES", "LD_PRELOAD")


def glibc():
    """The C library when it is glibc (its mallopt and malloc_trim), else None (macOS, Windows, musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (glibc only)
        return libc
    except (OSError, AttributeError, TypeError):
        return None


def keep_freed_memory() -> str:
    """Make glibc keep freed blocks of up to 32 MiB for reuse instead of returning them to the kernel, for the rest
    of the process (no result depends on it). What was done, in words: "" where it was left alone: not glibc, or the
    user chose the allocator's settings (MALLOC_*_ variables, GLIBC_TUNABLES) or another allocator (LD_PRELOAD)."""
    if any(os.environ.get(name) for name in ALLOCATOR_SETTINGS):
        return ""
    libc = glibc()
    if libc is None:
        return ""
    mmap_threshold, trim_threshold = KEPT_HEAP
    if not (libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold) and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)):
        return ""
    return f"glibc malloc keeps freed memory (mmap threshold {mmap_threshold >> 20} MiB, trim threshold 1 GiB)"


@contextlib.contextmanager
def reusing_freed_memory():
    """keep_freed_memory within the block; afterwards the heap's free memory goes back to the kernel (a notebook's
    process goes on after the grid)."""
    done = keep_freed_memory()
    try:
        yield done
    finally:
        if done:
            glibc().malloc_trim(0)
