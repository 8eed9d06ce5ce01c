"""nn.Embedding: a sample's gradient adds G_it to row idx_it of the table for each of its positions t (padding_idx's
row gets none, as PyTorch's backward gives it none). Never materialised:

    ||g_i||^2 = sum_{t, s: idx_it = idx_is} G_it . G_is     (the ghost norm over the sample's repeated tokens)
    sum_i w_i g_i = index_add of w_i G_it into rows idx_it   (one scatter over the b T positions)

Where every sample looks up the same distinct rows (a position embedding), ||g_i|| = ||G_i||_F and the sums are
(w G) placed in those rows: no T x T mask, no scatter (on a CPU).

max_norm (which renormalises rows in the forward pass), scale_grad_by_freq and sparse gradients are not served."""

import torch
from torch import nn

from dpgrid.training.rules import LayerRule, register_rule


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    @staticmethod
    def unsupported(module) -> str:
        for setting in ("max_norm", "scale_grad_by_freq", "sparse"):
            if getattr(module, setting):
                return f"Embedding with {setting}"
        return ""

    def __init__(self, module, a, g, choice, params, stacked=False):
        super().__init__(module, a, g, choice, params, stacked)
        self.idx = a.reshape(len(a), -1)               # (b, T) indices
        self.g = g.reshape(len(g), -1, g.shape[-1])    # (b, T, d)
        if module.padding_idx is not None:  # its row learns nothing: its positions count for nothing
            self.g = self.g * (self.idx != module.padding_idx).unsqueeze(-1).to(g.dtype)
        first = self.idx[0]  # (not looked for on CUDA: the test would make the host wait for the device every step)
        self.same_rows = not self.idx.is_cuda and bool((self.idx == first).all()) and \
            len(torch.unique(first)) == len(first)

    def sq_norms(self):
        if self.same_rows:
            return torch.linalg.vector_norm(self.g.flatten(1), dim=1).square_()
        same = (self.idx[:, :, None] == self.idx[:, None, :]).to(self.g.dtype)  # (b, T, T): the same row
        return (same * torch.bmm(self.g, self.g.transpose(1, 2))).sum((1, 2))

    def weighted_sum(self, w, subsets=None):
        m, (b, positions, d) = len(w), self.g.shape
        table = self.g.new_zeros((m, self.module.num_embeddings, d))
        if self.same_rows:
            return [table.index_copy_(1, self.idx[0], (w @ self.g.reshape(b, -1)).view(m, positions, d))]
        rows = self.idx.reshape(-1)  # (b T,)
        weighted = (w[:, :, None, None] * self.g).reshape(m, b * positions, d)
        return [table.index_add_(1, rows, weighted)]
