"""Convolutions: nn.Conv2d (any stride, dilation, padding and groups), nn.ConvTranspose2d (any stride, padding and
groups) and nn.Conv1d (as a Conv2d of height 1). A convolution's per-sample gradients are small (out x in x kernel):
they are materialised when the norms are first asked for, by whichever exact method measures fastest for the layer's
shape (MethodChoice, as cuDNN's benchmark mode chooses its algorithms); weighted sums asked before that (the
non-private mean) are one weight gradient of the weighted output gradients, as the non-private step computes it.

Each method takes a layer, its inputs a (b, C, H, W) and output gradients g, and returns (b, *weight.shape):
    Conv2d:           dW_i[o, c, u, v] = sum_{h,w} G_i[o, h, w] a_i[c, s h + d u - p, s w + d v - p]
    ConvTranspose2d:  dW_i[c, o, u, v] = sum_p a_i[c, p] G_i[o, s p + d (u, v) - p]
The transposed one is a Conv2d weight gradient with the roles swapped (the output gradients as the input, the inputs
as the output gradients). They differ in speed and float rounding only.

Stacked runs (dpgrid.training.stacked: G runs' kernels stacked, (G, *weight.shape)) are one grouped convolution:
run r's channels are the r-th block of G x groups groups, so its outputs see its own kernels and inputs alone,
    y[:, r] = conv(x[:, r], W_r)   computed as   conv(x with channels (G C), W stacked to (G O, C / groups, ...),
                                                      groups = G groups).
A per-sample gradient needs the layer's inputs and output gradients, not its weights, so the G b samples of a group
are served by the methods above as one batch of G b samples."""

import math
from types import SimpleNamespace

import torch
from torch import nn

from dpgrid.training.rules import LayerRule, register_rule


def correlate_by_unfolding(x, kernels, padding=(0, 0), chunk=64):
    """out[i, o, c, u, v] = sum_p kernels_i[o, p] x_i[c, p + (u, v) - padding], stride and dilation 1: x unfolded
    into (c, u, v) columns and one batched matmul per `chunk` samples (whole-batch unfolding spends its time
    moving memory). x: (b, C, H, W), kernels: (b, O, h, w) -> (b, O, C, H + 2 padding - h + 1, W + ...)."""
    b, c, height, width = x.shape
    o, h, w = kernels.shape[1:]
    size = (height + 2 * padding[0] - h + 1, width + 2 * padding[1] - w + 1)
    out = x.new_empty((b, o, c * size[0] * size[1]))
    flat = kernels.flatten(2)
    for start in range(0, b, chunk):
        part = slice(start, start + chunk)
        columns = nn.functional.unfold(x[part], size, padding=padding)  # (n, C * |size|, h * w)
        torch.bmm(flat[part], columns.transpose(1, 2), out=out[part])
    return out.view(b, o, c, *size)


def correlate_per_sample(x, kernels, padding=0, stride=1, dilation=1):
    """out[c, i, o] = x_i[c] correlated with kernels_i[o], for every sample i at once: a grouped
    convolution with the batch as groups (any stride and dilation). x: (b, C, H, W), kernels: (b, O, h, w)
    -> (C, b, O, H', W')."""
    b, c, o = len(x), x.shape[1], kernels.shape[1]
    out = nn.functional.conv2d(x.transpose(0, 1), kernels.reshape(b * o, 1, *kernels.shape[2:]),
                               padding=padding, stride=stride, dilation=dilation, groups=b)
    return out.view(c, b, o, *out.shape[2:])


def correlate_depthwise(x, kernels, padding=0, stride=1, dilation=1):
    """correlate_per_sample as a depthwise convolution, one group per (sample, kernel): each sample's x copied O
    times, so that the backend's depthwise kernels serve (fast where x has one channel: the copy is then O images)."""
    b, c, o = len(x), x.shape[1], kernels.shape[1]
    copies = x.transpose(0, 1)[:, :, None].expand(c, b, o, *x.shape[2:]).reshape(c, b * o, *x.shape[2:])
    out = nn.functional.conv2d(copies, kernels.reshape(b * o, 1, *kernels.shape[2:]), padding=padding, stride=stride,
                               dilation=dilation, groups=b * o)
    return out.view(c, b, o, *out.shape[2:])


