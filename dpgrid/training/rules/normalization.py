"""Normalisations with an affine transform y = x_hat * gamma + beta: nn.LayerNorm, nn.RMSNorm (no beta), nn.GroupNorm
and nn.InstanceNorm1d/2d/3d (affine=True). Each normalises a sample with its own statistics, so its per-sample
gradients are the sample's own sums:

    g_gamma,i = sum_p G_ip * x_hat_ip,   g_beta,i = sum_p G_ip

over the positions p the parameters are shared across (the leading positions of a LayerNorm or RMSNorm's input, the
spatial positions of a GroupNorm or InstanceNorm's channels). x_hat is recomputed from the layer's input without
the affine transform (a LayerNorm's from the mean and 1/std its forward computed, which autograd keeps); the per-sample
gradients are as small as the parameters (b x C numbers) and kept."""

import torch
from torch import nn
from torch.nn import functional as F

from dpgrid.training.rules import LayerRule, register_rule


class AffineNormRule(LayerRule):
    channels_first = False  # parameters over dim 1 (GroupNorm, InstanceNorm) or over the last dims (LayerNorm, RMSNorm)

    def normalised(self, module, a):
        """x_hat: the layer's input normalised without its affine transform."""
        raise NotImplementedError

    def __init__(self, module, a, g, choice, params, stacked=False):
        super().__init__(module, a, g, choice, params, stacked)
        shape = module.weight.shape if module.weight is not None else module.bias.shape
        if self.channels_first:
            reduce = tuple(range(2, a.dim()))
        else:
            reduce = tuple(range(1, a.dim() - len(shape)))
        per_position = {"weight": (lambda: g * self.normalised(module, a)), "bias": (lambda: g)}
        # (b, *shape) per parameter that trains, in the module's order
        self.grads = [per_position[name]().sum(reduce) if reduce else per_position[name]() for name in params]
        self.a = self.g = None  # all that the sums need is kept: the layer's input and output gradient can go

    def sq_norms(self):
        return sum(p.flatten(1).pow(2).sum(1) for p in self.grads)

    def weighted_sum(self, w, subsets=None):
        return [torch.tensordot(w, p, dims=1) for p in self.grads]


@register_rule(nn.LayerNorm)
class LayerNormRule(AffineNormRule):
    @staticmethod
    def recorded(module, inputs, output) -> tuple:
        """The input, and the forward's mean and 1/std where autograd saved them for its backward (x_hat without a
        second normalisation, which costs as much as the rest of the rule)."""
        node = output.grad_fn
        if type(node).__name__ != "NativeLayerNormBackward0":
            return (inputs[0].detach(),)
        return inputs[0].detach(), node._saved_result1.detach(), node._saved_result2.detach()

    def __init__(self, module, a, g, choice, params, stacked=False, saved=()):
        self.statistics = tuple(saved) or None  # (mean, 1/std) as the forward computed them, when it kept them
        super().__init__(module, a, g, choice, params, stacked)

    def normalised(self, module, a):
        if self.statistics is not None:
            mean, rstd = self.statistics
            return (a - mean).mul_(rstd)
        return F.layer_norm(a, module.normalized_shape, eps=module.eps)


@register_rule(nn.RMSNorm)  # torch >= 2.4
class RMSNormRule(AffineNormRule):
    def normalised(self, module, a):
        return F.rms_norm(a, module.normalized_shape, eps=module.eps)


@register_rule(nn.GroupNorm)
class GroupNormRule(AffineNormRule):
    channels_first = True

    def normalised(self, module, a):
        return F.group_norm(a, module.num_groups, eps=module.eps)


@register_rule(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
class InstanceNormRule(AffineNormRule):
    """An instance's statistics are its own, except in evaluation mode with tracked running statistics, which then
    normalise (read here, never updated: the forward pass has updated them once)."""
    channels_first = True

    def normalised(self, module, a):
        if module.track_running_stats and not module.training:
            return F.instance_norm(a, module.running_mean, module.running_var, use_input_stats=False, eps=module.eps)
        return F.instance_norm(a, eps=module.eps)
