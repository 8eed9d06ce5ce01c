"""An accounting method from outside dpgrid: the noise multiplier is stated, as papers that fix sigma report it,
and the grid's K runs at that noise compose (dpgrid's composition, every figure computed the same way).

privacy.selection=fixed_noise privacy.selection.noise_multiplier=1.1: every run trains with nu = 1.1, and
epsilon_spent is what the K runs spend at it under privacy.accountant; privacy.epsilon is then the most the user
allows, and a noise that spends more is refused before anything trains. One module plus one config
(conf/privacy/selection/fixed_noise.yaml): the runner, the tables and `dpgrid plan` ask the class, as they ask
the built-in methods.
"""

from dataclasses import dataclass

from dpgrid.privacy.composition import Composition


class FixedNoise(Composition):
    @dataclass
    class Options:
        noise_multiplier: float = 1.0

    name = "fixed_noise"

    @classmethod
    def check_options(cls, read) -> None:
        read.real("privacy.selection.noise_multiplier", "a number in [0.1, 1000] (below 0.1 no accountant is "
                  "accurate enough to state what it spends)", lambda v: 0.1 <= v <= 1000)

    def calibrate(self, plan, strategy_cls, options: dict, privacy: dict, problem: dict) -> dict:
        return self.spent(plan, strategy_cls, options, float(privacy["noise_multiplier"]))