# --- the methods (each as measured on a 2-core CPU: the MNIST CNN's 16 -> 32 layer was 2.6x faster grouped than
# unfolded in chunks of 64, the autoencoder's 32 -> 64 layers the other way round, and the backward-weight kernel
# faster than both on each; hence measured, not guessed by a rule) ---------------------------------------------

def correlated(module, a, g) -> tuple:
    """(x, kernels, padding): the pair whose correlation, sample by sample, is a layer's weight gradient, with
    numeric padding. A Conv2d's input (padded as Conv2d pads it) with its output gradients as kernels; a
    ConvTranspose2d's output gradients with its inputs: a Conv2d weight gradient with the roles swapped. The layer's
    stride and dilation apply as they are."""
    if module.transposed:
        return g, a, module.padding
    x, padding = padded_input(module, a)
    return x, g, padding


def by_correlation(correlate):
    """A layer's per-sample gradients from a per-sample correlation (correlate_per_sample or correlate_depthwise) of
    its correlated pair, stride and dilation trading places, cropped to the kernel (a ConvTranspose2d's is exact)."""
    def per_sample(module, a, g):
        x, kernels, padding = correlated(module, a, g)
        out = correlate(x, kernels, padding, stride=module.dilation, dilation=module.stride)
        return out[..., :module.kernel_size[0], :module.kernel_size[1]].permute(1, 2, 0, 3, 4)
    return per_sample


def backward_weight_kernel(module, a, g):
    """The layer's own weight-gradient kernel with the batch as groups: input (1, b C, H, W) and output gradient
    (1, b O, H', W') give the (b O, C / groups, h, w) gradients of a (b x groups)-group convolution, which are the b
    per-sample gradients (any stride, padding, dilation and groups). The MNIST CNN's 16 -> 32 layer at b = 512, 2-core CPU: 13-17 ms in chunks of
    32-128, against 36-40 ms grouped (forward with G_i as the kernel) and 13-22 ms for the summed weight gradient."""
    x, dy, padding = correlated(module, a, g)
    n, shape = len(x), module.weight.shape
    grads = torch.nn.grad.conv2d_weight(x.reshape(1, -1, *x.shape[2:]), (n * shape[0], *shape[1:]),
                                        dy.reshape(1, -1, *dy.shape[2:]), module.stride, padding, module.dilation,
                                        groups=n * module.groups)
    return grads.view(n, *shape)


def in_chunks(method, chunk: int):
    """`method` over `chunk` samples at a time: a group count whose data the backend's kernels keep in cache (the
    MNIST CNN's 16 -> 32 layer, grouped: 37-40 ms in chunks of 32-128 against 45-48 ms whole, 2-core CPU)."""
    def chunked(module, a, g):
        if len(a) <= chunk:
            return method(module, a, g)
        return torch.cat([method(module, a[start:start + chunk], g[start:start + chunk])
                          for start in range(0, len(a), chunk)])
    return chunked


grouped, depthwise = by_correlation(correlate_per_sample), by_correlation(correlate_depthwise)


def unfolding(chunk: int):
    def unfolded(module, a, g):
        x, kernels, padding = correlated(module, a, g)
        return correlate_by_unfolding(x, kernels, padding, chunk=chunk)
    return unfolded


CONV_METHODS = {"grouped": grouped, "grouped64": in_chunks(grouped, 64), "depthwise64": in_chunks(depthwise, 64),
                "backward32": in_chunks(backward_weight_kernel, 32),
                "backward128": in_chunks(backward_weight_kernel, 128),
                "unfold16": unfolding(16), "unfold64": unfolding(64)}


def workspace(name: str, module, x, kernels) -> int:
    """The elements of the large temporary a method makes from the layer's correlated pair (x, kernels), 0 for none:
    depthwise copies each of its 64 samples' x once per kernel; unfolding lays out x's (C kh kw) x (positions)
    columns for each sample of its chunk."""
    if name == "depthwise64":
        return 64 * kernels.shape[1] * x[0].numel()
    if name.startswith("unfold"):
        return int(name.removeprefix("unfold")) * x.shape[1] * math.prod(module.kernel_size) * kernels[0, 0].numel()
    return 0


