"""dpgrid: honest private hyperparameter search for DP-SGD clipping strategies."""

__version__ = "0.1.0"


class DpgridError(ValueError):
    """A problem with the user's input (config, data, results): shown as one line, exit code 2."""

    exit_code = 2


class EnvironmentFault(DpgridError):
    """A problem with the machine (full disk, read-only or blocked folder): one line, exit code 1.
    The same command, once the fault is gone, resumes where the grid stopped."""

    exit_code = 1
