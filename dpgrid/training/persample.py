"""Per-sample gradient information, the only thing a strategy sees of the model.

A strategy asks for the per-sample norms n_i = ||g_i||_2 (over all parameters) and for weighted
sums sum_i w_i g_i (clipped sum: w_i = min(1, C / n_i); online's q: w_i = 1[n_i > C] / n_i).
How they are computed is this module's business: engines change without touching strategies.

- `FastEngine` (default): book-keeping (Bu et al. 2023) with ghost norms (Li et al. 2022). One
  forward, one backward to the layer OUTPUTS (no weight gradients); per layer, as soon as the backward reaches it,
  from the layer input a_i and output gradient G_i of each sample, the rule its type registered
  (dpgrid.training.rules: Linear on inputs of any rank, Embedding, LayerNorm, RMSNorm, GroupNorm, InstanceNorm,
  Conv1d, Conv2d, ConvTranspose2d; a user's own type registers its rule). Only the parameters that train
  (requires_grad) are computed for.
- `FuncEngine`: torch.func vmap(grad), materialises all b x P numbers; the reference, and the
  fallback, with one warning, for a model with a parametrised layer no rule serves.
"""

import functools
import operator
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpgrid import DpgridError
from dpgrid.data import tasks
from dpgrid.privacy.randomness import to_device
from dpgrid.training.rules import MethodChoice, disjoint_subsets, rule_for, why_unserved


class PerSampleGrads:
    """One batch's per-sample gradient information.

    norms: (b,) per-sample gradient norms over all parameters (no un-noised loss of the private batch
    is exposed: nothing but noised quantities may leave a run);
    weighted_sum(w) -> [sum_i w_i g_i per parameter, in model.parameters() order];
    weighted_sums(w1, w2, ...) -> one such list per weight vector, computed in one pass.
    Per parameter group (a group: the parameters of one layer, in model order), for group-wise clipping:
    group_norms: (b, L) norms ||g_{i,l}|| of each sample's gradient restricted to group l;
    group_weighted_sum(W) -> [sum_i W[i, l(p)] g_{i,p} per parameter p, l(p) its group], W of shape (b, L).
    `sum_fn` maps an (m, b) weight matrix to per-parameter tensors of shape (m, *param.shape);
    `group_norms_fn` and `group_sum_fn` compute the group forms.
    """

    def __init__(self, size: int, norms_fn: Callable, sum_fn: Callable, group_norms_fn: Callable = None,
                 group_sum_fn: Callable = None, device=None, mask=None):
        self.size, self.device, self.mask = size, device, mask  # mask (b,) or (G, b): 0 for a padded row
        self._norms_fn, self._sum_fn, self._norms = norms_fn, sum_fn, None
        self._group_norms_fn, self._group_sum_fn, self._group_norms = group_norms_fn, group_sum_fn, None

    @property
    def norms(self) -> torch.Tensor:
        if self._norms is None:  # lazily: the non-private baseline never needs them
            self._norms = self._norms_fn()
        return self._norms

    @property
    def group_norms(self) -> torch.Tensor:
        if self._group_norms is None:
            self._group_norms = self._group_norms_fn()
        return self._group_norms

    def group_weighted_sum(self, weights: torch.Tensor) -> list:
        return self._group_sum_fn(weights)

    def weighted_sums(self, *weights: torch.Tensor) -> list:
        stacked = self._sum_fn(torch.stack(weights))
        return [[s[m] for s in stacked] for m in range(len(weights))]

    def weighted_sum(self, weights: torch.Tensor) -> list:
        return self.weighted_sums(weights)[0]

    def in_batch(self) -> torch.Tensor:
        """1 for each sample of the batch: (b,); for a padded batch its mask, (b,) or a stacked group's (G, b)."""
        if self.mask is not None:
            return self.mask
        return torch.ones(self.size, device=self.device)

    def mean_weights(self) -> torch.Tensor:
        """1 / b for each of the batch's b samples (the realised size: for the non-private baseline only); padded (a
        stacked group's batches, or a batch padded for a CUDA graph), 1 / b_r for run r's b_r samples and 0 for
        padding (computed in float64, then rounded once)."""
        if self.mask is not None:
            counts = self.mask.double().sum(-1, keepdim=True).clamp_min(1)
            return (self.mask.double() / counts).to(torch.get_default_dtype())
        return torch.full((self.size,), 1.0 / max(self.size, 1), device=self.device)


