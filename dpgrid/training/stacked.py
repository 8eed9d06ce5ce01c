"""Runs that train together (train.parallel_runs): G runs of one grid as one stacked model.

Small models are overhead-bound: the digits MLP's private step is a few dozen tiny kernels and Python calls, the
same for one run as for forty. A group stacks its runs' parameters, (G, *shape) per parameter, and takes each
step for all of them at once: one forward and one backward over the stacked weights (batched matmuls), per-sample
norms and weighted sums for every run, one strategy step over (G, ...) tensors (`Strategy.stacks`).

Nothing is shared between the runs of a group but the kernels. Each run keeps its own model initialisation, its
own Poisson batch (drawn from its own generator, padded to the group's largest), its own noise (from its own
generator), learning rate, clip and adaptive state: a run draws the same masks and noise in any group, and its
numbers match the one-at-a-time run within float rounding. A padded row is given a zero loss weight and an
infinite norm, so it is in no weighted sum and in no count (clip weights min(1, C/inf) = 0; 1[inf <= C] = 0);
a sum over the batch that counts every sample weighs them by `grads.in_batch()` (the mask).

Each layer is served by its type's rule (dpgrid.training.rules) with a leading run dimension, where the rule has a
stacked form (`stacks`: Linear, whose per-sample gradients are never materialised,
  ||g_i||^2 = ||G_i||^2 ||a_i||^2 (+ ||G_i||^2 for the bias),   sum_i w_i g_i = (w * G)^T A   per run).
Only Sequential models of such layers and parameter-free modules stack; others train one run at a time.
"""

import os

import torch
from torch import nn

from dpgrid.privacy.randomness import to_device
from dpgrid.training.graphs import padded_rows
from dpgrid.training.persample import PerSampleGrads, check_model, per_sample_losses, summed
from dpgrid.training.rules import MethodChoice, rule_for, why_unserved

STATE_COPIES = 8  # tensors as large as the parameters a stacked step holds (weights, noise, sums, moments, ...)
MAX_GROUP = 64    # auto's largest group: a group's runs are committed when it ends, so a kill loses at most one
# auto stacks on a CPU only below this much work per step (multiply-adds per sample x batch size): above it a step is
# bound by its arithmetic, which stacking does not make cheaper (scripts/bench.py --grid, 2-core CPU: digits MLP,
# 2,410 x 128, 5.1x faster stacked; AG News bag-of-words, 113,156 x 512, 0.96x)
CPU_STACK_WORK = 10_000_000


# Parameter-free modules that compute each sample's output from that sample alone at any batch size, in either mode:
# a stacked group applies them to its runs' samples at once, (G b, ...) rows. Any other parameter-free module (a
# user's) is applied run by run, to the b rows of one run's batch: the size the train-mode checks saw it keep samples
# apart at (dpgrid.training.apart), never a batch G times larger.
PER_SAMPLE = (nn.Identity, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
              nn.Tanh, nn.Sigmoid, nn.Softplus, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish, nn.Tanhshrink,
              nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
              nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
              nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)


def per_sample(layer: nn.Module) -> bool:
    """Whether a parameter-free layer is known to act on each sample alone (PER_SAMPLE, or a Flatten or Unflatten that
    leaves the samples' dimension as it is)."""
    if type(layer) in PER_SAMPLE:
        return True
    if isinstance(layer, nn.Flatten):
        return layer.start_dim >= 1  # a negative one depends on the input's rank: run by run
    if isinstance(layer, nn.Unflatten):
        return isinstance(layer.dim, int) and layer.dim >= 1
    return False


def owns_parameters(layer: nn.Module) -> bool:
    """A parametrised layer of a Sequential (a parameter-free one is applied to the runs' samples as one batch)."""
    return any(True for _ in layer.parameters())


def why_not_stacked(model: nn.Module, strategy_cls) -> str:
    """Why a grid's runs cannot train stacked ('' when they can), in words for a one-line message."""
    if not strategy_cls.stacks:
        return f"{strategy_cls.__name__}'s step is written for one run, it does not say `stacks = True`"
    if not isinstance(model, nn.Sequential):
        return f"the model is a {type(model).__name__}, not an nn.Sequential of layers that stack"
    if not all(p.requires_grad for p in model.parameters()):
        # adapters (dpgrid.models.finetuning.LoRALinear: a frozen base, released `merged`) froze it, not train.trainable
        if any(callable(getattr(m, "merged", None)) for m in model.modules()):
            return "LoRA adapters (model.lora.rank) keep their layers' own weights frozen: such runs train one at a time"
        return "part of the model is frozen (train.trainable): such runs train one at a time"
    for layer in model:
        if owns_parameters(layer):
            rule = rule_for(layer)
            if rule is None or not rule.stacks or why_unserved(layer) or any(True for _ in layer.children()):
                return f"the model has {type(layer).__name__} layers (no stacked form: they train one run at a time)"
    return ""


