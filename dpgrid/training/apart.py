"""Samples stay apart: a model is refused before anything trains where changing one example of a batch changes another
example's output, or where its training forward writes a statistic of the batch into the model.

DP-SGD's analysis bounds what one example can change by clipping that example's own gradient. That holds only if the
example's gradient is all it changes: a model that mixes the samples of a batch (h - h.mean(0), BatchNorm's batch
statistics, an attention across the batch) moves every other example's gradient too, by as much as the batch allows,
and no per-sample engine, fast or torch.func, can clip that (torch.func would train each example on a batch of one,
another model). A module that updates a buffer from the batch (a running mean) keeps an un-noised statistic of the
private data in the model, which the next steps read and the release carries. So, as training runs the model (train
mode, gradients enabled: a layer may mix samples only where autograd is on) and at the batch sizes a Poisson batch
takes (`check_sizes`: both ends, B -+ 7 standard deviations, of every phase's expected batch; the largest a
CUDA-padded batch's capacity), on a float64 copy (float32 where the model fails in float64: dpgrid.training.choice):

1. one forward of public examples, every tensor the modules keep compared before and after (buffers, persistent or
   not, and tensor attributes: `kept_tensors`), and the eval-mode output on a fixed public batch (EVAL_ROWS examples)
   before and after: a statistic kept where no tensor holds it (a Python number) shows there, as validation would read
   it;
2. two forwards of the same public examples, the second with its last example replaced by another, with the same
   random draws (dropout's masks are the same in both: torch's generators are seeded alike before each), and every
   other example's output compared, exactly (a model that keeps samples apart computes each row from its own input:
   the other rows are the same numbers, bit for bit; a NaN equal to a NaN, as an example's own NaN is no mixing);
3. where an output differs, the module where the mixing is seen, found by hooks on every module: the innermost whose
   call's output differs at another example while its inputs do not (its own forward mixes them). Which dimension of
   a tensor holds the samples is found as the fast engine's layout is, by a third forward one example larger.

Only public examples (the test split) are read, so the outcome spends no privacy. Cost: for each size, two forwards
with gradients enabled (nothing backpropagated) and two eval-mode forwards of EVAL_ROWS examples (and, where they show
mixing, three more with every module's call recorded, to locate it; scripts/bench.py's `proof` row measures it).
The check runs once, before training, on a copy: a model whose forward mixes samples only at batch sizes strictly
between the ends (a window made to deceive), only after some steps (a counter), or only for some values of the data is
not seen (docs/extending.md: such a model trains with train.engine=func); any mixing at an end, in train mode, is.
"""

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

DEVIATIONS = 7  # a Poisson batch's size leaves B -+ 7 sd with probability below 1e-11 per step


def check_sizes(batch_size: float, sample_rate: float, n_train: int, padded_to=None) -> tuple:
    """The batch sizes the check runs at: the smallest and largest a Poisson batch reaches with overwhelming
    probability (B -+ 7 sqrt(B (1 - q)), within [2, N]), the largest padded to its capacity where `padded_to` (a
    function of the size) pads it; the full batch alone when q = 1."""
    if sample_rate >= 1.0:
        return (n_train,)
    spread = DEVIATIONS * math.sqrt(batch_size * (1.0 - sample_rate))
    low = max(2, math.floor(batch_size - spread))
    high = min(n_train, math.ceil(batch_size + spread))
    if padded_to is not None:
        high = padded_to(high)
    return tuple(sorted({low, max(high, low)}))


@dataclass
class Call:
    """One module call of a recorded forward: the module, when it started and ended among the calls (its descendants'
    calls lie inside), its positional tensor inputs and its tensor outputs."""
    module: nn.Module
    start: int
    end: int = -1
    inputs: tuple = ()
    outputs: tuple = ()


def tensors_of(value) -> tuple:
    if torch.is_tensor(value):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(t for v in value for t in tensors_of(v))
    if isinstance(value, dict):
        return tuple(t for v in value.values() for t in tensors_of(v))
    return ()


def recorded_forward(model: nn.Module, x: torch.Tensor, seed: int, state: tuple = None, record: bool = False,
                     grad: bool = True) -> tuple:
    """(the model's output tensors, [Call of every module call], empty unless `record`): one forward, from `state`
    (snapshot; None: as the model is), its random draws seeded with `seed` (on the CPU and on x's CUDA device), with
    gradients enabled as training runs it (`grad`; a layer may mix samples only where autograd is on) though nothing is
    backpropagated, and every tensor returned detached. Recording keeps a copy of every module's inputs and outputs:
    only asked for where the outputs showed mixing."""
    calls, open_calls, counter = [], {}, [0]

    def before(module, inputs):
        call = Call(module, counter[0], inputs=tuple(t.detach().clone() for t in tensors_of(inputs)))
        counter[0] += 1
        open_calls.setdefault(module, []).append(call)

    def after(module, inputs, output):
        call = open_calls[module].pop()
        call.end, call.outputs = counter[0], tuple(t.detach().clone() for t in tensors_of(output))
        counter[0] += 1
        calls.append(call)

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(before),
                                                    m.register_forward_hook(after))] if record else []
    devices = [x.device] if x.device.type == "cuda" else []
    try:
        if state is not None:
            restore(model, state)
        with torch.random.fork_rng(devices=devices), torch.set_grad_enabled(grad):
            torch.manual_seed(seed)
            out = tuple(t.detach() for t in tensors_of(model(x)))
    finally:
        for handle in handles:
            handle.remove()
    calls.sort(key=lambda c: c.start)
    return out, calls


