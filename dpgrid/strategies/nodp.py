import torch

from .base import Strategy


class NoDP(Strategy):
    """Non-private baseline: theta <- theta - rho * mean_i g_i (no clipping, no noise).

    Dividing by the realised batch size is fine here only because nothing is private.
    """

    private = False

    def step(self, grads) -> None:
        b = len(grads.norms)
        weights = torch.full((b,), 1.0 / max(b, 1), device=grads.norms.device, dtype=grads.norms.dtype)
        self.descend(grads.weighted_sum(weights), self.lr)


STRATEGY = NoDP
