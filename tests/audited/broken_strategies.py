"""Strategies that claim fixed_threshold's epsilon and do not earn it: what `dpgrid audit` must catch
(tests/test_audit.py)."""

import torch

from dpgrid.strategies import FixedThreshold


class NoNoise(FixedThreshold):
    """Clips, then forgets the noise."""

    def step(self, grads):
        clipped = grads.weighted_sum(self.clip_weights(grads.norms))
        self.descend([s / self.batch_size for s in clipped], self.lr)


class TenthNoise(FixedThreshold):
    """Adds a tenth of the noise its plan calibrated."""

    def step(self, grads):
        clipped = grads.weighted_sum(self.clip_weights(grads.norms))
        self.descend(self.noisy_mean(clipped, self.noise.noise_multiplier * self.clip / 10), self.lr)


class NoClip(FixedThreshold):
    """Adds the noise, never clips."""

    def step(self, grads):
        summed = grads.weighted_sum(torch.ones(grads.size, device=grads.device))
        self.descend(self.noisy_mean(summed, self.noise.noise_multiplier * self.clip), self.lr)
