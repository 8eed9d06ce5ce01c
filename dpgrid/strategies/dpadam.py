from __future__ import annotations

from dpgrid.lazy import lazy_import
from dpgrid.strategies.adam import AdamMoments

torch = lazy_import("torch")


class DPAdam(AdamMoments):
    """DPAdam (Mohapatra et al. 2022, Section 4): Adam (Kingma & Ba 2015) on DP-SGD's noisy mean gradient.

        g_tilde = (sum_i g_bar_i + N(0, nu^2 C^2 I)) / B               (as DP-SGD)
        m_t = beta1 m_{t-1} + (1 - beta1) g_tilde,     m_hat = m_t / (1 - beta1^t)
        v_t = beta2 v_{t-1} + (1 - beta2) g_tilde^2,   v_hat = v_t / (1 - beta2^t)
        theta <- theta - alpha m_hat / (sqrt(v_hat) + xi)

    The per-coordinate effective step size alpha / (sqrt(v_hat) + xi) tends to adamwosm's
    ESS = alpha / (nu C / B + xi) when the noise dominates the gradient (their Theorem 3: v_hat -> (nu C / B)^2).
    The grid is over C with alpha fixed (the paper's default 1e-3); `grid: [lr, clip]` tunes alpha too.
    The moments are AdamMoments'.
    """

    label = "DPAdam"
    second_moment = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "lr" not in self.hp:  # alpha from the config unless the grid tunes it
            self.lr.fill_(float(self.options["lr"]))
        self.beta2 = float(self.options["beta2"])

    def linear_step(self):
        return None  # each coordinate's step is divided by its own sqrt(v_hat): not one (mu, a) for all

    def move(self, p, m, v, g) -> None:
        v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
        step = m.div(v.div(1 - self.beta2_power).sqrt_().add_(self.xi))  # m / (sqrt(v_hat) + xi)
        p.addcmul_(step, self.scaled_lr(p))

    def effective_step_size(self) -> list:
        """alpha / (sqrt(v_hat) + xi) per coordinate (Theorem 3's quantity)."""
        second = 1 - self.beta2_power
        return [self.per_run(self.lr, v) / (v.div(second).sqrt() + self.xi) for v in self.v]