WORKSPACE_BYTES = 256 << 20  # no method whose temporary is larger is measured (large images, wide layers)


def applicable(module, a=None, g=None) -> list:
    """The methods of CONV_METHODS that compute this layer's per-sample gradients: the backward-weight kernel takes any
    stride, padding, dilation and groups; the grouped and depthwise correlations take one group and, transposed, stride 1
    and no padding; unfolding stride and dilation 1 too. The depthwise correlation copies each sample's correlated
    input once per kernel, and is offered only where that input has one channel (a Conv2d from one channel, a
    ConvTranspose2d to one): there it measured 2x faster than the others (the MNIST CNN's 1 -> 16 layer 4.0 ms against
    7.8 ms), everywhere else 2-40x slower. Given the batch's inputs a and output gradients g, a method whose temporary
    would exceed WORKSPACE_BYTES is not offered either, so that measuring it on the first batch cannot exhaust the
    memory (the MNIST CNN's and the autoencoder's layers: at most 35 MB)."""
    plain = module.stride == (1, 1) and module.dilation == (1, 1)
    correlates = module.groups == 1 and (not module.transposed or (module.stride == (1, 1) and module.padding == (0, 0)))
    single = (module.out_channels if module.transposed else module.in_channels) == 1
    names = [name for name in CONV_METHODS if name.startswith("backward") or correlates and
             (plain or not name.startswith("unfold")) and (single or not name.startswith("depthwise"))]
    if a is None:
        return names
    x, kernels, _ = correlated(module, a, g)
    return [name for name in names if workspace(name, module, x, kernels) * x.element_size() <= WORKSPACE_BYTES]


def summed_weight_grad(module, a, g):
    """sum_i dW_i: the layer's ordinary weight gradient from inputs a and output gradients g, the kernel's own on
    the layer's correlated pair."""
    x, dy, padding = correlated(module, a, g)
    return torch.nn.grad.conv2d_weight(x, module.weight.shape, dy, module.stride, padding, module.dilation,
                                       groups=module.groups)