def kept_tensors(model: nn.Module) -> dict:
    """{'module.name': tensor} of every tensor the modules keep but their parameters: their buffers, persistent or not,
    and their tensor attributes (a statistic kept outside the state dict is kept all the same)."""
    found = {}
    for prefix, module in model.named_modules():
        for name, value in [*module.named_buffers(recurse=False), *vars(module).items()]:
            if torch.is_tensor(value) and not isinstance(value, nn.Parameter):
                found[f"{prefix}.{name}" if prefix else name] = value
    return found


def snapshot(model: nn.Module) -> tuple:
    """(the state dict, the kept tensors), copied: what restore puts back."""
    return (copy.deepcopy(model.state_dict()), {k: v.detach().clone() for k, v in kept_tensors(model).items()})


def restore(model: nn.Module, state: tuple) -> None:
    """The model as snapshot found it: its state dict loaded, its kept tensors copied back (in place where the tensor
    is the same size, so that modules sharing one still do; a tensor the forward added removed)."""
    params, kept = state
    for key in kept_tensors(model).keys() - kept.keys():
        module_name, _, name = key.rpartition(".")
        delattr(model.get_submodule(module_name), name)
    model.load_state_dict(params)
    now = kept_tensors(model)
    for key, value in kept.items():
        module_name, _, name = key.rpartition(".")
        current = now.get(key)
        if current is not None and current.shape == value.shape and current.dtype == value.dtype:
            with torch.no_grad():
                current.copy_(value)
        else:
            setattr(model.get_submodule(module_name), name, value.clone())


def kept_changes(model: nn.Module, state: tuple) -> str:
    """The first kept tensor a forward changed, added or removed, 'module.name' ('' where none)."""
    before, now = state[1], kept_tensors(model)
    for key in sorted(before.keys() | now.keys()):
        if key not in before or key not in now or not same(before[key], now[key]):
            return key
    return ""


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b hold the same numbers, bit for bit, a NaN equal to a NaN where both hold one (torch.equal
    alone calls them different: a NaN in one example's own row is no mixing)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    nan_a, nan_b = a.isnan(), b.isnan()
    return torch.equal(nan_a, nan_b) and torch.equal(a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0))


def differs_beside(a: torch.Tensor, b: torch.Tensor, dim, row: int) -> bool:
    """Whether a and b differ anywhere but at sample `row` of dimension `dim` (anywhere at all where no dimension holds
    the samples: a tensor every sample shares)."""
    if a.shape != b.shape:
        return True
    if dim is None:
        return not same(a, b)
    keep = [i for i in range(a.shape[dim]) if i != row]
    index = torch.tensor(keep, device=a.device)
    return not same(a.index_select(dim, index), b.index_select(dim, index))


def sample_dim(small: torch.Tensor, large: torch.Tensor, b: int):
    """The dimension holding the samples, from a tensor's shapes at b and b + 1 samples; None for none (the same shape);
    'unknown' otherwise."""
    if small.shape == large.shape:
        return None
    if small.dim() != large.dim():
        return "unknown"
    changed = [k for k, (p, q) in enumerate(zip(small.shape, large.shape)) if p != q]
    return changed[0] if len(changed) == 1 and small.shape[changed[0]] == b and large.shape[changed[0]] == b + 1 \
        else "unknown"


def replacement(x: torch.Tensor, row: int) -> torch.Tensor:
    """x with example `row` replaced by the first other public example that differs from it."""
    for other in range(len(x)):
        if not same(x[other], x[row]):
            changed = x.clone()
            changed[row] = x[other]
            return changed
    changed = x.clone()  # every public example alike: a perturbed one
    changed[row] = x[row] + 1 if x.is_floating_point() else (x[row] + 1) % max(2, int(x.max()) + 1)
    return changed


def public_batch(x: torch.Tensor, size: int) -> torch.Tensor:
    """`size` rows of the public examples (repeated where they are fewer), rolled so that the last row is not a repeat
    of the first rows' examples where there are enough."""
    return x[torch.arange(size, device=x.device) % len(x)]


