"""Per-sample gradient information, the only thing a strategy sees of the model.

A strategy asks for the per-sample norms n_i = ||g_i||_2 (over all parameters) and for weighted
sums sum_i w_i g_i (clipped sum: w_i = min(1, C / n_i); online's q: w_i = 1[n_i > C] / n_i).
How they are computed is this module's business: engines can change without touching strategies.
"""

from dataclasses import dataclass
from typing import Callable

import torch
from torch.func import functional_call, grad, vmap


@dataclass
class PerSampleGrads:
    norms: torch.Tensor          # (b,) per-sample gradient norms over all parameters
    loss: torch.Tensor           # 0-d, mean training loss over the batch (for the curves only)
    _grads: list                 # per parameter: (b, *shape) per-sample gradients
    _shapes: list                # parameter shapes, for the empty batch

    def weighted_sum(self, weights: torch.Tensor) -> list:
        """sum_i weights[i] * g_i, one tensor per parameter."""
        if len(weights) == 0:
            return [torch.zeros(s, device=weights.device) for s in self._shapes]
        return [torch.tensordot(weights, g, dims=1) for g in self._grads]


def per_sample_loss(task: str) -> Callable:
    """Loss of ONE sample (model output with batch dim 1, target): what vmap differentiates."""
    if task == "classification":
        return lambda out, y: torch.nn.functional.cross_entropy(out, y.unsqueeze(0))
    return lambda out, y: torch.nn.functional.mse_loss(out, y.unsqueeze(0))


class FuncEngine:
    """Per-sample gradients with torch.func (vmap over grad): exact, materialises b x P numbers."""

    def __init__(self, model: torch.nn.Module, task: str):
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.params = [p for _, p in model.named_parameters()]
        loss_one = per_sample_loss(task)

        def loss(params, x, y):
            out = functional_call(model, dict(zip(self.names, params)), (x.unsqueeze(0),))
            return loss_one(out, y)

        self._grad_and_loss = vmap(grad(loss, has_aux=False), in_dims=(None, 0, 0))
        self._loss = vmap(loss, in_dims=(None, 0, 0))

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> PerSampleGrads:
        shapes = [p.shape for p in self.params]
        if len(x) == 0:  # Poisson sampling can draw an empty batch: no gradients, noise only
            zero = torch.zeros((), device=x.device)
            return PerSampleGrads(torch.zeros(0, device=x.device), zero, [], shapes)
        params = [p.detach() for p in self.params]
        grads = self._grad_and_loss(params, x, y)
        with torch.no_grad():
            loss = self._loss(params, x, y).mean()
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads))
        return PerSampleGrads(norms, loss, list(grads), shapes)
