"""What a model does to its inputs before the layers that train, prepared once from the data:

- `FixedFeatures`: a fixed, public, parameter-free stage at the model's front (the scattering transform). It depends
  on no data, so its output on a dataset is computed once and kept (dpgrid.data.features) and the grid trains on it;
  the stage passes such precomputed features through unchanged, and the released model still takes raw inputs.
- `PrivateStatistics`: a module whose buffers are statistics of the private training data (a data normalisation's
  mean and variance), estimated with noise once per grid before training, every run of the grid reading the same.
  Its Gaussian mechanisms (`events`) are part of the grid's plan: every epsilon the grid states composes them.

dpgrid.models.inputs prepares both for a grid; the accounting composes the events (dpgrid.privacy.Plan.statistics).
"""

from torch import nn


class FixedFeatures(nn.Module):
    """A stage whose output depends on its settings and its input only (no parameter, no statistic of any data).
    A subclass gives `identity()` (its name and settings: with the data, the key of its cached output) and passes an
    input that already has its output's shape through unchanged."""

    version = 1  # bumped when what the stage computes changes: cached features of another version are computed again

    def identity(self) -> dict:
        raise NotImplementedError


class PrivateStatistics(nn.Module):
    """Buffers estimated from the private training data with noise, once per grid, before training.

    `events()`: the Gaussian mechanisms the estimate runs, [(sample rate, noise multiplier, count)], composed with the
    grid's runs by its accounting (a sample rate of 1: the whole training set). `estimate(train, test, noise)`: the
    buffers' values from the module's inputs on the training set (an iterable of chunks of them, `train.n` examples
    in all) and on the public test split, with `noise(shape)` drawing N(0, I) from the grid's noise source."""

    def events(self) -> list:
        raise NotImplementedError

    def estimate(self, train, test, noise) -> dict:
        raise NotImplementedError
