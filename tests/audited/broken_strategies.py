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


class ScaledNoise(FixedThreshold):
    """Draws `noise_scale` times the noise its plan calibrated (the config's strategy.noise_scale: 0.8, 0.5)."""

    def step(self, grads):
        clipped = grads.weighted_sum(self.clip_weights(grads.norms))
        scale = float(self.options["noise_scale"])
        self.descend(self.noisy_mean(clipped, scale * self.noise.noise_multiplier * self.clip), self.lr)


class LooseClip(FixedThreshold):
    """Clips at `clip_scale` times the threshold its noise is calibrated for (strategy.clip_scale: 1.25, 2)."""

    def step(self, grads):
        loose = torch.clamp(float(self.options["clip_scale"]) * self.clip / grads.norms.clamp_min(1e-12), max=1.0)
        clipped = grads.weighted_sum(loose)
        self.descend(self.noisy_mean(clipped, self.noise.noise_multiplier * self.clip), self.lr)


class ReusedNoise(FixedThreshold):
    """Draws the noise once and adds the same numbers at every step."""

    def step(self, grads):
        clipped = grads.weighted_sum(self.clip_weights(grads.norms))
        if not hasattr(self, "drawn"):
            self.drawn = self.noisy_mean([torch.zeros_like(c) for c in clipped], self.noise.noise_multiplier * self.clip)
        self.descend([s / self.batch_size + z for s, z in zip(clipped, self.drawn)], self.lr)


class EchoedBatch(FixedThreshold):
    """Adds the previous step's clipped sum to this step's: every example counts in two steps, as if it were sampled
    at 2q."""

    def step(self, grads):
        clipped = grads.weighted_sum(self.clip_weights(grads.norms))
        echoed = [c + p for c, p in zip(clipped, getattr(self, "previous", None) or [0] * len(clipped))]
        self.previous = [c.clone() for c in clipped]
        self.descend(self.noisy_mean(echoed, self.noise.noise_multiplier * self.clip), self.lr)


class OwnBatches(FixedThreshold):
    """A plugin that brings its own batches and still claims fixed_threshold's Poisson epsilon. The Strategy interface
    gives no say over the batches (the training loop draws them, dpgrid.training.train.batches); a plugin package that
    replaces that sampler, as one porting its data loader from another library might, changes them all the same. This
    one replaces it for the next sampler made only (the sampler of the run it is built for: a run's sampler is made
    after its strategy, and an audit trains one run at a time), so that the process trains honestly afterwards (the
    tests audit in their own process)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from dpgrid.training import train

        honest = train.batches

        def own(n, sample_rate, batch_size, sampling, source):
            train.batches = honest
            return self.batches(n, round(sample_rate * n), source)

        train.batches = own

    @staticmethod
    def batches(n: int, size: int, source):
        raise NotImplementedError


class FixedSizeBatches(OwnBatches):
    """Draws exactly round(q N) examples each step, without replacement, afresh each step: the mean count is q N as
    planned, the size never varies (jax_privacy #84: fixed batches void the subsampled Gaussian's guarantee)."""

    @staticmethod
    def batches(n: int, size: int, source):
        from dpgrid.privacy.randomness import permutation

        while True:
            yield permutation(n, source)[:size]


class ShuffledBatches(OwnBatches):
    """Shuffles once per epoch and cuts the permutation into batches of round(q N): each example is in exactly one
    batch per epoch, consecutive batches share none (dpgrid's own train.sampling=shuffle, which claims no epsilon)."""

    @staticmethod
    def batches(n: int, size: int, source):
        from dpgrid.privacy.randomness import permutation

        while True:
            order = permutation(n, source)
            for start in range(0, n - size + 1, size):
                yield order[start:start + size]