def where_mixed(model: nn.Module, x: torch.Tensor, changed: torch.Tensor, calls: list, changed_calls: list,
                seed: int, state: dict) -> str:
    """The innermost module whose call's output differs at another example while its inputs do not, in words."""
    b, row = len(x), len(x) - 1
    _, larger = recorded_forward(model, public_batch(torch.cat([x, x[:1]]), b + 1), seed, state, record=True)
    names = {m: name or "the model" for name, m in model.named_modules()}
    if len(larger) != len(calls) or len(changed_calls) != len(calls) or \
            any(c.module is not d.module for c, d in zip(calls, larger)):
        return "its forward calls other modules when one example changes or the batch grows by one"
    mixing = []
    for call, other, bigger in zip(calls, changed_calls, larger):
        if len(call.outputs) != len(bigger.outputs) or len(call.inputs) != len(bigger.inputs):
            continue
        dims_in = [sample_dim(s, t, b) for s, t in zip(call.inputs, bigger.inputs)]
        dims_out = [sample_dim(s, t, b) for s, t in zip(call.outputs, bigger.outputs)]
        if "unknown" in dims_in or "unknown" in dims_out:
            continue
        inputs_mixed = any(differs_beside(s, t, d, row) for s, t, d in zip(call.inputs, other.inputs, dims_in))
        output_mixed = any(differs_beside(s, t, d, row) for s, t, d in zip(call.outputs, other.outputs, dims_out))
        if output_mixed and not inputs_mixed:
            mixing.append(call)
    innermost = [c for c in mixing if not any(d is not c and c.start < d.start and d.end < c.end for d in mixing)]
    if not innermost:
        return "where, its hooks cannot tell (the mixing happens in code no module's call delimits)"
    first = min(innermost, key=lambda c: c.end)
    module = first.module
    own = " in its own forward" if any(c.start > first.start and c.end < first.end for c in calls) else ""
    return f"{type(module).__name__} '{names[module]}' mixes them{own}"


EVAL_ROWS = 8  # the fixed public batch whose eval-mode outputs must not change with a training forward


def mixing(model: nn.Module, x: torch.Tensor, sizes: tuple, dtype: torch.dtype = torch.float64) -> str:
    """'' where the model keeps samples apart in train mode at every size of `sizes`; else one line naming the module
    (module docstring). `x`: public examples; `dtype`: the copy's (float64, or the model's own where float64 fails)."""
    twin = copy.deepcopy(model).to(dtype)
    x = x.to(dtype) if x.is_floating_point() else x
    state = snapshot(twin)
    names = {m: name or "the model" for name, m in twin.named_modules()}
    probe = public_batch(x, EVAL_ROWS)
    in_eval = evaluated(twin, probe, state)  # leaves the copy in train mode, as training runs it
    for seed, size in enumerate(sizes):
        batch = public_batch(x, size)
        out, _ = recorded_forward(twin, batch, seed, state)
        kept = kept_changes(twin, state)
        if kept:
            module_name, _, name = kept.rpartition(".")
            module = twin.get_submodule(module_name)
            what = "buffer" if name in dict(module.named_buffers(recurse=False)) else "attribute"
            return (f"model: {type(module).__name__} '{names[module]}' updates its {what} '{name}' from the batch in "
                    "training: an un-noised statistic of the private data, which later steps read and the release "
                    "carries, and which no per-sample engine (torch.func neither) clips; use a module without batch "
                    "statistics (GroupNorm or LayerNorm for BatchNorm)")
        after = evaluated(twin, probe)
        if len(after) != len(in_eval) or not all(same(a, b) for a, b in zip(after, in_eval)):
            return ("model: a training forward changes what it computes in eval mode (a statistic of the batch kept "
                    "where no buffer or tensor attribute holds it): validation on the public test set would read an "
                    "un-noised statistic of the private data, and its scores are released; keep no state of the "
                    "batches (GroupNorm or LayerNorm for BatchNorm)")
        changed = replacement(batch, size - 1)
        other, _ = recorded_forward(twin, changed, seed, state)
        if not out or any(t.shape[:1] != (size,) for t in out):
            continue  # an output without the batch first: the loss refuses it (the model does not fit its data)
        if any(differs_beside(s, t, 0, size - 1) for s, t in zip(out, other)):
            del out, other  # the two forwards again, every module's call recorded, to find where
            calls, changed_calls = (recorded_forward(twin, b, seed, state, record=True)[1] for b in (batch, changed))
            where = where_mixed(twin, batch, changed, calls, changed_calls, seed, state)
            return (f"model: changing one example of a batch of {size} changes the others' outputs in training: {where}; "
                    "DP-SGD's clipping bounds one example's own gradient only, and no per-sample engine (torch.func "
                    "neither: it would train each example on a batch of one) can clip what it moves in the others; "
                    "keep the samples apart (GroupNorm or LayerNorm for BatchNorm)")
    return ""


def evaluated(model: nn.Module, x: torch.Tensor, state: tuple = None) -> tuple:
    """The model's eval-mode output tensors on `x`, without gradients, as validation runs it (from `state` where
    given; as the model is otherwise); the model back in train mode after."""
    model.eval()
    try:
        return recorded_forward(model, x, 0, state, grad=False)[0]
    finally:
        model.train()
