"""The paper's models (appendix Tables 5-7) and a small model for the embedded digits set.

Parameter counts (paper Table 1): CNN 551,322; AutoEncoder 48,705; BagOfWords 113,156.
"""

import contextlib

import torch
from torch import nn

from dpgrid.training.rules import register_rule
from dpgrid.training.rules.linear import LinearRule


class MaxPool2x2Stride1(nn.MaxPool2d):
    """MaxPool2d(2, stride=1). Under no_grad/inference it is computed as the maximum of four shifted
    views: the same values, about twice as fast as PyTorch's CPU kernel for stride 1 (validation
    runs the full test set every 50 steps). With gradients the ordinary kernel is faster and is used."""

    def __init__(self):
        super().__init__(2, stride=1)

    def forward(self, x):
        if torch.is_grad_enabled():
            return super().forward(x)
        return torch.maximum(torch.maximum(x[..., :-1, :-1], x[..., :-1, 1:]),
                             torch.maximum(x[..., 1:, :-1], x[..., 1:, 1:]))


def cnn() -> nn.Sequential:
    """MNIST CNN, Table 5. 28 -> conv8(pad 3) 27 -> maxpool2(stride 1) 26 -> conv4 23; 32*23*23 = 16928.

    Table 5 lists a ReLU after the last layer too; the logits stay linear (docs/protocol.md §6).
    """
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=1, padding=3), nn.ReLU(),
        MaxPool2x2Stride1(),
        nn.Conv2d(16, 32, 4, stride=1), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 23 * 23, 32), nn.ReLU(),
        nn.Linear(32, 10),
    )


def autoencoder() -> nn.Sequential:
    """FashionMNIST convolutional autoencoder, Table 6: 3x3 convs 1-8-16-32-64, transposed back to 1."""
    widths = [1, 8, 16, 32, 64]
    layers = []
    for c_in, c_out in zip(widths, widths[1:]):
        layers += [nn.Conv2d(c_in, c_out, 3), nn.LeakyReLU()]
    back = widths[::-1]
    for c_in, c_out in zip(back, back[1:]):
        layers += [nn.ConvTranspose2d(c_in, c_out, 3), nn.LeakyReLU() if c_out > 1 else nn.Sigmoid()]
    return nn.Sequential(*layers)


def bag_of_words(max_words: int = 15, embedding_dim: int = 50) -> nn.Sequential:
    """AG News fully connected model over concatenated GloVe vectors, Table 7 (logits stay linear)."""
    from dpgrid import DpgridError

    for key, value in (("max_words", max_words), ("embedding_dim", embedding_dim)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DpgridError(f"model.{key} must be a whole number >= 1, got {value!r}")
    return nn.Sequential(
        nn.Linear(max_words * embedding_dim, 128), nn.LeakyReLU(),
        nn.Linear(128, 128), nn.LeakyReLU(),
        nn.Linear(128, 4),
    )


def mlp() -> nn.Sequential:
    """Digits (8x8 = 64 inputs, 10 classes): small enough for the offline quick start."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def image_mlp(hidden: int = 128) -> nn.Sequential:
    """28 x 28 images (MNIST, FashionMNIST), 10 classes: Flatten-Linear(784, hidden)-ReLU-Linear(hidden, 10), 101,770
    parameters at 128. Linear layers only, so its runs stack: a grid or a tuning study on MNIST in minutes on a
    CPU, where the paper's CNN takes hours."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))


class LogisticRegression(nn.Linear):
    """z -> z . theta with theta in R^d (no bias, as in the PUR paper), started at 0, in float64.
    `penalty()` is the objective's regulariser lambda/2 ||theta||^2: evaluations add it to the risk and the
    noisy-gradient-descent strategies add its gradient (lambda theta, the same for every example)."""

    def __init__(self, inputs: int, l2: float = 0.0):
        super().__init__(inputs, 1, bias=False, dtype=torch.float64)
        nn.init.zeros_(self.weight)
        self.l2 = float(l2)

    def penalty(self) -> torch.Tensor:
        return 0.5 * self.l2 * self.weight.pow(2).sum()


@register_rule(LogisticRegression)
class LogisticRegressionRule(LinearRule):
    """Linear's rule: LogisticRegression computes Linear's forward (it differs in its start and its penalty)."""


def logistic(inputs: int, l2: float = 0.0) -> LogisticRegression:
    import math

    from dpgrid import DpgridError

    if not isinstance(inputs, int) or isinstance(inputs, bool) or inputs < 1:
        raise DpgridError(f"model.inputs must be a whole number >= 1, got {inputs!r}")
    if not isinstance(l2, (int, float)) or isinstance(l2, bool) or not (math.isfinite(l2) and 0 <= l2 <= 3.4e38):
        raise DpgridError(f"model.l2 must be a finite number >= 0, got {l2!r}")
    return LogisticRegression(inputs, l2)


def build_model(model_cfg) -> nn.Module:
    """The model a `model` config names in `_target_`, called with the config's other keys (but dpgrid's own,
    dpgrid.specs.MODEL_KEYS: a run's start is dpgrid.models.finetuning's)."""
    from dpgrid import DpgridError
    from dpgrid.plugins import call

    from dpgrid.specs import own_keys

    model = call(own_keys(model_cfg), "model")
    if not isinstance(model, nn.Module):
        raise DpgridError(f"model: _target_ {model_cfg._target_} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def starting_model(spec, checkpoint: dict = None) -> nn.Module:
    """A run's model before training: built from the grid's model config, then started as the grid says
    (checkpoint, adapters, the part that trains: dpgrid.models.finetuning; `checkpoint`: its tensors, read once for the
    grid). Draws from torch's random state."""
    from dpgrid.models.finetuning import prepare

    return prepare(build_model(spec.model), spec.start, f"model={spec.settings['model'].get('_target_')}", checkpoint)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def default_dtype(dtype):
    """Models built inside draw their initial weights in `dtype` (None: unchanged). Drawn in float32 and
    then converted, they would differ by a float32 rounding between CPUs (the vectorised kernels differ)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or previous)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
