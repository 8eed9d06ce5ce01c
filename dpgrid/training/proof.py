"""The fast engine proves itself on every grid's first batch, or steps aside.

The fast engine's rules are exact for the layers they serve (dpgrid.testing.check_rule proves each against per-sample
autograd), but a rule reads what the model around the layer gives it: the layer's input, and the gradient reaching its
output. A model can break that without a word: an in-place operation after the layer (ReLU(inplace=True), h.mul_(2))
overwrites the output the rule's gradient belongs to; a layer called without the batch (nanoGPT's wpe(arange(T)))
or on a sequence-first tensor puts something else where the samples were expected; a weight also used outside its
layer (F.linear(x, layer.weight)) gets gradient the layer's rule never sees. So before a grid trains:

Both run where training runs the model: in train mode (dropout on, its masks the same in every forward of a step of
the proof: torch's generators are seeded alike before each), with gradients enabled, at the batch size training reaches (`size`: the largest a
Poisson batch takes with overwhelming probability, a CUDA-padded batch's capacity), after dpgrid.training.apart has
checked that the model keeps samples apart there and at the smallest such size:

1. **Where the samples are** (`find_layout`): the model runs on two batch sizes b1 < b2 of public examples (the test
   split), b1 at least the training size, chosen so that neither equals any dimension of any parametrised layer's input
   or output; a layer whose output has b1 rows at one dimension where it has b2 at the other, and is otherwise
   unchanged, carries the samples there; a layer whose input and output do not change carries none (its output is
   shared by every sample: each sample is handed its own view of it, and the rule reads each sample's gradient there).
   Anything else is named as the reason the fast engine cannot serve the model. A layer whose input or output the
   forward then changes in place is marked to keep a copy of it. Never a guess from one shape: a batch of exactly T
   samples cannot be mistaken for T positions. Which layers are called, and their shapes but for the samples, are
   the proved call pattern: a training forward that calls another layer, a layer again, or a layer with other shapes
   stops the grid in one line (FastEngine), as an in-place change is caught and served.
2. **The proof** (`prove`): on a batch of b1 public examples, in a float64 copy of the model in train mode, the engine
   the grid will train with computes per-sample norms, per-layer norms, and the clipped weighted sum (clip weights
   min(1, C / n_i) at the median norm) with a second row of weights, on PROOF_ROWS examples spread over the batch (the
   others weighted 0); the exact per-sample gradients of those examples are each example's own loss backpropagated
   through the same forward of the whole batch (same mode, same size, same dropout masks: what training computes,
   which per-sample gradients are only because the samples were shown to stay apart). They must agree to RTOL: 1e-6
   relative, where float64 rounding of two summation orders stays below 1e-10 on every built-in model
   (tests/test_proof.py measures it) and every wrong per-sample gradient found so far was off by 0.2 % or more.

When they disagree, the first parametrised layer (in model order) whose per-layer norms differ is named, with why
where it can be told (its parameters also receive gradient outside their layer's call; its rule differs from
torch.func for this use). The grid then trains on torch.func (train.engine=auto) or is refused (train.engine=fast).
The stacked engine (train.parallel_runs) is proved against the one-run exact gradients in eval mode, two runs of
different initialisations, one padded: it serves Sequential models only, whose parametrised layers are dpgrid's rules
and whose parameter-free modules are either known to act on each sample alone (dropout, activations; applied to the
group's samples at once) or applied run by run at the one-run batch size the train-mode checks above covered
(dpgrid.training.stacked.PER_SAMPLE). torch.func, where it trains, is run once on the first batch in train mode, so
that a model it cannot differentiate per sample is refused before anything trains.

Both run on a float64 copy of the model, or on a float32 copy where the model fails in float64, at tolerance
TOLERANCE (dpgrid.training.choice, which runs them and chooses the engine).

Only public examples are read, so the outcome (which engine trains) spends no privacy.
"""

import contextlib
import copy
import itertools
import math

import torch
from torch import nn

from dpgrid.training.persample import LayerLayout, ModelLayout
from dpgrid.training.rules import MethodChoice, rule_for

RTOL = 1e-6  # module docstring
TOLERANCE = {torch.float64: RTOL, torch.float32: 1e-4}  # the proof's, by the dtype it runs in (module docstring)
PROOF_FORMS = "proof"  # a MethodChoice setting no rule offers: each rule's first form, untimed


def layer_names(model: nn.Module) -> dict:
    return {module: name or "the model" for name, module in model.named_modules()}


def described(model: nn.Module, module: nn.Module) -> str:
    return f"{type(module).__name__} '{layer_names(model)[module]}'"


