"""DP-SGD with a clipping threshold that decays linearly over the run, a schedule that reads where training is:

    C_t = C (1 - (1 - final_fraction) t / T)          (t = 1..T: C at the start, final_fraction x C at the end)
    g_bar_i = g_i min(1, C_t / n_i);   g_tilde = (sum_i g_bar_i + N(0, nu^2 C_t^2 I)) / B

The noise follows C_t, the sensitivity of each step's sum, so every step is the same Gaussian mechanism of
multiplier nu and the grid's accounting is unchanged. T, t, N, B and the epoch come from `self.progress`.
"""

from dpgrid.strategies import FixedThreshold


class ClipDecay(FixedThreshold):
    label = "Clip decay"
    adapts = ("clip",)  # its final threshold is recorded (final_clip) and drawn in the learning curves

    @classmethod
    def check_options(cls, options) -> None:
        options.fraction("final_fraction")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_clip = self.clip.clone()  # C of the configuration; (G,) for stacked runs
        self.final_fraction = float(self.options["final_fraction"])

    def step(self, grads) -> None:
        done = self.progress.step / self.progress.steps
        self.clip = self.start_clip * (1 - (1 - self.final_fraction) * done)
        super().step(grads)
