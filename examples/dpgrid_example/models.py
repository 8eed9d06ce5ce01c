"""A CNN for 28x28 images with GroupNorm, which (unlike BatchNorm) normalises each sample on its own,
so per-sample gradients stay per-sample (dpgrid's fast engine has a rule for it), and a small MLP for tabular data."""

from torch import nn


def groupnorm_cnn(channels: int = 16, groups: int = 4, classes: int = 10) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, channels, 5, stride=2), nn.GroupNorm(groups, channels), nn.ReLU(),   # 28 -> 12
        nn.Conv2d(channels, channels, 3, stride=2), nn.GroupNorm(groups, channels), nn.ReLU(),  # 12 -> 5
        nn.Flatten(), nn.Linear(channels * 5 * 5, classes),
    )


def tabular_mlp(inputs: int = 30, hidden: int = 16, classes: int = 2) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))