def observe(model: nn.Module, layers: list, x: torch.Tensor, seed: int = 0) -> dict:
    """{layer: [(input shape or None, output shape, whether its input or output changed in place later), per call]}
    of one forward in the model's mode, with gradients enabled as training runs it (nothing backpropagated), its
    random draws seeded with `seed`."""
    calls = {m: [] for m in layers}

    def record(module, inputs, output):
        first = inputs[0] if inputs and torch.is_tensor(inputs[0]) else None
        calls[module].append([first, output, None if first is None else first._version, output._version])

    handles = [m.register_forward_hook(record) for m in layers]
    try:
        with torch.enable_grad(), seeded(seed, x.device):
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    found = {}
    for module, seen in calls.items():
        found[module] = [(None if a is None else tuple(a.shape), tuple(out.shape),
                          (a is not None and a._version != a_version) or out._version != out_version)
                         for a, out, a_version, out_version in seen]
    return found


@contextlib.contextmanager
def seeded(seed: int, device):
    """torch's generators (the CPU's, and `device`'s where it is CUDA) seeded with `seed` inside, restored after: two
    forwards seeded alike draw the same dropout masks."""
    devices = [device] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def samples_at(shape_1, shape_2, b1: int, b2: int):
    """The dimension holding the samples given a tensor's shapes at b1 and b2 samples; None for none (the same shape);
    'unknown' where the shapes change otherwise."""
    if shape_1 == shape_2:
        return None
    if len(shape_1) != len(shape_2):
        return "unknown"
    changed = [k for k, (p, q) in enumerate(zip(shape_1, shape_2)) if p != q]
    if len(changed) == 1 and shape_1[changed[0]] == b1 and shape_2[changed[0]] == b2:
        return changed[0]
    return "unknown"


def find_layout(model: nn.Module, layers: list, x: torch.Tensor, size: int = 5) -> ModelLayout:
    """Where each of `layers` carries the samples, and the call pattern proved (module docstring, step 1); `x`: public
    examples (at least 2); `size`: the smallest batch size to run at (the training size)."""
    small = observe(model, layers, x[:2])
    dims = {d for calls in small.values() for a, out, _ in calls for shape in (a or (), out) for d in shape}
    b1 = next(n for n in itertools.count(max(5, size)) if n not in dims)
    b2 = next(n for n in itertools.count(b1 + 1) if n not in dims)
    first = observe(model, layers, public_rows(x, b1))
    second = observe(model, layers, public_rows(x, b2))
    found = []
    for module in layers:
        one, two = first[module], second[module]
        what = described(model, module)
        if len(one) > 1 or len(two) > 1:
            return ModelLayout(problem=f"{what} is called {max(len(one), len(two))} times in one forward (its weights "
                                       "shared), which the fast engine would clip as separate layers")
        if not one and not two:  # never called: its gradient is zero, and the engine adds nothing for it
            found.append(LayerLayout(called=False))
            continue
        if len(one) != len(two):
            return ModelLayout(problem=f"{what} is called for some batch sizes and not others")
        (a1, out1, changed1), (a2, out2, changed2) = one[0], two[0]
        if a1 is None:
            return ModelLayout(problem=f"{what} is called without a positional input tensor")
        at_input, at_output = samples_at(a1, a2, b1, b2), samples_at(out1, out2, b1, b2)
        if "unknown" in (at_input, at_output) or at_input != at_output:
            return ModelLayout(problem=f"{what}: its input is {a1} and output {out1} for {b1} samples, {a2} and "
                                       f"{out2} for {b2}: the engine cannot tell which numbers are whose")
        found.append(LayerLayout(batch_dim=at_output, copies=changed1 or changed2,
                                 shapes=(without_samples(a1, at_input), without_samples(out1, at_output))))
    return ModelLayout(tuple(found), proved=True, size=b1)


def without_samples(shape: tuple, batch_dim) -> tuple:
    """A shape with the dimension that holds the samples written -1 (any batch size)."""
    return tuple(-1 if k == batch_dim else n for k, n in enumerate(shape))


def public_rows(x: torch.Tensor, size: int) -> torch.Tensor:
    """`size` rows of the public examples `x` (repeated where it holds fewer)."""
    return x[torch.arange(size, device=x.device) % len(x)]


def exact(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor):
    """The exact per-sample gradients of the model's parameters that train, as PerSampleGrads: each example's loss
    backpropagated through the model called on that example alone (torch.func's engine, one example at a time)."""
    from dpgrid.training.persample import materialised, parameter_groups, per_sample_losses, trainable

    params = trainable(model)
    rows = []
    for i in range(len(x)):
        loss = per_sample_losses(model(x[i:i + 1]), y[i:i + 1], task).sum()
        found = torch.autograd.grad(loss, params, allow_unused=True)
        rows.append([torch.zeros_like(p) if g is None else g for p, g in zip(params, found)])
    return materialised([torch.stack(column) for column in zip(*rows)], parameter_groups(model), x.device)


