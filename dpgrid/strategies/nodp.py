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
    stacks = True
    captures = True

    def step(self, grads) -> None:
        self.descend(grads.weighted_sum(grads.mean_weights()), self.lr)

