from __future__ import annotations

from dpgrid.lazy import lazy_import
from dpgrid.strategies.base import Strategy, no_grad

torch = lazy_import("torch")


class AdamMoments(Strategy):
    """What both Adam strategies of Mohapatra et al. 2022 keep: Adam's first moment (Kingma & Ba 2015) of DP-SGD's
    noisy mean gradient,

        g_tilde = (sum_i g_bar_i + N(0, nu^2 C^2 I)) / B               (as DP-SGD)
        m_t = beta1 m_{t-1} + (1 - beta1) g_tilde,     m_hat = m_t / (1 - beta1^t),

    and, where `second_moment`, the second, v_t = beta2 v_{t-1} + (1 - beta2) g_tilde^2. A subclass says how they move
    a parameter (`move`). `train.momentum` does not apply (beta1 is the momentum here)."""

    uses_momentum = False  # beta1 is its momentum
    stacks = True
    captures = True  # the step count lives on the device, as beta1^t (and beta2^t)
    second_moment = False

    @classmethod
    def check_options(cls, options) -> None:
        options.positive("lr")
        options.fraction("beta1", closed_low=True)
        if cls.second_moment:
            options.fraction("beta2", closed_low=True)
        options.real("xi", "a finite number >= 0", lambda v: v >= 0)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.beta1, self.xi = float(self.options["beta1"]), float(self.options["xi"])
        # beta1^t and beta2^t after t steps, in float64 on the device: the bias corrections 1 - beta^t without a step
        # count on the host, which a CUDA graph would replay frozen
        self.beta1_power = torch.ones((), dtype=torch.float64, device=self.params[0].device)
        self.beta2_power = self.beta1_power.clone() if self.second_moment else None
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params] if self.second_moment else [None] * len(self.params)

    @no_grad
    def step(self, grads) -> None:
        clipped_sum = grads.weighted_sum(self.clip_weights(grads.norms))
        g_tilde = self.noisy_mean(clipped_sum, self.noise.noise_multiplier * self.clip)
        self.beta1_power.mul_(self.beta1)
        if self.second_moment:
            self.beta2_power.mul_(self.beta2)
        for p, m, v, g in zip(self.params, self.m, self.v, g_tilde):
            m.mul_(self.beta1).add_(g, alpha=1 - self.beta1)
            self.move(p, m, v, g)

    def move(self, p, m, v, g) -> None:
        """Move parameter p by its moments m (and v: updated here where `second_moment`) after the t-th gradient g
        (self.beta1_power is beta1^t then)."""
        raise NotImplementedError

    def scaled_lr(self, like):
        """-lr / (1 - beta1^t) shaped for `like` (a tensor: no host sync, and a CUDA graph replays it right)."""
        return self.per_run(self.lr, like) / (self.beta1_power - 1)