def padded_input(module, a):
    """(input, numeric padding) for the weight-gradient kernels, which take numbers only: padding="same" is padded
    here as Conv2d pads it (d (k - 1) in all, the odd one on the right and bottom), "valid" is none."""
    if not isinstance(module.padding, str):
        return a, module.padding
    if module.padding == "valid":
        return a, (0, 0)
    pads = []
    for k, d in reversed(list(zip(module.kernel_size, module.dilation))):  # F.pad lists the last dimension first
        total = d * (k - 1)
        pads += [total // 2, total - total // 2]
    return nn.functional.pad(a, pads), (0, 0)


@register_rule(nn.Conv2d, nn.ConvTranspose2d, nn.Conv1d)
class ConvRule(LayerRule):
    """A convolution's per-sample gradients, materialised (b, *weight.shape) when its norms are first asked for;
    weighted sums before that (the non-private baseline's mean asks no norm) are one weight gradient of the w-weighted
    output gradients and never materialise them. A Conv1d is served as a Conv2d of height 1."""

    stacks = True
    # one grouped convolution of G runs measured slower than G convolutions on an H200 (scripts/bench.py --grid,
    # 10 runs: the CNN 0.67x, the autoencoder 0.44x) and no faster on a 2-core CPU: stacked only when asked
    auto_stacks = False

    @staticmethod
    def unsupported(module) -> str:
        return f"{type(module).__name__} with padding_mode={module.padding_mode}" if module.padding_mode != "zeros" else ""

    @staticmethod
    def stacked_forward(layer, x, params):
        """G runs' outputs of this layer, x (G, b, C, ...), from their stacked parameters (G, *shape) as one grouped
        convolution (the module docstring)."""
        runs, b = x.shape[:2]
        weight, bias = params[0], params[1].flatten() if len(params) > 1 else None
        channels = x.transpose(0, 1).reshape(b, runs * x.shape[2], *x.shape[3:])
        kernels, groups = weight.flatten(0, 1), runs * layer.groups
        if isinstance(layer, nn.ConvTranspose2d):
            out = nn.functional.conv_transpose2d(channels, kernels, bias, layer.stride, layer.padding,
                                                 layer.output_padding, groups, layer.dilation)
        else:
            conv = nn.functional.conv1d if isinstance(layer, nn.Conv1d) else nn.functional.conv2d
            out = conv(channels, kernels, bias, layer.stride, layer.padding, layer.dilation, groups)
        return out.view(b, runs, -1, *out.shape[2:]).transpose(0, 1)

    def __init__(self, module, a, g, choice, params, stacked=False):
        super().__init__(as_2d(module), a, g, choice, params, stacked)
        self.runs = len(a) if stacked else None
        if stacked:  # (G, b, ...): the group's G b samples as one batch
            self.a, self.g = a.flatten(0, 1), g.flatten(0, 1)
        if isinstance(module, nn.Conv1d):  # (b, C, L) -> (b, C, 1, L)
            self.a, self.g = self.a.unsqueeze(2), self.g.unsqueeze(2)
        self.weight_shape = module.weight.shape
        self.has_weight, self.has_bias = "weight" in params, "bias" in params
        self.bg = self.g.flatten(2).sum(2) if self.has_bias else None
        self._wg = None

    @property
    def wg(self):
        if self._wg is None:
            m, a, g = self.module, self.a, self.g
            key = (m.transposed, m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups,
                   tuple(a.shape[2:]), str(a.device), str(a.dtype))
            kind = "ConvTranspose2d" if m.transposed else "Conv2d"
            description = (f"{kind} {m.in_channels}->{m.out_channels} {m.kernel_size[0]}x{m.kernel_size[1]} on "
                           f"{a.shape[2]}x{a.shape[3]} ({a.device})")
            forms = {name: (lambda method: lambda: method(m, a, g))(CONV_METHODS[name]) for name in applicable(m, a, g)}
            self._wg = self.choice.pick(key, description, forms, a.device)
        return self._wg

    def sq_norms(self):
        s = torch.linalg.vector_norm(self.wg.flatten(1), dim=1).square_() if self.has_weight else 0
        s = s + torch.linalg.vector_norm(self.bg, dim=1).square_() if self.has_bias else s
        return s.view(self.runs, -1) if self.stacked else s

    def weighted_sum(self, w, subsets=None):
        """w: (m, b) -> [(m, *weight.shape), (m, out)] of the parameters that train; stacked, w (m, G, b) ->
        [(m, G, *weight.shape), (m, G, out)]. Materialised: disjoint subsets would not save work."""
        if self.stacked:  # each run's sum over its own samples
            per_run = [(self.wg, self.weight_shape)] if self.has_weight else []
            per_run += [(self.bg, self.bg.shape[1:])] if self.has_bias else []
            return [torch.einsum("mgb,gbk->mgk", w, grads.reshape(self.runs, w.shape[2], -1)).view(*w.shape[:2], *shape)
                    for grads, shape in per_run]
        sums = []
        if self.has_weight:
            if self._wg is not None:
                weight = torch.tensordot(w, self._wg, dims=1)
            else:
                weight = torch.stack([summed_weight_grad(self.module, self.a, self.g * row[:, None, None, None])
                                      for row in w])
            sums.append(weight.view(len(w), *self.weight_shape))
        if self.has_bias:
            sums.append(w @ self.bg)
        return sums


def as_2d(module):
    """A convolution as the Conv2d (or transposed) its per-sample methods read: a Conv1d's attributes with a height-1
    dimension in front."""
    if isinstance(module, nn.Conv1d):
        padding = module.padding if isinstance(module.padding, str) else (0, *module.padding)
        return SimpleNamespace(transposed=False, in_channels=module.in_channels, out_channels=module.out_channels,
                               kernel_size=(1, *module.kernel_size), stride=(1, *module.stride), padding=padding,
                               dilation=(1, *module.dilation), groups=module.groups,
                               weight=SimpleNamespace(shape=(*module.weight.shape[:2], 1, module.weight.shape[2])))
    return module  # Conv2d and ConvTranspose2d say whether they are transposed (`transposed`)
