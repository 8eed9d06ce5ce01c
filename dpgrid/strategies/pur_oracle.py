import math

from dpgrid.strategies.noisy_gd import NoisyGD


class PUROracle(NoisyGD):
    """The PUR paper's data-dependent schedule (Proposition 1, Eq. 6): sigma_t = ||grad F(theta_t)|| / sqrt(d),
    eta = 1/(2M). It reads the true gradient norm, so it is NOT private: its plan and rows claim no epsilon
    ("not private (oracle)"); its curves record the epsilon it would spend were the gradient norm free, as the
    paper's Figure 1 shows it."""

    label = "PUR oracle (not private)"
    oracle = True

    def sigma(self, gradient_norm) -> float:
        return max(float(gradient_norm), 1e-300) / math.sqrt(self.p["d"])  # reads the norm: one wait per step
