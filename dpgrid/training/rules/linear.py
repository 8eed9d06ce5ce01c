"""nn.Linear, on inputs of any rank: g_i = sum_t G_it^T a_it over the sample's positions t (one position for a
(b, in) input, a sequence's tokens for (b, T, in), every leading index otherwise).

- (b, in): ||g_i||^2 = ||G_i||^2 ||a_i||^2 (+ ||G_i||^2 for the bias), never materialised (Li et al. 2022); sums
  sum_i w_i g_i = (w * G)^T A, one matmul. Stacked runs ((G, b, in): dpgrid.training.stacked) the same per run.
- (b, T, in): first the positions before the first and after the last where some sample's output gradient is
  non-zero are dropped (exact: they add nothing to any g_i; a class-token readout's last block and padding at the
  end that no one attends to have them); then the ghost norm,
  ||g_i||^2 = <A_i A_i^T, G_i G_i^T> (Gram matrices over positions, b T^2 numbers), or the norms of the per-sample
  gradients G_i^T A_i materialised a few samples at a time, whichever measures cheaper for the shape; sums are one
  matmul over the b T rows either way, as the weight gradient is. Stacked, (G, b, T, in): the ghost norm per run.
"""

import torch
from torch import nn

from dpgrid.training.rules import LayerRule, register_rule

CHUNK_BYTES = 1 << 20  # per-sample gradients are materialised this much at a time (cache-sized: no large buffer)


SCREENED = 8  # samples whose dead positions are looked for first: the whole batch is read only where they share some


def live_span(g):
    """(first, last + 1) of the positions where some sample's output gradient is non-zero (g: (b, T, out)), or None
    where that is all of them. CPU only: on CUDA the test would synchronise with the host every step."""
    if g.is_cuda:
        return None

    def live(rows):  # (T,): some sample of rows has a non-zero gradient there (NaN counts); no temporary as large as g
        return ((rows.amax(-1) != 0) | (rows.amin(-1) != 0)).any(0)

    if bool(live(g[:SCREENED]).all()):
        return None
    positions = live(g).nonzero().squeeze(1).tolist()
    span = (positions[0], positions[-1] + 1) if positions else (0, 0)
    return None if span == (0, g.shape[1]) else span


def ghost_sq_norms(a, g):
    """(b,) ||G_i^T a_i||^2 = <a_i a_i^T, G_i G_i^T>: b T^2 (in + out) multiplications, no per-sample gradient."""
    return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


