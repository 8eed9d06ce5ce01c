from __future__ import annotations

from dpgrid.lazy import lazy_import
from dpgrid.strategies.base import Strategy

torch = lazy_import("torch")


class NoDP(Strategy):
    """Non-private baseline: theta <- theta - rho * mean_i g_i (no clipping, no noise).

    Dividing by the realised batch size is fine here only because nothing is private.
    """

    label = "NoDP"
    private = False

    def step(self, grads) -> None:
        weights = torch.full((grads.size,), 1.0 / max(grads.size, 1), device=self.lr.device)
        self.descend(grads.weighted_sum(weights), self.lr)