def reference_copy(model: nn.Module, mode: str = "eval", dtype: torch.dtype = torch.float64) -> nn.Module:
    """A copy of the model in `dtype` (float64, or float32 where float64 fails) in `mode` (train or eval), its
    parameters' requires_grad as they are."""
    twin = copy.deepcopy(model).to(dtype)
    twin.train(mode == "train")
    return twin


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if x.is_floating_point() else x


PROOF_ROWS = 8  # the examples of the proof's batch whose exact per-sample gradients are computed


def proof_rows(size: int) -> torch.Tensor:
    """PROOF_ROWS examples spread over a batch of `size`, its first and last among them."""
    return torch.unique(torch.linspace(0, size - 1, min(PROOF_ROWS, size)).round().long())


def in_batch(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, seed: int):
    """The exact per-sample gradients of examples `rows`, as PerSampleGrads: each one's own loss backpropagated
    through one forward of the whole batch, its random draws seeded with `seed` (module docstring, step 2)."""
    from dpgrid.training.persample import materialised, parameter_groups, per_sample_losses, trainable

    params = trainable(model)
    with seeded(seed, x.device):
        losses = per_sample_losses(model(x), y, task)
    found = []
    for at, i in enumerate(rows.tolist()):
        grads = torch.autograd.grad(losses[i], params, retain_graph=at < len(rows) - 1, allow_unused=True)
        found.append([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)])
    return materialised([torch.stack(column) for column in zip(*found)], parameter_groups(model), x.device)


def prove(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, stacked_too: bool, size: int = 8,
          dtype: torch.dtype = torch.float64) -> tuple:
    """(layout, disagreement, stacked disagreement, largest relative difference): the fast engine on the model (and the
    stacked engine where `stacked_too`) against per-sample autograd on public examples `x`, `y`, in train mode at
    batch size `size` or the next that equals no dimension of the model, on a copy in `dtype` (module docstring); a
    disagreement is '' or one line naming the first layer that differs and why. What the model itself raises (and
    running out of memory) is raised: choose_engine retries in float32, or names it."""
    from dpgrid.training.persample import FastEngine, parametrised_layers

    twin = reference_copy(model, "train", dtype)
    layers = parametrised_layers(twin)
    xs, ys = as_dtype(x, dtype), y
    layout = find_layout(twin, layers, xs, size)
    if layout.problem:
        return layout, layout.problem, "", math.nan
    size = layout.size  # the training size, or the next that equals no dimension of the model
    xb, yb = public_rows(xs, size), public_rows(ys, size)
    rows = proof_rows(size)
    reference = in_batch(twin, task, xb, yb, rows, seed=1)
    try:
        engine = FastEngine(twin, task, MethodChoice(PROOF_FORMS), layout)
        with seeded(1, xb.device):
            fast = engine(xb, yb)
        error, where = compare(fast, reference, len(layers), rows, TOLERANCE[dtype])
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # a rule or a model the engine cannot run: named, never trained on
        return layout, f"the fast engine fails on this model ({type(e).__name__}: {first_line(e)})", "", math.nan
    disagreement = "" if error <= TOLERANCE[dtype] else why(twin, layers, where, task, xb, yb, layout, error, rows)
    stacked = prove_stacked(model, task, xb[:PROOF_ROWS], yb[:PROOF_ROWS], dtype) \
        if stacked_too and not disagreement else ""
    return layout, disagreement, stacked, error


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def compare(engine, reference, layers: int, rows: torch.Tensor = None, tolerance: float = RTOL) -> tuple:
    """(the largest relative difference of norms, per-layer norms and two weighted sums, the first layer whose norms
    differ by more than `tolerance` or None), of the examples `rows` of the engine's batch (all of them where None: the
    reference's are those)."""
    rows = torch.arange(len(reference.norms)) if rows is None else rows
    picked = rows.to(engine.norms.device)
    norms, want = engine.norms.double()[picked], reference.norms.double()
    scale = float(want.max()) or 1.0
    errors = [float(((norms - want).abs() / (want.abs() + 1e-12 * scale)).max())]
    group, group_want = engine.group_norms.double()[picked], reference.group_norms.double()
    by_layer = ((group - group_want).abs() / (group_want.abs() + 1e-12 * scale)).amax(0)
    errors.append(float(by_layer.max()) if layers else 0.0)
    clip = want.median().clamp_min(1e-12)
    weights = torch.stack([torch.clamp(clip / want.clamp_min(1e-300), max=1.0),
                           torch.linspace(-1.0, 2.0, len(want), dtype=torch.float64, device=want.device)])
    spread = torch.zeros((2, engine.size), dtype=torch.float64, device=want.device)  # the other examples weigh 0
    spread[:, picked] = weights
    got_sums, want_sums = engine.weighted_sums(*spread), reference.weighted_sums(*weights)
    for w, got, expected in zip(weights, got_sums, want_sums):
        bound = float((w.abs() * want).sum()) or 1.0
        if len(got) != len(expected) or any(g is None for g in got):
            raise ValueError(f"{len(got)} sums for {len(expected)} parameters")
        difference = math.sqrt(sum(float((g.double() - e.double()).pow(2).sum()) for g, e in zip(got, expected)))
        errors.append(difference / bound)
    bad = (by_layer > tolerance).nonzero()
    return max(errors), (int(bad[0]) if len(bad) else None)