def materialised_sq_norms(a, g):
    """(b,) ||G_i^T a_i||^2 with G_i^T a_i formed a chunk of samples at a time (b T in out multiplications)."""
    b, n_in, out = len(a), a.shape[-1], g.shape[-1]
    step = max(1, CHUNK_BYTES // (n_in * out * a.element_size()))
    norms = a.new_empty(b)
    for start in range(0, b, step):  # vector_norm reduces without a squared temporary
        grads = torch.bmm(g[start:start + step].transpose(1, 2), a[start:start + step])
        torch.linalg.vector_norm(grads.flatten(1), dim=1, out=norms[start:start + step])
    return norms.square_()


@register_rule(nn.Linear)
class LinearRule(LayerRule):
    stacks = True

    def __init__(self, module, a, g, choice, params, stacked=False):
        super().__init__(module, a, g, choice, params, stacked)
        self.has_weight, self.has_bias = "weight" in params, "bias" in params
        lead = 2 if stacked else 1  # (G, b) or (b,) before the positions
        if a.dim() > lead + 1:  # positions: every index between the sample and the features
            self.a, self.g = a.flatten(lead, -2), g.flatten(lead, -2)
        self.sequence = self.a.dim() == lead + 2
        self.positions = self.a.shape[-2] if self.sequence else 1  # the layer's, before dead positions are dropped
        whole = self.a, self.g
        span = live_span(self.g) if self.sequence and not stacked else None
        if span is not None:  # views, no copy: the positions outside add nothing
            self.a, self.g = self.a[:, span[0]:span[1]], self.g[:, span[0]:span[1]]
            if span[1] - span[0] == 1:  # one live position: the (b, in) forms, copied (the whole input can go)
                self.a, self.g, self.sequence = self.a[:, 0].contiguous(), self.g[:, 0].contiguous(), False
        self.whole = whole if self.sequence else None  # every position (the span's views hold them anyway)
        self._position_sums = None

    def sq_norms(self):
        if self.sequence and self.stacked:  # (G, b, T, in): each run's ghost norms
            a, g = self.a, self.g
            bias = g.sum(2).pow(2).sum(-1) if self.has_bias else 0
            return bias + ((a @ a.transpose(-1, -2)) * (g @ g.transpose(-1, -2))).sum((-1, -2)) * self.has_weight
        if self.sequence:
            return self.sequence_sq_norms()
        if self.a.dim() == 3:  # stacked: the float rounding stacked grids have always had (their recorded numbers)
            g2 = self.g.pow(2).sum(-1)
            return g2 * (self.a.pow(2).sum(-1) * self.has_weight + self.has_bias)
        # vector_norm reduces without a (b, in) temporary: large fresh buffers page-fault on every step
        g2 = torch.linalg.vector_norm(self.g, dim=1).square_()
        if not self.has_weight:
            return g2
        weight = g2 * torch.linalg.vector_norm(self.a, dim=1).square_()
        return weight + g2 if self.has_bias else weight

    def sequence_sq_norms(self):
        a, g = self.a, self.g
        bias = self.position_sums().pow(2).sum(1) if self.has_bias else 0
        if not self.has_weight:
            return bias
        # The sums cost the same after either form, so the norms alone are timed, on the whole first batch (neither
        # form holds more than a chunk of per-sample numbers) and on every position of the layer: the times the log
        # prints depend on its shape, not on where this private batch's gradients are zero. One choice per shape.
        n_in, out = a.shape[-1], g.shape[-1]
        key = ("Linear", n_in, out, self.positions, str(a.device), str(a.dtype))
        forms = {"ghost": ghost_sq_norms, "per_sample": materialised_sq_norms}
        return self.choice.pick(key, f"Linear {n_in}->{out} on {self.positions} positions ({a.device})",
                                {name: (lambda f=f: f(a, g)) for name, f in forms.items()}, a.device,
                                {name: (lambda f=f: f(*self.whole)) for name, f in forms.items()}) + bias

    def weighted_sum(self, w, subsets=None):
        """w: (m, b) -> [(m, out, in), (m, out)] of the parameters that train; stacked, w: (m, G, b) -> (m, G, ...)."""
        if self.sequence and self.stacked:
            return ([torch.einsum("mgb,gbto,gbti->mgoi", w, self.g, self.a)] if self.has_weight else []) + \
                ([torch.einsum("mgb,gbo->mgo", w, self.g.sum(2))] if self.has_bias else [])
        if self.sequence:
            return self.sequence_sums(w, subsets)
        if self.a.dim() == 3:
            wg = w.unsqueeze(-1) * self.g  # (m, G, b, out)
            return ([torch.einsum("mgbo,gbi->mgoi", wg, self.a)] if self.has_weight else []) + \
                ([wg.sum(2)] if self.has_bias else [])
        bias = [w @ self.g] if self.has_bias else []
        return ([self.sample_sums(self.a, self.g, w, subsets)] if self.has_weight else []) + bias

    @classmethod
    def sample_sums(cls, a, g, w, subsets=None):
        """sum_i w_mi sum_t g_it^T a_it: a (b, [T,] in), g (b, [T,] out), w (m, b) -> (m, out, in)."""
        m, b, out, n_in = len(w), len(g), g.shape[-1], a.shape[-1]
        # For wide inputs BLAS is faster computing the transpose A^T (w G), (in, out): 750 -> 128
        # measured 0.57-0.61 vs 0.66-1.0 ms (two runs) at b = 512 on this CPU. The sums are then transposed views.
        transposed = n_in > out
        if subsets is None and m == 1 and a.dim() > 2:  # scaling G_i in place of repeating w_i over its positions
            subsets = [None]
        if subsets is not None:
            # Disjoint supports: each sample joins one sum only, so all m sums cost one b-long matmul.
            sums = g.new_empty((m, n_in, out) if transposed else (m, out, n_in))
            for k, idx in enumerate(subsets):
                cls._subset_sum(a, g, w[k], idx, sums[k], transposed)
            return sums.transpose(1, 2) if transposed else sums
        weights = w.view(m, b, *[1] * (g.dim() - 1))
        wg = (weights * g).movedim(0, -2).reshape(-1, m * out)  # (rows, m*out): one stacked matmul
        a = a.reshape(-1, n_in)
        if transposed:
            return (a.t() @ wg).view(n_in, m, out).permute(1, 2, 0)
        return (wg.t() @ a).view(m, out, n_in)

    def sequence_sums(self, w, subsets=None):
        bias = [w @ self.position_sums()] if self.has_bias else []
        if not self.has_weight:
            return bias
        # the b T positions as the rows of one matmul, as the weight gradient is
        return [self.sample_sums(self.a, self.g, w, subsets)] + bias

    def position_sums(self):
        """(b, out): each sample's output gradients summed over its positions (the bias's per-sample gradients)."""
        if self._position_sums is None:
            self._position_sums = self.g.sum(1)
        return self._position_sums

    @staticmethod
    def _subset_sum(a, g, w, idx, result, transposed):
        """result <- sum over the samples idx (None: all) of w_i sum_t g_it^T a_it (or its transpose), in place."""
        if idx is None:
            g = g * w.view(-1, *[1] * (g.dim() - 1))
        elif len(idx) == 0:
            result.zero_()
            return
        else:
            # index_select: 5x faster than a[idx] on CPU for these row gathers
            g = torch.index_select(g, 0, idx).mul_(torch.index_select(w, 0, idx).view(-1, *[1] * (g.dim() - 1)))
            a = torch.index_select(a, 0, idx)
        a, g = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
        torch.mm(a.t(), g, out=result) if transposed else torch.mm(g.t(), a, out=result)

    @staticmethod
    def stacked_forward(layer, x, params):
        """G runs' outputs of this layer, x (G, b, ..., in), from their stacked parameters (the layer's own order)."""
        weight, bias = params[0], params[1] if len(params) > 1 else None
        rows = x.flatten(1, -2)  # (G, b ..., in)
        out = torch.bmm(rows, weight.transpose(1, 2)) if bias is None else \
            torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))
        return out.view(*x.shape[:-1], out.shape[-1])
