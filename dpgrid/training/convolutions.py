"""A convolution's per-sample gradients: the exact methods that compute them, and the choice among them by
measurement (MethodChoice), once per layer shape and device, as cuDNN's benchmark mode chooses its algorithms.

Each method takes a layer, its inputs a (b, C, H, W) and output gradients g, and returns (b, *weight.shape):
    Conv2d:           dW_i[o, c, u, v] = sum_{h,w} G_i[o, h, w] a_i[c, s h + d u - p, s w + d v - p]
    ConvTranspose2d:  dW_i[c, o, u, v] = sum_p a_i[c, p] G_i[o, p + (u, v)]      (stride 1, no padding)
They differ in speed and float rounding only; which is fastest depends on the layer's shape and the device."""

import math

import torch
from torch import nn


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
    ConvTranspose2d's (stride 1, no padding) output gradients with its inputs: a Conv2d weight gradient with the roles
    swapped. The layer's stride and dilation apply as they are (a ConvTranspose2d's are 1)."""
    if isinstance(module, nn.Conv2d):
        x, padding = padded_input(module, a)
        return x, g, padding
    return g, a, (0, 0)


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
    (1, b O, H', W') give the (b O, C, h, w) gradients of a b-group convolution, which are the b per-sample gradients
    (any stride, padding and dilation). The MNIST CNN's 16 -> 32 layer at b = 512, 2-core CPU: 13-17 ms in chunks of
    32-128, against 36-40 ms grouped (forward with G_i as the kernel) and 13-22 ms for the summed weight gradient."""
    x, dy, padding = correlated(module, a, g)
    n, shape = len(x), module.weight.shape
    grads = torch.nn.grad.conv2d_weight(x.reshape(1, -1, *x.shape[2:]), (n * shape[0], *shape[1:]),
                                        dy.reshape(1, -1, *dy.shape[2:]), module.stride, padding, module.dilation,
                                        groups=n)
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
    """The methods of CONV_METHODS that compute this layer's per-sample gradients: unfolding takes stride and
    dilation 1; the grouped convolution and the backward-weight kernel take any. The depthwise correlation copies
    each sample's correlated input once per kernel, and is offered only where that input has one channel (a Conv2d
    from one channel, a ConvTranspose2d to one): there it measured 2x faster than the others (the MNIST CNN's
    1 -> 16 layer 4.0 ms against 7.8 ms), everywhere else 2-40x slower. Given the batch's inputs a and output
    gradients g, a method whose temporary would exceed WORKSPACE_BYTES is not offered either, so that measuring it on
    the first batch cannot exhaust the memory (the MNIST CNN's and the autoencoder's layers: at most 35 MB)."""
    plain = module.stride == (1, 1) and module.dilation == (1, 1)
    single = (module.in_channels if isinstance(module, nn.Conv2d) else module.out_channels) == 1
    names = [name for name in CONV_METHODS if (plain or not name.startswith("unfold"))
             and (single or not name.startswith("depthwise"))]
    if a is None:
        return names
    x, kernels, _ = correlated(module, a, g)
    return [name for name in names if workspace(name, module, x, kernels) * x.element_size() <= WORKSPACE_BYTES]


class MethodChoice:
    """The per-sample method of each convolution, per layer shape and device: `setting` (train.conv_method) forces
    one; `auto` times every applicable method on the first batch that reaches a shape (one warm-up and two timed
    calls each, synchronised on CUDA), keeps the fastest and reuses it, as cuDNN's benchmark mode does. Every method
    is exact; they differ in speed and float rounding only. One choice serves a whole grid."""

    def __init__(self, setting: str = "auto"):
        self.setting, self.chosen = setting, {}  # {layer key: (method, {method: seconds})}

    def per_sample(self, module, a, g):
        key = (type(module).__name__, module.in_channels, module.out_channels, module.kernel_size, module.stride,
               module.padding, module.dilation, tuple(a.shape[2:]), str(a.device), str(a.dtype))
        if key not in self.chosen:
            self.chosen[key] = self.choose(module, a, g)
        return CONV_METHODS[self.chosen[key][0]](module, a, g)

    def choose(self, module, a, g) -> tuple:
        names = applicable(module, a, g)
        if self.setting != "auto":
            return (self.setting if self.setting in names else "grouped"), {}
        times = {name: timed(CONV_METHODS[name], module, a, g) for name in names}
        return min(times, key=times.get), times

    def describe(self) -> list:
        """One line per layer shape: its method, and what each candidate took when measured."""
        lines = []
        for (kind, c_in, c_out, kernel, *_, size, device, _), (name, times) in self.chosen.items():
            measured = ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in sorted(times.items(), key=lambda kv: kv[1]))
            lines.append(f"{kind} {c_in}->{c_out} {kernel[0]}x{kernel[1]} on {size[0]}x{size[1]} ({device}): {name}"
                         + (f" ({measured}, measured on the first batch)" if times else " (train.conv_method)"))
        return lines

    def summary(self) -> str:
        """The methods chosen, layer by layer, for runs.csv (e.g. "grouped,unfold64")."""
        return ",".join(name for name, _ in self.chosen.values())


def timed(method, module, a, g) -> float:
    import time

    def sync():
        if a.is_cuda:
            torch.cuda.synchronize(a.device)

    method(module, a, g)
    sync()
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        method(module, a, g)
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def summed_weight_grad(module, a, g):
    """sum_i dW_i: the layer's ordinary weight gradient from inputs a and output gradients g, the kernel's own on
    the layer's correlated pair."""
    x, dy, padding = correlated(module, a, g)
    return torch.nn.grad.conv2d_weight(x, module.weight.shape, dy, module.stride, padding, module.dilation)


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
