"""The engine a grid trains with, chosen before it trains: the samples-apart check (dpgrid.training.apart) and the fast
engine's proof (dpgrid.training.proof), run where training runs the model, decide between the fast engine, torch.func
and a refusal.

Both run on a float64 copy of the model. Where the model fails there (it calls x.float(), allocates a float32 scratch
tensor, or a float64 copy does not fit in memory at the largest size), both run again on a float32 copy, the proof's
tolerance 1e-4 relative (proof.TOLERANCE: float32 rounding of two summation orders stays below 6e-7 on every built-in
model, tests/test_proof.py, and every wrong gradient found was 0.2 % off or more), and the engine line says so; where
that fails too, one line names the model and the cause, out of memory included (`checked`).
"""

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from dpgrid.training.apart import mixing
from dpgrid.training.persample import ModelLayout
from dpgrid.training.proof import TOLERANCE, first_line, prove, seeded


@dataclass(frozen=True)
class EngineChoice:
    """The per-sample engine a grid trains with, and what was proved: `name` fast or func; `stacks` whether runs may
    train stacked (the stacked engine proved too); `error` the largest relative difference from torch.func measured
    (nan where torch.func itself trains); `said` one line for the log."""
    name: str
    layout: ModelLayout = field(default_factory=ModelLayout)
    stacks: bool = True
    error: float = math.nan
    said: str = ""


def choose_engine(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, setting: str, could_stack: bool,
                  parallel_runs: str, sizes: tuple = (8,)) -> EngineChoice:
    """The engine a grid trains with, proved on the public examples `x`, `y` at the batch sizes training takes
    (`sizes`, dpgrid.training.apart.check_sizes; the proof runs at the largest). First, whatever the engine, the model
    must keep samples apart there (dpgrid.training.apart: a DpgridError naming the module otherwise). `setting` is
    train.engine (auto: the fast engine where the proof holds, else torch.func with a warning; fast: the fast engine or
    a DpgridError naming the layer; func: torch.func, the reference, run once on the first batch); `could_stack`: the
    grid's runs would train stacked (train.parallel_runs, a Sequential model, a stacking strategy), so the stacked
    engine is proved too (where it is not proved: one run at a time, with a warning, or a DpgridError where
    train.parallel_runs names a number)."""
    import warnings

    from dpgrid import DpgridError

    proved, dtype, fallback = checked(model, task, x, y, setting, could_stack, sizes)
    kind = dtype_name(dtype) + (f" (float64 failed: {fallback})" if fallback else "")
    apart = f"samples kept apart in train mode at batch sizes {' and '.join(str(n) for n in sizes)}, {kind}"
    if setting == "func":
        check_func(model, task, x, y)
        return EngineChoice("func", stacks=could_stack, said=f"per-sample engine: torch.func (train.engine=func), the "
                                                              f"reference; {apart}")
    layout, disagreement, stacked, error = proved
    if disagreement:
        if setting == "fast":
            raise DpgridError(f"train.engine=fast: {disagreement}; train.engine=auto trains such a model on the exact "
                              "torch.func engine")
        check_func(model, task, x, y, f"the fast engine failed its proof ({disagreement}), and ")
        warnings.warn(f"the fast engine steps aside: {disagreement}; training on the exact torch.func engine (slower, "
                      "more memory; train.engine=auto)")
        return EngineChoice("func", layout, stacks=False, said=f"per-sample engine: torch.func, the fast engine "
                                                                f"failed its proof ({disagreement}); {apart}")
    if stacked:
        if parallel_runs != "auto":
            raise DpgridError(f"train.parallel_runs={parallel_runs}: {stacked}; train.parallel_runs=1 trains one run "
                              "at a time on the proved fast engine")
        warnings.warn(f"runs train one at a time: {stacked} (train.parallel_runs=auto)")
    return EngineChoice("fast", layout, stacks=could_stack and not stacked, error=error,
                        said=f"per-sample engine: fast{', stacked' if could_stack and not stacked else ''}, proved "
                             f"against per-sample autograd on a batch of {layout.size} test examples in train mode, "
                             f"{dtype_name(dtype)} (largest relative difference {error:.1e}, tolerance "
                             f"{TOLERANCE[dtype]:.0e}); {apart}")


def checked(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, setting: str, could_stack: bool,
            sizes: tuple) -> tuple:
    """(prove's answer, None under train.engine=func; the dtype the checks ran in; why float64 failed, '' where it
    did not): the samples-apart check (a DpgridError where the model mixes them) and the proof, on a float64 copy of
    the model, or, where the model fails there (it casts its input with x.float(), allocates a float32 scratch tensor,
    or float64 does not fit in memory at the largest size), on a float32 copy, the proof's tolerance 1e-4 (float32
    rounding of two summation orders). Where that fails too: one line naming the model and the cause."""
    from dpgrid import DpgridError

    own = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    failures, out_of_memory, stage = [], False, ""
    for dtype in (torch.float64, torch.float32) if own != torch.float64 else (torch.float64,):
        stage = "the samples-apart check"
        try:
            mixed = mixing(model, x, sizes, dtype)
            if mixed:
                raise DpgridError(mixed)
            stage = "the proof"
            proved = None if setting == "func" else prove(model, task, x, y, could_stack, max(sizes), dtype)
            return proved, dtype, "; ".join(failures)
        except DpgridError:
            raise
        except Exception as e:  # noqa: BLE001 (what the model raises: retried in float32, else named in one line)
            out_of_memory = isinstance(e, torch.OutOfMemoryError)
            failures.append(f"{stage} in {dtype_name(dtype)}: {type(e).__name__}: {first_line(e)}")
        free_memory(x.device)
    if out_of_memory:
        cure = "lower train.batch_size" + (", or use train.engine=func (which runs no proof)"
                                           if stage == "the proof" else " (training's batches reach this size)")
        raise DpgridError(f"model: {type(model).__name__} runs out of memory in {stage} before training, at batch size "
                          f"{max(sizes)} (the largest a Poisson batch reaches, B + 7 standard deviations): "
                          f"{'; '.join(failures)}; {cure}")
    raise DpgridError(f"model: {type(model).__name__} fails in the checks before training ({'; '.join(failures)}); "
                      "a model dpgrid trains must run in train mode, with gradients, in float64 or float32")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def free_memory(device) -> None:
    """What a failed check held returned to the device before the next try."""
    import gc

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def check_func(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, before: str = "") -> None:
    """torch.func's engine run once on a few public examples in train mode, on a copy of the model: a DpgridError in
    one line, before anything trains, where it cannot differentiate the model per sample."""
    from dpgrid import DpgridError
    from dpgrid.training.persample import FuncEngine

    twin = copy.deepcopy(model)
    twin.train()
    rows = min(4, len(x))
    try:
        with seeded(0, x.device):
            FuncEngine(twin, task)(x[:rows], y[:rows]).norms
    except DpgridError:
        raise
    except Exception as e:
        raise DpgridError(f"model: {before}torch.func cannot differentiate it per sample ({type(e).__name__}: "
                          f"{first_line(e)}); a model trained privately needs per-sample gradients of each example's "
                          "own loss") from None
