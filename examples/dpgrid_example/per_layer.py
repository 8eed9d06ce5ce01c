"""Per-layer (group-wise) clipping (He et al. 2023, "Exploring the limits of differentially private deep
learning with group-wise clipping", ICLR), with the threshold split equally over the L layers:

    C_l = C / sqrt(L)                                            (sum_l C_l^2 = C^2)
    g_bar_i = (g_{i,1} min(1, C_1 / ||g_{i,1}||), ..., g_{i,L} min(1, C_L / ||g_{i,L}||))
    g_tilde = (sum_i g_bar_i + N(0, nu^2 C^2 I)) / B             (||g_bar_i|| <= C: the sensitivity is C)
    theta  <- theta - rho * g_tilde

The sensitivity is C, as for one threshold over all parameters, so the grid's noise multiplier nu applies
unchanged; the grid is over (lr, clip) as fixed_threshold's. Each layer is clipped on its own: a layer with
large gradients no longer shrinks the others' share.
"""

import math

import torch

from dpgrid.strategies import Strategy


class PerLayerClipping(Strategy):
    label = "Per-layer clipping"
    stacks = True  # one step for one run and for G stacked runs (tests: dpgrid.testing.check_stacked)
    captures = True  # on CUDA, replayed as a CUDA graph: no host read, a padded row has norm inf (check_padded)

    @torch.no_grad()
    def step(self, grads) -> None:
        norms = grads.group_norms                                  # (b, L): ||g_{i,l}||; stacked (G, b, L)
        layer_clip = self.per_run(self.clip, norms) / math.sqrt(norms.shape[-1])  # C_l = C / sqrt(L), each run's C
        weights = torch.clamp(layer_clip / norms.clamp_min(1e-12), max=1.0)
        clipped_sum = grads.group_weighted_sum(weights)            # sum_i w_{i,l} g_{i,l}, per parameter
        g_tilde = self.noisy_mean(clipped_sum, self.noise.noise_multiplier * self.clip)
        self.descend(g_tilde, self.lr)
