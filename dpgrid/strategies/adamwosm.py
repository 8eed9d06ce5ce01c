from __future__ import annotations

from dpgrid.lazy import lazy_import
from dpgrid.strategies.adam import AdamMoments

torch = lazy_import("torch")


class AdamWOSM(AdamMoments):
    """DPAdam without second moment (Mohapatra et al. 2022, Theorem 3).

        g_tilde = (sum_i g_bar_i + N(0, nu^2 C^2 I)) / B               (as DP-SGD)
        m_t = beta1 m_{t-1} + (1 - beta1) g_tilde,  m_hat = m_t / (1 - beta1^t)
        theta <- theta - ESS * m_hat,  ESS = alpha / (nu C / B + xi)

    ESS is DPAdam's effective step size when the noise dominates the second moment. The grid is
    over C only; alpha is fixed. The first moment is AdamMoments'.
    """

    label = "Adam WOSM"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        clips = torch.as_tensor(self.hp["clip"], dtype=torch.float64)  # C, or the G runs' Cs, as Python's floats
        ess = float(self.options["lr"]) / (self.noise.noise_multiplier * clips / self.batch_size + self.xi)
        self.lr = self.per_run_value(ess.tolist())  # constant within a run

    def linear_step(self):
        """m_t = (1 - beta1) v_t with v_t = beta1 v_{t-1} + g_tilde: the step moves by -ESS (1 - beta1) / (1 -
        beta1^t) v_t."""
        return self.beta1, float(self.lr) * (1 - self.beta1) / (1 - float(self.beta1_power) * self.beta1)

    def move(self, p, m, v, g) -> None:
        p.addcmul_(m, self.scaled_lr(p))  # theta -= ESS m_hat
