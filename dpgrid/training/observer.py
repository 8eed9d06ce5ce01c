"""What may watch a grid's runs from outside, through the one hook training offers: `dpgrid audit`'s canaries are
such an observer, and training imports nothing of the audit (nor of any other caller).

An observer is the spec's `observer` (None: nobody watches). It may change the data the runs train on (the audit's
black-box canaries, appended examples), and for each run it may return a `Watcher`: an engine that wraps the run's
engine (the audit's white-box canaries, extra examples on coordinates of their own), with the extra parameters the
strategy updates beside the model's, called before and after every step and when the run ends (to keep what
it measured beside the run's results). A watched grid trains one run at a time.
"""


class Watcher:
    """One run's watcher: `engine` (the run's, wrapped) and `params` (extra parameters the strategy updates)."""

    engine = None
    params: list = []

    def before_step(self, step: int, strategy) -> None:
        """Before step `step` (1..T) is taken, its batch's gradients computed: the strategy's state is what the step
        will use."""

    def after_step(self, step: int, strategy) -> None:
        """After every step the strategy was asked to take (`strategy.finished`: it refused it, nothing moved)."""

    def finish(self, out, config_id: str, seed: int) -> None:
        """When the run has ended: what was measured, kept in the run directory `out` (before the run's commit)."""


class RunObserver:
    """What watches a grid's runs (module docstring); the defaults change nothing."""

    def training_data(self, data):
        """The data the runs train on (the loaded data by default)."""
        return data

    def watch(self, engine, run: tuple, phase, model):
        """A Watcher of the run (`run`: its (configuration, seed)), or None."""
        return None