def empty_batch(params, device, n_groups: int) -> PerSampleGrads:
    """Poisson sampling can draw an empty batch: no gradients (the noise is still added)."""
    return PerSampleGrads(0, lambda: torch.zeros(0, device=device),
                          lambda w: [p.new_zeros((len(w), *p.shape)) for p in params],
                          lambda: torch.zeros((0, n_groups), device=device),
                          lambda w: [torch.zeros_like(p) for p in params], device)


def trainable(model: nn.Module) -> list:
    """The model's parameters that train (requires_grad), in model.parameters() order: what the engines compute for
    and the strategies update; a frozen parameter gets no per-sample work and no noise."""
    return [p for p in model.parameters() if p.requires_grad]


def parametrised_layers(model: nn.Module) -> list:
    """The modules that own parameters that train, in model order: the layers of the fast engine and the parameter
    groups."""
    return [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]


def parameter_groups(model: nn.Module) -> list:
    """The indices (in trainable(model) order) of each parametrised module's own parameters that train: one group
    per layer, in model order."""
    position = {id(p): i for i, p in enumerate(trainable(model))}
    return [[position[id(p)] for p in m.parameters(recurse=False) if p.requires_grad] for m in parametrised_layers(model)]


def per_sample_losses(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """(b,) losses: the task's (cross-entropy on logits, the per-image mean squared error, ...)."""
    return tasks.get(task).loss(out, y)


class OneRunEngine:
    """An engine of one run: the training loop hands it one batch per run, here one (a stacked group's engine takes
    G, dpgrid.training.stacked)."""

    def gradients(self, data, indices: list) -> PerSampleGrads:
        """The run's batch (`indices`: one index tensor) taken from `data`."""
        (idx,) = indices
        idx = to_device(idx, data.x_train.device)
        return self(data.x_train[idx], data.y_train[idx])


class FuncEngine(OneRunEngine):
    """Per-sample gradients with torch.func (vmap over grad): exact, materialises b x P numbers."""

    def __init__(self, model: nn.Module, task: str):
        self.params = trainable(model)
        self.groups = parameter_groups(model)
        names = [n for n, p in model.named_parameters() if p.requires_grad]

        def loss(params, x, y):  # the frozen parameters are the module's own (constants here)
            out = functional_call(model, dict(zip(names, params)), (x.unsqueeze(0),), strict=False)
            return per_sample_losses(out, y.unsqueeze(0), task)[0]

        # each sample draws its own random numbers (dropout's masks), as in a batch forward
        self._grads = vmap(grad(loss), in_dims=(None, 0, 0), randomness="different")

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> PerSampleGrads:
        if len(x) == 0:
            return empty_batch(self.params, x.device, len(self.groups))
        params = [p.detach() for p in self.params]
        return materialised(self._grads(params, x, y), self.groups, x.device)


def materialised(grads: list, groups: list, device) -> PerSampleGrads:
    """The PerSampleGrads of materialised per-sample gradients: `grads`, one (b, *shape) tensor per parameter that
    trains; `groups`: parameter_groups's."""
    sq = [g.flatten(1).pow(2).sum(1) for g in grads]
    group_of = {i: l for l, group in enumerate(groups) for i in group}

    def group_sum(w):
        return [torch.tensordot(w[:, group_of[i]].to(g.dtype), g, dims=1) for i, g in enumerate(grads)]

    return PerSampleGrads(len(grads[0]), lambda: torch.sqrt(sum(sq)),
                          lambda w: [torch.tensordot(w.to(g.dtype), g, dims=1) for g in grads],  # (m, *shape)
                          lambda: torch.sqrt(torch.stack([sum(sq[i] for i in group) for group in groups], 1)),
                          group_sum, device)


# --- the fast engine --------------------------------------------------------------------------------

def unsupported_layers(model: nn.Module) -> list:
    """Why the fast engine cannot serve the model's parametrised layers, once per reason (empty when it can): no rule
    of the registry (dpgrid.training.rules) serves a layer's type, or not in its configuration."""
    return sorted({why for m in parametrised_layers(model) if (why := why_unserved(m))})


@dataclass(frozen=True)
class LayerLayout:
    """How one parametrised layer's call carries the samples: `batch_dim`, the dimension of its input and output that
    holds them (0 for most models, 1 for a sequence-first layout), or None where the call holds none (its output is
    shared by every sample); `copies`: the forward changes its input or output in place afterwards, so the engine keeps
    its own copy; `called`: the proof saw it called; `shapes`: its input's and output's shapes as the proof saw them,
    the samples' dimension written -1 (None: not proved, e.g. a built-in model's default layout)."""
    batch_dim: object = 0
    copies: bool = False
    called: bool = True
    shapes: tuple = None


@dataclass(frozen=True)
class ModelLayout:
    """Each parametrised layer's LayerLayout, in model order, and why the fast engine cannot serve the model ('' when
    it can); `proved`: found by dpgrid.training.proof.find_layout, which the training forwards are then held to;
    `size`: the smaller batch size it ran at."""
    layers: tuple = ()
    problem: str = ""
    proved: bool = False
    size: int = 0

    def of(self, at: int) -> LayerLayout:
        return self.layers[at] if at < len(self.layers) else LayerLayout()


class InPlaceChange(Exception):
    """The forward changed a layer's input or output in place after the layer's call (its position among the layers)."""


UNPROVED = ("the proof on the first batch did not see this call pattern (a forward that changes the layers it calls or "
            "their shapes with the batch is not proved); train.engine=func trains it on the exact torch.func engine")


def unproved_call(module, layout: LayerLayout, a: torch.Tensor, out: torch.Tensor, batch: int) -> str:
    """Why a layer's call in a training forward is not the one the proof saw ('' when it is)."""
    if not layout.called:
        return f"{type(module).__name__} is called, which the proof never saw called"
    dim = layout.batch_dim
    shapes = tuple(tuple(-1 if k == dim else n for k, n in enumerate(t.shape)) for t in (a, out))
    if dim is not None and any(t.dim() <= dim or t.shape[dim] != batch for t in (a, out)):
        return f"{type(module).__name__} is called without the batch's {batch} samples at dimension {dim}"
    if shapes != layout.shapes:
        return f"{type(module).__name__} is called with input {tuple(a.shape)} and output {tuple(out.shape)}"
    return ""


class FastEngine(OneRunEngine):
    """Book-keeping per-sample norms and weighted sums, a rule per layer (see the module docstring). `layout`
    (dpgrid.training.proof.ModelLayout): where each layer's call carries the samples, found by running the model on two
    batch sizes; None: dimension 0 of every layer's input and output (the built-in models)."""

    def __init__(self, model: nn.Module, task: str, methods: MethodChoice = None, layout=None):
        self.model, self.task = model, task
        self.methods = methods or MethodChoice()  # where two exact forms compete, measured once per layer shape
        self.params = trainable(model)
        self.layers = parametrised_layers(model)
        problems = unsupported_layers(model)
        if problems:
            raise NotImplementedError(f"the fast engine cannot serve this model: {'; '.join(problems)}")
        layout = layout or ModelLayout()
        self._layout = {m: layout.of(at) for at, m in enumerate(self.layers)}
        self._proved = layout.proved  # training forwards are held to the call pattern the proof saw
        self._copies = {m for m, found in self._layout.items() if found.copies}  # grows if an in-place change is seen
        position = {id(p): i for i, p in enumerate(self.params)}
        # each layer's parameters that train: their names (the rule's) and their places among the engine's
        self._own = [[(name, position[id(p)]) for name, p in m.named_parameters(recurse=False) if p.requires_grad]
                     for m in self.layers]
        self._rule_of = {m: rule_for(m) for m in self.layers}
        self._record, self._batch = None, 0  # a dict and the batch's size only while __call__ runs its forward
        for m in self.layers:
            m.register_forward_hook(self._save)

    def _save(self, module, inputs, output):
        """Keep what the layer's rule needs of its call; the tensor returned (if any) replaces the layer's output in the
        rest of the forward: each sample's own view of an output shared by every sample, or a copy of an output the
        forward changes in place (the rule keeps the layer's own)."""
        if self._record is None or not torch.is_grad_enabled():
            return None
        if module in self._record:
            raise DpgridError(f"model: {type(module).__name__} is used twice in one forward (weight sharing), "
                              "which the fast engine cannot clip per sample; use train.engine=func")
        layout = self._layout[module]
        batch_dim, copies = layout.batch_dim, module in self._copies
        a, out, replaced = inputs[0], output, None
        if self._proved:
            unproved = unproved_call(module, layout, a, out, self._batch) if torch.is_tensor(a) else \
                f"{type(module).__name__} is called without a positional input tensor"
            if unproved:
                raise DpgridError(f"model: {unproved}: {UNPROVED}")
        if batch_dim is None:  # shared by every sample: each gets its own view, and its own gradient there
            a = a.unsqueeze(0).expand(self._batch, *a.shape)
            out = replaced = output.unsqueeze(0).expand(self._batch, *output.shape)
        watched = [] if copies else [(a, a._version), (out, out._version)]  # an in-place change after the call
        if copies:
            a, replaced = a.clone(), out.clone()
        moved = a.movedim(batch_dim, 0) if batch_dim else a
        kept = self._rule_of[module].recorded(module, (moved,), out) if batch_dim == 0 else (moved.detach(),)
        self._record[module] = (kept, out, batch_dim, watched)
        return replaced

    def _builder(self, factors, at, rule, module, kept, own, batch_dim):
        """The hook that builds layer `at`'s rule from its output gradient; `kept`: a one-item list, emptied then."""
        def build(g):
            g = g.movedim(batch_dim, 0) if batch_dim else g
            factors[at] = rule.from_recorded(module, kept.pop(), g, self.methods, tuple(name for name, _ in own))
        return build

    def padded(self, data, rows: torch.Tensor, mask: torch.Tensor) -> PerSampleGrads:
        """The run's batch padded to a fixed length (dpgrid.training.graphs): `rows` (1, capacity) training-set
        indices and `mask` (1, capacity), 0 for a padded row, both on the data's device."""
        return self(data.x_train[rows[0]], data.y_train[rows[0]], mask[0])

    def __call__(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor = None) -> PerSampleGrads:
        """`mask` (b,): 0 for a padded row, which gets a zero loss weight and an infinite norm (in no weighted sum and
        in no count, as a stacked group's padding)."""
        if len(x) == 0:
            return empty_batch(self.params, x.device, len(self.layers))
        while True:
            try:
                return self._gradients(x, y, mask)
            except InPlaceChange as change:  # the layer keeps its own copy from now on, and the batch is done again
                self._copies.add(self.layers[change.args[0]])

    def _gradients(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor = None) -> PerSampleGrads:
        self._record, self._batch = {}, len(x)
        try:
            losses = per_sample_losses(self.model(x), y, self.task)
        finally:
            record, self._record = self._record, None
        if mask is not None:
            losses = losses * mask.to(losses.dtype)
        # One backward to each layer's output (G_i of every sample, no weight gradients); each layer's rule is built
        # as soon as its G arrives, and the layer's input is let go then, not after the whole backward (a rule that
        # keeps less than its input and G, a normalisation's, frees them while the backward goes on).
        factors, outputs, handles = [None] * len(self.layers), [], []
        for at, (m, own) in enumerate(zip(self.layers, self._own)):
            if m not in record:  # not called in this forward: its parameters' gradient is zero
                factors[at] = Unused(m, own, len(x), x.device)
                continue
            kept, output, batch_dim, watched = record.pop(m)
            if any(t._version != version for t, version in watched):
                raise InPlaceChange(at)
            outputs.append(output)
            handles.append(output.register_hook(self._builder(factors, at, self._rule_of[m], m, [kept], own,
                                                              batch_dim)))
        try:
            if outputs:
                torch.autograd.grad(losses.sum(), outputs, allow_unused=True)
        finally:
            for handle in handles:
                handle.remove()
        del outputs, handles
        for at, m in enumerate(self.layers):  # a layer the loss does not reach: zero gradient
            if factors[at] is None:
                factors[at] = Unused(m, self._own[at], len(x), x.device)

        padding = None if mask is None else (mask == 0)

        def norms():
            norms = torch.sqrt(summed(f.sq_norms() for f in factors))
            return norms if padding is None else norms.masked_fill(padding, float("inf"))

        def weighted_sum(w):
            sums = [None] * len(self.params)
            subsets = disjoint_subsets(w)
            for f, own in zip(factors, self._own):
                for (_, at), total in zip(own, f.weighted_sum(w.to(f.dtype), subsets), strict=True):
                    sums[at] = total
            return sums

        def group_norms():  # the engine's groups are its layers
            norms = torch.sqrt(torch.stack([f.sq_norms() for f in factors], 1))
            return norms if padding is None else norms.masked_fill(padding[:, None], float("inf"))

        def group_sum(w):
            sums = [None] * len(self.params)
            for layer, (f, own) in enumerate(zip(factors, self._own)):
                for (_, at), total in zip(own, f.weighted_sum(w[:, layer][None].to(f.dtype)), strict=True):
                    sums[at] = total[0]
            return sums

        return PerSampleGrads(len(x), norms, weighted_sum, group_norms, group_sum, x.device, mask)


def summed(tensors):
    """The tensors added up, the first as the start: Python's sum() adds them to 0 first, one more kernel per step."""
    return functools.reduce(operator.add, tensors)


class Unused:
    """A layer whose parameters get no gradient in a batch (not called, or not reaching the loss): zero norms and
    sums."""

    def __init__(self, module, own, size: int, device):
        self.params = [p for name, p in module.named_parameters(recurse=False) if p.requires_grad]
        self.size, self.device, self.dtype = size, device, self.params[0].dtype

    def sq_norms(self):
        return torch.zeros(self.size, device=self.device, dtype=self.dtype)

    def weighted_sum(self, w, subsets=None):
        return [p.new_zeros((len(w), *p.shape)) for p in self.params]


def check_model(model: nn.Module, engine: str = "fast") -> None:
    """Refuse a model whose per-sample gradients an engine would get wrong, which would break the
    sensitivity bound the noise is calibrated for: layers that mix the samples of a batch (BatchNorm
    in training mode, with or without parameters), and for the fast engine a parameter shared by two
    layers (it would clip their parts separately). DpgridError naming the module."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            raise DpgridError(f"model: {name or 'the model'} ({type(module).__name__}) mixes the samples of a batch, "
                              "so one sample moves every per-sample gradient; use GroupNorm or LayerNorm instead")
    shared = shares_parameters(model) if engine == "fast" else ""
    if shared:
        raise DpgridError(f"model: {shared}, which the fast engine would clip as two; train.engine=auto or func trains "
                          "it on the exact torch.func engine")


def engine_for(model: nn.Module, name: str = "auto") -> tuple:
    """(the engine a grid of this model uses, a warning or None), from the model's layer types alone: auto is fast
    when a rule serves every parametrised layer, else func (with the warning); fast is refused where a layer has no
    rule. Asked once per grid, when it is compiled; the first batch proves the rest (dpgrid.training.proof)."""
    check_model(model, "fast" if name == "fast" else "func")
    problems = unsupported_layers(model) if name != "func" else []
    if problems and name == "fast":
        raise DpgridError(f"train.engine=fast cannot serve this model ({'; '.join(problems)}); train.engine=auto trains "
                          "it on the exact torch.func engine")
    if name == "auto" and not problems and shares_parameters(model):
        problems = [shares_parameters(model)]
    if problems:
        return "func", (f"the fast engine cannot serve this model ({'; '.join(problems)}): falling back to the slower "
                        "torch.func engine (exact, more memory)")
    return ("func" if name == "func" else "fast"), None


def shares_parameters(model: nn.Module) -> str:
    """Why the model's layers share a parameter (a tied weight), which the fast engine would clip as two; '' when none."""
    owner = {}
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            if id(param) in owner:
                return f"{owner[id(param)] or 'the model'} and {name} share a parameter (tied weights)"
            owner[id(param)] = name
    return ""


def make_engine(model: nn.Module, task: str, name: str = "auto", methods: MethodChoice = None, layout=None):
    """The engine `name` for this model (auto falls back to func, with a warning, where the fast engine cannot serve
    its layer types); `methods`: the layers' per-sample forms, shared by the runs of a grid (measured once); `layout`:
    where each layer carries the samples (dpgrid.training.proof)."""
    name, warning = engine_for(model, name)
    if warning:
        import warnings
        warnings.warn(warning)
    return FuncEngine(model, task) if name == "func" else FastEngine(model, task, methods, layout)
