"""What a grid's models read of its data before training (dpgrid.models.stages), prepared once per grid:

- a `FixedFeatures` stage at the model's front: the training data become its features, computed once per dataset
  and kept (dpgrid.data.features); the model passes them through its stage unchanged;
- `PrivateStatistics` modules: their buffers estimated from the training data with noise, once per grid, from the
  grid's own noise source (seeded by names, or the operating system's with privacy.secure_rng); every run of the grid
  starts with them (`Data.statistics`), and they are released with its model. Their Gaussian mechanisms are in the
  grid's plan (`statistics_events`), composed with its runs by its accounting.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from dpgrid.models.stages import FixedFeatures, PrivateStatistics

STATISTICS_CHUNK = 4096  # training examples per pass of a statistic's estimate


def front_stage(model: nn.Module):
    """The model's FixedFeatures stage when it is the first module its forward applies (an nn.Sequential's first
    layer), else None: only then are its outputs the model's inputs from that point on."""
    if isinstance(model, nn.Sequential) and len(model) and isinstance(model[0], FixedFeatures):
        return model[0]
    return None


def statistics_modules(model: nn.Module) -> list:
    """[(position in the Sequential, name, module)] of the model's PrivateStatistics."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, PrivateStatistics)]
    if not found:
        return []
    from dpgrid import DpgridError

    if not isinstance(model, nn.Sequential) or any("." in name for name, _ in found):
        raise DpgridError(f"model: {type(found[0][1]).__name__} ({found[0][0]}) estimates statistics of the private "
                          "data; dpgrid serves such a layer as a layer of an nn.Sequential model only")
    for name, m in found:  # estimated once per grid: through layers that train, they would describe no run's model
        trained = next((n for n, _ in model[:int(name)].named_parameters()), None)
        if trained is not None:
            raise DpgridError(f"model: {type(m).__name__} (layer {name}) estimates statistics of the private data once "
                              f"per grid, but follows a layer with parameters ({trained}); serve it after fixed, "
                              "parameter-free layers only (a FixedFeatures stage)")
    return [(int(name), name, m) for name, m in found]


def statistics_events(model: nn.Module) -> list:
    """[[sample rate, noise multiplier, count], ...]: the Gaussian mechanisms the model's statistics run once per grid."""
    return [[float(q), float(nu), int(count)] for _, _, m in statistics_modules(model) for q, nu, count in m.events()]


class Chunks:
    """The inputs a layer at `position` of a Sequential receives, for x in chunks (an iterable, `n` examples)."""

    def __init__(self, model: nn.Sequential, position: int, x: torch.Tensor, size: int = STATISTICS_CHUNK):
        self.prefix, self.x, self.size, self.n = model[:position], x, size, len(x)

    def __iter__(self):
        with torch.no_grad():
            for first in range(0, self.n, self.size):
                yield self.prefix(self.x[first:first + self.size])


def prepared(spec, data, model: nn.Module, noise_source, progress: bool = False) -> tuple:
    """(the data as the grid's models read it: features for a front stage, `statistics` estimated; the lines to say).
    `model`: one of the grid's models as built (its statistics not yet estimated); `noise_source`: the statistics'
    noise, a seeded torch.Generator (the runner's, named as its runs' noise is)."""
    said = []
    stage = front_stage(model)
    if stage is not None:
        from dpgrid.data.features import with_features

        data, line = with_features(stage, data, spec.dataset.name, progress)
        said += [line] if line else []
    modules = statistics_modules(model)
    if modules:
        from dpgrid.privacy.randomness import standard_normal

        def noise(shape):
            return standard_normal(shape, noise_source, data.x_train.device, torch.float64)

        statistics = {}
        model = model.to(data.x_train.device)
        for position, name, module in modules:
            found = module.estimate(Chunks(model, position, data.x_train), Chunks(model, position, data.x_test), noise)
            statistics |= {f"{name}.{key}": value for key, value in found.items()}
            module.load_state_dict(found)  # a later module's inputs pass through this one as estimated
        from dpgrid.privacy import statistics_words

        said.append(f"statistics: {', '.join(sorted(statistics))} estimated once for the grid by "
                    f"{statistics_words(statistics_events(model))}, composed into every epsilon it states")
        data = replace(data, statistics=statistics)
    return data, said


def with_statistics(model: nn.Module, statistics: dict) -> nn.Module:
    """The model with its PrivateStatistics' buffers set to the grid's estimate (every name must be one of them)."""
    if statistics:
        state = model.state_dict()
        unknown = sorted(set(statistics) - set(state))
        if unknown:
            raise RuntimeError(f"the grid's statistics {unknown} are no buffers of this model")
        with torch.no_grad():
            for key, value in statistics.items():
                state[key].copy_(value)
    return model
