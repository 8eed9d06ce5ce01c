from __future__ import annotations

from dpgrid.lazy import lazy_import
from dpgrid.strategies.base import Strategy, no_grad

torch = lazy_import("torch")


class AdamWOSM(Strategy):
    """DPAdam without second moment (Mohapatra et al. 2022, Theorem 3).

        g_tilde = (sum_i g_bar_i + N(0, nu^2 C^2 I)) / B               (as DP-SGD)
        m_t = beta1 m_{t-1} + (1 - beta1) g_tilde,  m_hat = m_t / (1 - beta1^t)
        theta <- theta - ESS * m_hat,  ESS = alpha / (nu C / B + xi)

    ESS is DPAdam's effective step size when the noise dominates the second moment. The grid is
    over C only; alpha is fixed. `train.momentum` does not apply (beta1 is the momentum here).
    """

    label = "Adam WOSM"
    uses_momentum = False  # beta1 is its momentum
    stacks = True

    @classmethod
    def check_options(cls, options) -> None:
        options.positive("lr")
        options.fraction("beta1", closed_low=True)
        options.real("xi", "a finite number >= 0", lambda v: v >= 0)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c = self.options
        clips = torch.as_tensor(self.hp["clip"], dtype=torch.float64)  # C, or the G runs' Cs, as Python's floats
        ess = float(c["lr"]) / (self.noise.noise_multiplier * clips / self.batch_size + float(c["xi"]))
        self.lr = self.per_run_value(ess.tolist())  # constant within a run
        self.beta1 = float(c["beta1"])
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]

    def linear_step(self):
        """m_t = (1 - beta1) v_t with v_t = beta1 v_{t-1} + g_tilde: the step moves by -ESS (1 - beta1) / (1 -
        beta1^t) v_t."""
        return self.beta1, float(self.lr) * (1 - self.beta1) / (1 - self.beta1 ** (self.t + 1))

    @no_grad
    def step(self, grads) -> None:
        clipped_sum = grads.weighted_sum(self.clip_weights(grads.norms))
        g_tilde = self.noisy_mean(clipped_sum, self.noise.noise_multiplier * self.clip)
        self.t += 1
        correction = 1 - self.beta1 ** self.t
        for p, m, g in zip(self.params, self.m, g_tilde):
            m.mul_(self.beta1).add_(g, alpha=1 - self.beta1)
            p.addcmul_(m, self.per_run(self.lr, p), value=-1 / correction)  # theta -= ESS m_hat, no temporaries

