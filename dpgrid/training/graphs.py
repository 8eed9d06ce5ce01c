"""One step of every run, launched as before or replayed as a CUDA graph (train.cuda_graphs).

On a GPU a small model's private step is bound by kernel launches, not by arithmetic (docs/performance.md): it
launches the per-layer norms, the clip weights, the weighted sums and the noise draw as kernels of microseconds each.
A CUDA graph records a step's kernels once and then launches all of them at once. A graph replays fixed shapes at
fixed addresses with the random streams it was told of, so three things are arranged for it:

- Shapes. A Poisson batch's size b changes every step. On CUDA it is padded to a capacity, b rounded up to a multiple
  of `quantum(B)`, about sqrt(B). b stays within a few sqrt(B) of B, so a grid meets a handful of capacities, and each
  is captured once. A padded row is masked (PerSampleGrads.mask): its loss weight is 0 and its norm is inf, so it is
  in no weighted sum and in no count. Clip weights give min(1, C / inf) = 0, online's second query gives
  1[inf > C] / inf = 0, and fixed_quantile counts through in_batch(). `dpgrid.testing.check_padded` checks this
  against the unpadded batch.
- Addresses. Each capacity's graph reads the batch's rows and mask from buffers of its own, filled before each
  replay. A strategy that rebinds its state (self.clip = self.clip * ...) makes a new tensor every step, and a graph
  would go on reading the old one. `StateBinding` therefore copies each new tensor into the one the graph reads and
  binds that back, after every step, captured or not.
- Randomness. The noise comes from the runs' own CUDA generators, registered with each graph. PyTorch's graph-safe
  philox means a replay draws the numbers an uncaptured step would draw at the same point of the stream. The batches
  are drawn on the CPU, outside the graph.

A capacity's first step is launched as before: it measures the per-sample forms (MethodChoice) and warms the kernels.
Its second step is captured and then replayed, and later ones are replayed. On CUDA the batches are padded whether or
not capture is on, so `train.cuda_graphs=false` gives the same numbers on the same device (tests/test_cuda.py). On the
CPU nothing is padded and nothing is captured.

Capture serves a strategy that says `captures = True`: its step reads no number on the host, keeps its state in
tensors and counts through the mask. It also needs seeded noise (secure noise is drawn on the CPU every step, and a
graph would replay one draw) and the fast or stacked engine. Elsewhere the steps are launched as before.
"""

import math
from dataclasses import dataclass

import torch

from dpgrid.privacy.randomness import to_device

MAX_GRAPHS = 16  # capacities captured per group at most; a rarer one (a tail of the batch size) is launched as before


def quantum(batch_size: int) -> int:
    """The padding step for an expected batch size B: the power of two at or above sqrt(B), at least 8. The realised
    size's standard deviation is at most sqrt(B), so at most 9 capacities cover +-4 deviations, and a padded batch is
    on average sqrt(B) / 2 rows longer: 3 % at B = 256."""
    return max(8, 1 << math.ceil(math.log2(math.sqrt(max(1, batch_size)))))


def capacity(size: int, batch_size: int) -> int:
    """The padded length of a batch of `size` rows: the next multiple of quantum(B), and one quantum for an empty
    batch."""
    step = quantum(batch_size)
    return step * max(1, math.ceil(size / step))


def padded_rows(indices: list, capacity_: int, dtype) -> tuple:
    """(rows, mask) on the CPU for G runs' batches (index tensors of their own sizes), each padded to `capacity_`:
    rows (G, capacity_) of training-set indices (0 where padded), mask (G, capacity_) of `dtype`, 1 for a sampled
    row."""
    rows = torch.zeros((len(indices), capacity_), dtype=torch.long)
    mask = torch.zeros((len(indices), capacity_), dtype=dtype)
    for run, idx in enumerate(indices):
        rows[run, :len(idx)] = idx
        mask[run, :len(idx)] = 1
    return rows, mask


def how_steps_run(device, engine, strategy, sampling: str, watcher, cuda_graphs: bool, padded: bool = None) -> tuple:
    """(padded, captured, why not captured or ''): whether the grid's batches are padded to capacities, and whether
    each capacity's step is replayed as a CUDA graph. `padded`: force padding on or off (dpgrid.testing.check_padded
    pads on the CPU); None: padded on CUDA where capture could serve, whether or not train.cuda_graphs is on."""
    why = ("" if torch.device(device).type == "cuda" else "not on CUDA") or \
        ("" if says_captures(type(strategy)) else f"{type(strategy).__name__} does not say `captures = True`") or \
        ("" if sampling == "poisson" else "train.sampling is not poisson") or \
        ("" if watcher is None else "an observed run's step is watched between its gradients and its update") or \
        ("" if callable(getattr(engine, "padded", None)) else f"the {type(engine).__name__} takes no padded batch") or \
        ("" if all(isinstance(s, torch.Generator) and s.device.type == "cuda" for s in noise_sources(strategy))
         else "the noise is not drawn from the runs' CUDA generators (privacy.secure_rng draws it on the CPU)")
    pad = not why if padded is None else padded
    captured = pad and not why and cuda_graphs
    return pad, captured, why or ("" if cuda_graphs else "train.cuda_graphs=false")


def noise_sources(strategy) -> list:
    """The noise source of each of the strategy's runs (one, or a stacked group's G)."""
    return list(strategy.generator) if strategy.stacked else [strategy.generator]


