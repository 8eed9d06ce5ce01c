from dpgrid.strategies.noisy_gd import NoisyGD


class ConstantNoise(NoisyGD):
    """Noisy gradient descent with a constant noise standard deviation, sigma_t = sigma, eta = 1/(2M): the PUR
    paper's baseline over sigma in {0.001, 0.01, 0.1, 1.0}. Each sigma's run spends epsilon on its own; the
    paper's "best constant" is the best of them chosen in hindsight, which no epsilon covers."""

    label = "Constant noise"

    @classmethod
    def check_options(cls, options) -> None:
        options.numbers("axes.sigma", "positive", lambda v: v > 0)

    @classmethod
    def sigmas(cls, hp: dict, problem: dict):
        while True:
            yield float(hp["sigma"])
