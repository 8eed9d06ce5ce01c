from dpgrid.strategies.base import Strategy


class FixedThreshold(Strategy):
    """DP-SGD with a fixed clipping threshold C (Abadi et al. 2016).

        g_bar_i = g_i * min(1, C / n_i)
        g_tilde = (sum_i g_bar_i + N(0, nu^2 C^2 I)) / B
        theta  <- theta - rho * g_tilde
    """

    label = "Fixed Threshold"
    stacks = True
    captures = True

    def step(self, grads) -> None:
        clipped_sum = grads.weighted_sum(self.clip_weights(grads.norms))
        g_tilde = self.noisy_mean(clipped_sum, self.noise.noise_multiplier * self.clip)
        self.descend(g_tilde, self.lr)