def why(model: nn.Module, layers: list, where, task: str, x, y, layout: ModelLayout, error: float, rows) -> str:
    """The line that names the first layer whose per-sample gradients differ from per-sample autograd's, and why if
    known."""
    from dpgrid.training.persample import per_sample_losses

    if where is None:
        return (f"the fast engine's weighted sums differ from per-sample autograd's by {error:.1e} (relative) while "
                "every layer's norms agree")
    module = layers[where]
    what = described(model, module)
    own = [p for p in module.parameters(recurse=False) if p.requires_grad]
    with seeded(1, x.device):
        total = torch.autograd.grad(per_sample_losses(model(x), y, task).sum(), own, allow_unused=True)
    rule = rule_for(module)
    from dpgrid.training.persample import FastEngine

    engine = FastEngine(model, task, MethodChoice(PROOF_FORMS), layout)
    with seeded(1, x.device):
        sums = engine(x, y).weighted_sum(torch.ones(len(x), dtype=torch.float64, device=x.device))
    position = {id(p): i for i, p in enumerate(p for p in model.parameters() if p.requires_grad)}
    outside = any(t is not None and not torch.allclose(sums[position[id(p)]].double(), t.double(),
                                                         rtol=TOLERANCE.get(p.dtype, RTOL),
                                                         atol=1e-9 * float(t.abs().max() or 1))
                  for p, t in zip(own, total))
    reason = ("its parameters also receive gradient outside its own call (a weight used elsewhere in the forward, "
              "e.g. F.linear(x, layer.weight))" if outside else
              f"its rule ({rule.__name__ if rule else 'none'}) computes other per-sample gradients than "
              "per-sample autograd for the way the model calls it")
    return f"{what}: per-sample gradient norms differ from per-sample autograd's by {error:.1e} (relative): {reason}"


def prove_stacked(model: nn.Module, task: str, x, y, dtype: torch.dtype = torch.float64) -> str:
    """'' when two stacked runs (this model and a perturbed copy; the second run's batch padded) give each run torch.func's
    norms and sums; else one line naming the first layer that differs."""
    from dpgrid.training.persample import parametrised_layers
    from dpgrid.training.stacked import StackedEngine, StackedModel

    twins = [reference_copy(model, "eval", dtype) for _ in range(2)]
    tolerance = TOLERANCE[dtype]
    generator = torch.Generator().manual_seed(0)
    for p in twins[1].parameters():
        p.data.add_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device))
    references = [copy.deepcopy(t) for t in twins]
    b = len(x)
    mask = torch.ones((2, b), dtype=dtype, device=x.device)
    mask[1, b - 2:] = 0  # the second run's batch is two rows shorter: its padding must add nothing
    try:
        engine = StackedEngine(StackedModel(twins), task)
        stacked = engine(torch.stack([x, x]), torch.stack([y, y]), mask)
        weights = torch.rand((2, 2, b), generator=generator, dtype=dtype).to(x.device) * mask
        sums = stacked.weighted_sums(*weights)
        norms = stacked.norms
    except torch.OutOfMemoryError:
        raise
    except Exception as e:
        return f"the stacked engine fails on this model ({type(e).__name__}: {first_line(e)})"
    for run, twin in enumerate(references):
        rows = b - 2 * run
        reference = exact(twin, task, x[:rows], y[:rows])
        want = reference.norms
        if not torch.allclose(norms[run, :rows], want, rtol=tolerance, atol=1e-12 * float(want.max())):
            layer = parametrised_layers(twin)
            return f"the stacked engine's norms of run {run} differ from torch.func's ({len(layer)} layers)"
        for m, w in enumerate(weights):
            expected = reference.weighted_sum(w[run, :rows])
            got = [s[run] for s in sums[m]]
            bound = float((w[run, :rows].abs() * want).sum()) or 1.0
            difference = math.sqrt(sum(float((g - e).pow(2).sum()) for g, e in zip(got, expected)))
            if difference / bound > tolerance:
                return f"the stacked engine's weighted sums of run {run} differ from torch.func's by {difference / bound:.1e}"
    return ""
