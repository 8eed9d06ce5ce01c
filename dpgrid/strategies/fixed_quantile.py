from __future__ import annotations

from dpgrid.lazy import lazy_import
from dpgrid import DpgridError
from dpgrid.strategies.base import Strategy

torch = lazy_import("torch")


class FixedQuantile(Strategy):
    """Adaptive clipping to a target quantile gamma of the gradient norms (Andrew et al. 2021).

        g_tilde = (sum_i g_bar_i + N(0, nu_D^2 C_t^2 I)) / B           (g_bar_i clipped at C_t)
        b_tilde = (sum_i (1[n_i <= C_t] - 1/2) + N(0, sigma_b^2)) / B + 1/2
        C_{t+1} = C_t * exp(-eta_C (b_tilde - gamma))                  (geometric update)
        theta  <- theta - rho * g_tilde

    Privacy (their Theorem 1): the count query has sensitivity 1/2, so the pair is one Gaussian
    mechanism of multiplier nu when nu_D = (nu^-2 - (2 sigma_b)^-2)^-1/2; needs nu < 2 sigma_b.
    """

    label = "Fixed Quantile"
    adapts = ("clip",)
    stacks = True
    captures = True
    gradient_query = "noise_multiplier_grad"

    @classmethod
    def check_options(cls, options) -> None:
        for key in ("clip0", "clip_lr", "count_noise_divisor"):
            options.positive(key)

    @staticmethod
    def split_noise(noise_multiplier: float, options: dict, batch_size: int) -> dict:
        count_std = batch_size / float(options["count_noise_divisor"])
        if noise_multiplier >= 2 * count_std:
            raise DpgridError(
                f"fixed_quantile needs noise multiplier < 2 sigma_b = {2 * count_std:.4g} "
                f"(sigma_b = B / {options['count_noise_divisor']}), but the grid needs {noise_multiplier:.4g}; "
                f"raise privacy.epsilon or train.batch_size, or lower strategy.count_noise_divisor below "
                f"{2 * batch_size / noise_multiplier:.3g}")
        grad_multiplier = (noise_multiplier ** -2 - (2 * count_std) ** -2) ** -0.5
        return {"noise_multiplier_grad": grad_multiplier, "count_noise_std": count_std}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clip.fill_(float(self.options["clip0"]))
        self.quantile = self.per_run_value(self.hp["quantile"])
        self.clip_lr = float(self.options["clip_lr"])  # eta_C (config reads are slow in the hot loop)

    def step(self, grads) -> None:
        clipped_sum = grads.weighted_sum(self.clip_weights(grads.norms))
        g_tilde = self.noisy_mean(clipped_sum, self.noise.queries["noise_multiplier_grad"] * self.clip)
        below = (grads.norms <= self.per_run(self.clip, grads.norms)).to(self.clip.dtype)
        unclipped = ((below - 0.5) * grads.in_batch().to(below.dtype)).sum(-1)  # sum_i (1[n_i <= C_t] - 1/2)
        b_tilde = self.noisy_mean([unclipped], self.noise.queries["count_noise_std"])[0] + 0.5
        self.descend(g_tilde, self.lr)
        self.clip = self.clip * torch.exp(-self.clip_lr * (b_tilde - self.quantile))

