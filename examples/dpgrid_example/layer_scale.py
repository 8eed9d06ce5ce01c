"""A layer type of your own on dpgrid's fast engine: LayerScale (Touvron et al. 2021, CaiT), y = x * gamma with one
learned gain per feature, and its rule.

dpgrid's fast engine computes per-sample gradient norms and clipped sums layer by layer from each layer's input a and
the gradient G of the loss with respect to its output. For LayerScale a sample's gradient is

    g_i = sum_t a_it * G_it     (summed over the positions t the gain is shared across)

a vector as small as gamma: the rule keeps it per sample and answers the norms and the weighted sums from it. A type
with no rule would send the whole model to the exact but slower torch.func engine; registering the rule (below) when
this module is imported, which building the model does, keeps it on the fast one. dpgrid.testing.check_rule proves a
rule against per-sample autograd (tests/test_plugin_rule.py in dpgrid's repository).
"""

import torch
from torch import nn

from dpgrid.training.rules import LayerRule, register_rule


class LayerScale(nn.Module):
    def __init__(self, width: int, start: float = 0.1):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((width,), start))

    def forward(self, x):
        return x * self.gamma


@register_rule(LayerScale)
class LayerScaleRule(LayerRule):
    def __init__(self, module, a, g, choice, params, stacked=False):
        super().__init__(module, a, g, choice, params, stacked)
        # (b, width): each sample's gradient of gamma, a and G summed over every position between sample and feature
        self.grads = (a * g).reshape(len(a), -1, a.shape[-1]).sum(1)

    def sq_norms(self):
        return self.grads.pow(2).sum(1)

    def weighted_sum(self, w, subsets=None):
        return [w @ self.grads]  # (m, width): one sum per row of w


def layer_scale_mlp(inputs: int = 64, hidden: int = 32, classes: int = 10) -> nn.Sequential:
    """The digits MLP with a LayerScale after its hidden layer."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), LayerScale(hidden), nn.Linear(hidden, classes))
