from __future__ import annotations

from dpgrid.lazy import lazy_import
from dpgrid.strategies.base import Strategy

torch = lazy_import("torch")


class Online(Strategy):
    """OSO-DPSGD (Galli et al. 2024, Algorithm 1 with Eqs. 17, 18, 20, 21).

        g_bar_i = g_i * min(1, C_t / n_i);   q_i = g_i / n_i if n_i > C_t else 0   (||q_i|| in {0, 1})
        g_tilde_t = (sum_i g_bar_i + N(0, nu_g^2 C_t^2 I)) / B                     (Eq. 18)
        q_tilde_t = (sum_i q_i + N(0, nu_q^2 I)) / B                               (Eq. 17)
        theta_{t+1} = theta_t - rho_t g_tilde_t
        C_{t+1}   = C_t   * exp(rho_c sign(g_tilde_t . q_tilde_{t-1}))             (Eq. 20)
        rho_{t+1} = rho_t * exp(rho_r sign(g_tilde_t . g_tilde_{t-1}))             (Eq. 21)

    with q_tilde_0 = g_tilde_0 = 0. Privacy (Proposition 1): the two queries are one Gaussian
    mechanism of multiplier nu when nu^-2 = nu_g^-2 + nu_q^-2; nu_g = 1.01 nu gives nu_q ~ 7.124 nu.

    q_tilde_{t-1} is used only through the one number g_tilde_t . q_tilde_{t-1}. Its noise z ~ N(0, nu_q^2 I)
    is independent of g_tilde_t (which depends on z_{t-2} at the earliest), so g_tilde_t . z is exactly
    N(0, nu_q^2 ||g_tilde_t||^2) given everything before: `q_alignment` draws that one normal instead of P.
    Every quantity the run uses has the same joint distribution as with q_tilde drawn in full, so the
    guarantee is unchanged, and the step draws half the noise.
    """

    label = "Online"
    adapts = ("clip", "lr")
    stacks = True
    captures = True
    gradient_query = "noise_multiplier_g"

    @classmethod
    def check_options(cls, options) -> None:
        for key in ("clip0", "clip_lr", "lr_lr"):
            options.positive(key)
        # nu_q = (nu^-2 - nu_g^-2)^-1/2 is finite and real only for nu_g > nu
        options.real("grad_noise_ratio", "a finite number > 1 (nu_g = ratio x nu)", lambda v: v > 1)

    @staticmethod
    def split_noise(noise_multiplier: float, options: dict, batch_size: int) -> dict:
        nu_g = float(options["grad_noise_ratio"]) * noise_multiplier
        nu_q = (noise_multiplier ** -2 - nu_g ** -2) ** -0.5
        return {"noise_multiplier_g": nu_g, "noise_multiplier_q": nu_q}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clip.fill_(float(self.options["clip0"]))
        self.clip_lr, self.lr_lr = float(self.options["clip_lr"]), float(self.options["lr_lr"])  # rho_c, rho_r
        self.prev_g = self.prev_q_sum = None  # g_tilde_{t-1} and sum_i q_i of t-1, flat; None stands for 0

    def step(self, grads) -> None:
        norms, clip = grads.norms, self.clip
        unclipped = (norms <= self.per_run(clip, norms)).to(norms.dtype)
        q_weights = (1 - unclipped) / norms.clamp_min(1e-12)
        # A clipped sample contributes g_i C / n_i = C q_i: sum_i g_bar_i = sum_{n_i <= C} g_i + C sum_i q_i,
        # two sums over disjoint samples, which the engine computes for the price of one.
        unclipped_sum, q_sum = grads.weighted_sums(unclipped, q_weights)
        clipped_sum = [u.addcmul_(q, self.per_run(clip, q)) for u, q in zip(unclipped_sum, q_sum)]  # u is ours
        g_flat, g_tilde = self.noisy_mean_flat(clipped_sum, self.noise.queries["noise_multiplier_g"] * clip)
        self.descend(g_tilde, self.lr)
        if self.prev_g is not None:  # sign(0) = 0 at t = 1: C and rho stay
            self.clip = clip * torch.exp(self.clip_lr * torch.sign(self.q_alignment(g_flat)))
            self.lr = self.lr * torch.exp(self.lr_lr * torch.sign(self.dot(g_flat, self.prev_g)))
        self.prev_g, self.prev_q_sum = g_flat, self.flatten(q_sum)

    def q_alignment(self, g_tilde: torch.Tensor) -> torch.Tensor:
        """g_tilde_t . q_tilde_{t-1} = (g_tilde_t . sum_i q_i + nu_q ||g_tilde_t|| xi) / B, xi ~ N(0, 1)
        (Eq. 17 with the noise projected on g_tilde_t; see the class docstring). Flat vectors."""
        g_norm = torch.linalg.vector_norm(g_tilde, dim=-1)
        xi = self.normal((), g_norm)
        return (self.dot(g_tilde, self.prev_q_sum) + self.noise.queries["noise_multiplier_q"] * g_norm * xi) / self.batch_size