def available_memory(device: torch.device) -> int:
    """Bytes free for a group: the CUDA device's free memory, or the machine's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: assume 4 GiB
        return 4 << 30


def per_sample_sizes(model: nn.Module, sample: torch.Tensor = None) -> tuple:
    """(multiply-adds, activation elements) of one sample through a Sequential: for each parametrised layer, its
    output's elements times the weight's elements per output channel (a Linear's inputs, a convolution's kernel) or,
    transposed, its input's elements times the weight's per input channel; and the input's and every parametrised
    layer's output's sizes. The shapes are followed on the meta device (no arithmetic) from `sample` (one sample, as
    a batch of one); without it, from the first layer's input width, each layer applied once (exact for Linear layers
    on flat inputs)."""
    import copy

    layers = [layer for layer in model if owns_parameters(layer)]
    if sample is None:
        shapes = [layer.weight.shape for layer in layers]
        return sum(layer.weight.numel() for layer in layers), shapes[0][1] + sum(shape[0] for shape in shapes)
    meta, x = copy.deepcopy(model).to("meta"), sample[:1].to("meta")
    work, elements = 0, x.numel()
    for layer in meta:
        inputs, x = x, layer(x)
        if owns_parameters(layer):
            weight = layer.weight
            applied = inputs if getattr(layer, "transposed", False) else x
            work += applied.numel() * max(1, weight.numel() // weight.shape[0])
            elements += x.numel()
    return work, elements


def bytes_per_run(model: nn.Module, batch_size: int, elements: int) -> int:
    """What one run adds to a group: its state (STATE_COPIES x the parameters) and its batch's activations and
    output gradients (a Poisson batch padded to 1.5 B; `elements`: one sample's, per_sample_sizes)."""
    itemsize = next(model.parameters()).element_size()
    return itemsize * (STATE_COPIES * sum(p.numel() for p in model.parameters()) + 3 * int(1.5 * batch_size) * elements)


def group_size(setting: str, model: nn.Module, strategy_cls, runs: int, batch_size: int, device: torch.device,
               sample: torch.Tensor = None, side_by_side: int = 1) -> tuple:
    """(how many runs train together, why one at a time or ''): train.parallel_runs as set (at most the runs
    left), or auto's choice: on a CPU, one at a time for compute-bound models (CPU_STACK_WORK multiply-adds per step),
    else up to MAX_GROUP runs within a quarter of the free memory (a GPU's free memory on CUDA, shared among the
    `side_by_side` grids a launcher places on it, which may all start at once). `sample`: a training example, for the
    sizes (per_sample_sizes)."""
    why = why_not_stacked(model, strategy_cls)
    if why or runs <= 1:
        return 1, why
    if str(setting) != "auto":
        return min(int(setting), runs), ""
    slower = sorted({type(layer).__name__ for layer in model
                     if owns_parameters(layer) and not rule_for(layer).auto_stacks})
    if slower:
        return 1, (f"{', '.join(slower)} layers stack (one grouped kernel for the group) but measured slower stacked than "
                   "one run at a time; train.parallel_runs=N stacks N runs anyway")
    per_sample, elements = per_sample_sizes(model, sample)  # shapes followed once, for the work and the memory
    work = per_sample * batch_size
    if device.type == "cpu" and work > CPU_STACK_WORK:
        return 1, (f"a step of this model is bound by its arithmetic on a CPU, {work:,} multiply-adds per step, "
                   "which stacking does not make cheaper; train.parallel_runs=N stacks N runs anyway")
    share = max(1, side_by_side) if device.type == "cuda" else 1
    fits = available_memory(device) // 4 // share // max(1, bytes_per_run(model, batch_size, elements))
    return max(1, min(runs, MAX_GROUP, fits)), ""


class StackedModel:
    """G runs' models as one: their parameters stacked, (G, *shape) each. Each run's own nn.Module keeps working
    (validation, the checkpoint of a finished run): its parameters are made views of its slice."""

    def __init__(self, models: list):
        check_model(models[0])
        self.layers = list(models[0])
        self.copy_before = set()  # positions of parameter-free layers that change their input in place
        self.per_sample = {at for at, layer in enumerate(self.layers) if per_sample(layer)}
        self.params = [torch.stack([p.detach() for p in ps]) for ps in zip(*(m.parameters() for m in models))]
        for run, model in enumerate(models):
            for p, stacked in zip(model.parameters(), self.params):
                p.data = stacked[run]

    def forward(self, x: torch.Tensor) -> tuple:
        """(outputs (G, b, ...), [(layer, its parameters' names, input, output) of each parametrised layer]) for
        inputs x of shape (G, b, ...). A parameter-free layer that changes its input in place (ReLU(inplace=True))
        is handed a copy from the first forward that shows it (InPlaceChange; the engine does the batch again)."""
        from dpgrid.training.persample import InPlaceChange

        records, params = [], iter(self.params)
        for at, layer in enumerate(self.layers):
            names = tuple(name for name, _ in layer.named_parameters())
            if names:
                inputs = x
                x = rule_for(layer).stacked_forward(layer, inputs, [next(params) for _ in names])
                if not x.requires_grad:  # the first layer: its output starts the graph the backward walks
                    x.requires_grad_(True)
                records.append((layer, names, inputs.detach(), x))
            else:  # parameter-free: applied to the runs' samples as one batch where per sample, else run by run
                given = x.clone() if at in self.copy_before else x
                version = given._version
                try:
                    if at in self.per_sample:
                        x = layer(given.flatten(0, 1)).unflatten(0, x.shape[:2])
                    else:
                        x = torch.stack([layer(given[run]) for run in range(len(given))])
                except RuntimeError:  # autograd refuses an in-place change of the first layer's output (a leaf)
                    if at in self.copy_before:
                        raise
                    version = -1
                if given._version != version and at not in self.copy_before:
                    self.copy_before.add(at)
                    raise InPlaceChange(at)
        return x, records


class StackedEngine:
    """Per-sample norms and weighted sums of a group's runs, each on its own (padded) Poisson batch."""

    def __init__(self, stack: StackedModel, task: str, choice: MethodChoice = None):
        self.stack, self.task = stack, task
        self.choice = choice or MethodChoice()  # each layer shape's form where two compete (a convolution's)

    def gradients(self, data, indices: list) -> PerSampleGrads:
        """The G runs' batches (`indices`: one index tensor per run), padded to the largest."""
        rows, mask = padded_rows(indices, max(1, max(len(i) for i in indices)), data.x_train.dtype)
        device = data.x_train.device
        return self.padded(data, to_device(rows, device), to_device(mask, device))

    def padded(self, data, rows: torch.Tensor, mask: torch.Tensor) -> PerSampleGrads:
        """The G runs' batches padded to a fixed length (dpgrid.training.graphs): `rows` (G, capacity) training-set
        indices and `mask` (G, capacity), both on the data's device."""
        return self(data.x_train[rows], data.y_train[rows], mask)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> PerSampleGrads:
        """x (G, b, ...), y (G, b, ...), mask (G, b): 1 for a run's sampled rows, 0 for padding."""
        from dpgrid.training.persample import InPlaceChange

        runs, b = mask.shape
        while True:
            try:
                out, records = self.stack.forward(x)
                break
            except InPlaceChange:  # the layer is handed a copy from now on: the forward again
                continue
        losses = per_sample_losses(out.flatten(0, 1), y.flatten(0, 1), self.task).view(runs, b)
        # gradients of sum_i loss_i w.r.t. each layer's output: G_i of every sample (0 for padding)
        out_grads = torch.autograd.grad((losses * mask.to(losses.dtype)).sum(), [r[3] for r in records])
        factors = [rule_for(layer)(layer, a, g, self.choice, names, stacked=True)
                   for (layer, names, a, _), g in zip(records, out_grads)]
        padding = mask == 0

        def norms():
            return torch.sqrt(summed(f.sq_norms() for f in factors)).masked_fill(padding, float("inf"))

        def weighted_sums(w):  # w (m, G, b) -> per parameter (m, G, *shape)
            return [total for f in factors for total in f.weighted_sum(w.to(f.dtype))]

        def group_norms():  # (G, b, L): each layer's norms, a padded row's inf (in no sum, no count)
            return torch.sqrt(torch.stack([f.sq_norms() for f in factors], -1)).masked_fill(padding[..., None],
                                                                                           float("inf"))

        def group_sums(w):  # w (G, b, L) -> per parameter (G, *shape): layer l's sum weighted by w[..., l]
            return [total[0] for layer, f in enumerate(factors) for total in f.weighted_sum(w[None, ..., layer].to(f.dtype))]

        return PerSampleGrads(b, norms, weighted_sums, group_norms, group_sums, device=x.device, mask=mask)