def says_captures(cls) -> bool:
    """Whether a strategy class says `captures = True` of the step it takes: a subclass that writes its own `step`
    (reading a schedule's t on the host, say) says it again, in its own body; it does not inherit it."""
    for klass in cls.__mro__:
        if "captures" in vars(klass):
            return bool(vars(klass)["captures"])
        if "step" in vars(klass):
            return False
    return False


class StateBinding:
    """A strategy's state tensors (its attributes that are tensors, or lists, tuples or dicts of them) kept at the
    addresses they had after the first step: after each step a tensor a strategy rebound is copied into the one held,
    and held again. Copies are exact: the numbers are those of the step."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.held = {name: value for name, value in vars(strategy).items() if is_state(value)}

    def restore(self, capturing: bool = False) -> None:
        """Copy every rebound state tensor into the one held (`capturing`: copies the graph replays)."""
        for name, now in list(vars(self.strategy).items()):
            if name not in self.held:
                if is_state(now):  # state first made in this step: held from now on
                    if capturing:  # it would live in the graph's memory, which other graphs reuse
                        raise RuntimeError(f"{type(self.strategy).__name__}.{name} first appeared in a captured step: "
                                           "state a step makes later than the first cannot be captured "
                                           "(captures = False)")
                    self.held[name] = now
                continue
            held = self.held[name]
            if now is held:
                continue
            if torch.is_tensor(held):
                held.copy_(now)
            else:
                keys = list(held) if isinstance(held, dict) else range(len(held))
                if not is_state(now) or (list(now) if isinstance(now, dict) else range(len(now))) != keys:
                    raise RuntimeError(f"{type(self.strategy).__name__}.{name} changed its shape between steps: its "
                                       "step cannot be captured (captures = False)")
                for key in keys:
                    if now[key] is not held[key]:
                        held[key].copy_(now[key])
            setattr(self.strategy, name, held)


def is_state(value) -> bool:
    """A tensor, or a non-empty list, tuple or dict of tensors."""
    if torch.is_tensor(value):
        return True
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
    return len(items) > 0 and all(torch.is_tensor(v) for v in items)


@dataclass
class Captured:
    """One capacity's captured step and the buffers it reads its batch from."""
    graph: object
    rows: torch.Tensor
    mask: torch.Tensor


class Steps:
    """Each step of a training loop's runs: their batches drawn (one per run, from its own sampler), padded where
    `padded`, the engine's per-sample gradients and the strategy's step; where `captured`, each capacity's step
    replayed as a CUDA graph (the module docstring)."""

    def __init__(self, engine, strategy, data, samplers: list, padded: bool = False, captured: bool = False,
                 watcher=None):
        self.engine, self.strategy, self.data, self.samplers = engine, strategy, data, samplers
        self.padded, self.captured, self.watcher = padded, captured, watcher
        self.binding = None  # made after the first step, when the strategy's lazily made state exists
        self.graphs, self.launched = {}, set()  # capacity -> its graph; capacities launched once uncaptured
        self.stream = self.pool = None

    def __call__(self, step: int) -> None:
        indices = [next(s) for s in self.samplers]
        if not self.padded:
            grads = self.engine.gradients(self.data, indices)
            if self.watcher is not None:
                self.watcher.before_step(step, self.strategy)
            self.strategy.step(grads)
            if self.watcher is not None:
                self.watcher.after_step(step, self.strategy)
            return
        size = capacity(max(len(i) for i in indices), self.strategy.batch_size)
        rows, mask = padded_rows(indices, size, self.data.x_train.dtype)
        if not self.captured:
            return self.launch(rows, mask)
        if self.stream is None:  # uncaptured steps, captures and replays on one side stream, as capture needs
            self.stream = torch.cuda.Stream(self.data.x_train.device)
        self.stream.wait_stream(torch.cuda.current_stream(self.data.x_train.device))
        with torch.cuda.stream(self.stream):
            captured = self.graphs.get(size)
            if captured is None and size in self.launched and len(self.graphs) < MAX_GRAPHS:
                captured = self.graphs[size] = self.capture(rows, mask)
            if captured is None:
                self.launched.add(size)
                self.launch(rows, mask)
            else:
                captured.rows.copy_(rows.pin_memory(), non_blocking=True)
                captured.mask.copy_(mask.pin_memory(), non_blocking=True)
                captured.graph.replay()
        torch.cuda.current_stream(self.data.x_train.device).wait_stream(self.stream)  # validation reads the result

    def launch(self, rows, mask) -> None:
        """One padded step, its kernels launched one by one."""
        device = self.data.x_train.device
        self.strategy.step(self.engine.padded(self.data, to_device(rows, device), to_device(mask, device)))
        if self.binding is None:
            self.binding = StateBinding(self.strategy)
        self.binding.restore()

    def capture(self, rows, mask):
        """The step of this capacity captured as a graph, with its own row and mask buffers (not yet run)."""
        device = self.data.x_train.device
        graph = torch.cuda.CUDAGraph()
        captured = Captured(graph, rows.to(device), mask.to(device))
        for source in noise_sources(self.strategy):
            graph.register_generator_state(source)  # its offsets advance on each replay as they would uncaptured
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                self.strategy.step(self.engine.padded(self.data, captured.rows, captured.mask))
                self.binding.restore(capturing=True)
        except Exception as error:
            # nothing of the step ran, but the strategy's Python state saw a step: the run cannot go on truthfully
            raise RuntimeError(f"train.cuda_graphs: the step of {type(self.strategy).__name__} could not be captured "
                               f"({type(error).__name__}: {error}); train.cuda_graphs=false launches it as "
                               "before") from error
        self.pool = self.pool or graph.pool()  # the capacities' graphs never run at once: one memory pool
        return captured
