"""dpgrid: honest private hyperparameter search for DP-SGD clipping strategies."""

__version__ = "0.1.0"


class DpgridError(ValueError):
    """A problem with the user's input (config, data, environment): shown as one line, exit code 2."""
