"""Automatic clipping (Bu et al. 2023, "Automatic clipping: differentially private deep learning made
easier and stronger"), the AUTO-S normalisation:

    g_hat_i = g_i / (||g_i|| + gamma)                 (||g_hat_i|| < 1: sensitivity 1, no threshold)
    g_tilde = (sum_i g_hat_i + N(0, nu^2 I)) / B      (B the expected batch size)
    theta  <- theta - rho * g_tilde

There is no clipping threshold to tune: the grid is over the learning rate only (K = k).
"""

import torch

from dpgrid.strategies import Strategy


class AutomaticClipping(Strategy):
    label = "Automatic (AUTO-S)"

    @classmethod
    def check_options(cls, options) -> None:
        options.positive("gamma")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gamma = float(self.options["gamma"])
        self.clip.fill_(1.0)  # the sensitivity, recorded as the run's clip

    @torch.no_grad()
    def step(self, grads) -> None:
        weights = 1.0 / (grads.norms + self.gamma)
        g_tilde = self.noisy_mean(grads.weighted_sum(weights), self.noise.noise_multiplier)
        self.descend(g_tilde, self.lr)
