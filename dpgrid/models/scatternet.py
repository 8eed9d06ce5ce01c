"""Tramèr & Boneh, "Differentially Private Learning Needs Better Features (or Much More Data)" (ICLR 2021): models on
handcrafted ScatterNet features, and their end-to-end CNN baseline (Papernot et al.'s tanh CNNs).

Every model takes images (C, H, W) in the dataset's own scale. The ScatterNet models start with the scattering
transform (dpgrid.models.scattering, J = 2, L = 8: K = 81 C channels of (H / 4) x (W / 4)), then normalise its
channels, then train a head:

- `scatternet_linear`: a linear classifier on the K (H/4) (W/4) features (39,700 parameters on MNIST);
- `scatternet_cnn`: a small tanh CNN on the K channels (33,066 parameters on MNIST; the authors' CIFAR-10 form on
  colour images);
- `tanh_cnn`: the end-to-end CNN of raw pixels (26,010 parameters on MNIST; the authors' CIFAR-10 CNN on colour
  images).

The normalisation (`norm`), as the authors choose per dataset:

- `group`: GroupNorm over `groups` groups of channels without an affine part: each sample normalised by its own
  statistics, no statistic of the data set, no privacy cost;
- `data`: each channel standardised by a mean and variance of the training set (the authors' frozen "BN"), estimated
  privately once per grid (`DataNormalization`): two Gaussian mechanisms on the whole data, composed with the grid's
  runs by its accounting, as the authors compose them (their `rdp_norm`);
- `none`.

Architectures as in the authors' code (github.com/ftramer/Handcrafted-DP, models.py), written anew.
"""

import math

import torch
from torch import nn

from dpgrid.models import MaxPool2x2Stride1
from dpgrid.models.scattering import Scattering2d
from dpgrid.models.stages import PrivateStatistics

NORMS = ("group", "data", "none")


class DataNormalization(PrivateStatistics):
    """x -> (x - mu_c) / sqrt(var_c + 1e-5) for each channel c, 0 where var_c = 0 (the authors' frozen "BN").

    mu and var are estimated once per grid from the training set's inputs to this layer, x_i (K channels x P positions),
    by two Gaussian mechanisms on the whole data (sample rate 1):

        m_i = mean_p x_{i,c,p},   s_i = mean_p x_{i,c,p}^2                      (each in R^K)
        mu  = (sum_i clip(m_i, C_m) + N(0, (nu C_m)^2 I_K)) / N,   E[x^2] = (sum_i clip(s_i, C_s) + N(0, (nu C_s)^2 I_K)) / N
        var = max(E[x^2] - mu^2, 0),      clip(v, C) = v min(1, C / ||v||)

    each sum of sensitivity C under adding or removing one example, so each is the Gaussian mechanism of multiplier nu
    (the authors' `2 * get_renyi_divergence(1, bn_noise_multiplier)`), and N is the public size of the training set.
    The authors set C_m, C_s to the medians of ||m_i||, ||s_i|| over the private training set ("technically a small
    privacy leak", their code says); `clip` here is two numbers, or `test`: those medians over the public test split."""

    def __init__(self, channels: int, noise_multiplier: float = 8.0, clip="test"):
        super().__init__()
        self.channels, self.noise_multiplier = int(channels), float(noise_multiplier)
        self.clip = clip if clip == "test" else tuple(float(c) for c in clip)
        self.register_buffer("mean", torch.zeros(self.channels))
        self.register_buffer("var", torch.ones(self.channels))

    def extra_repr(self) -> str:
        return f"{self.channels}, noise_multiplier={self.noise_multiplier:g}, clip={self.clip}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (-1,) + (1,) * (x.dim() - 2)
        scale = torch.where(self.var != 0, torch.rsqrt(self.var + 1e-5), torch.zeros_like(self.var))
        return torch.addcmul((-self.mean * scale).view(shape), x, scale.view(shape))  # one pass over x

    def events(self) -> list:
        return [(1.0, self.noise_multiplier, 2)]

    @staticmethod
    def moments(x: torch.Tensor) -> tuple:
        """Each sample's mean and mean square over positions, per channel: (b, K) each, in float64 (averaged in the
        inputs' precision: 49 positions)."""
        x = x.flatten(2)
        return x.mean(2).double(), x.pow(2).mean(2).double()

    def estimate(self, train, test, noise) -> dict:
        if self.clip == "test":
            m, s = self.moments(torch.cat([t for t in test]))
            clip_m, clip_s = float(m.norm(dim=1).median()), float(s.norm(dim=1).median())
        else:
            clip_m, clip_s = self.clip
        sum_m = sum_s = 0.0
        for x in train:
            m, s = self.moments(x)
            sum_m = sum_m + (m * (clip_m / m.norm(dim=1, keepdim=True).clamp_min(1e-300)).clamp(max=1.0)).sum(0)
            sum_s = sum_s + (s * (clip_s / s.norm(dim=1, keepdim=True).clamp_min(1e-300)).clamp(max=1.0)).sum(0)
        n = train.n
        mean = (sum_m + self.noise_multiplier * clip_m * noise((self.channels,))) / n
        square = (sum_s + self.noise_multiplier * clip_s * noise((self.channels,))) / n
        var = (square - mean.pow(2)).clamp_min(0.0)
        return {"mean": mean.to(self.mean.dtype), "var": var.to(self.var.dtype)}


def normalization(norm: str, channels: int, groups: int, norm_noise: float, norm_clip) -> nn.Module:
    from dpgrid import DpgridError

    if norm not in NORMS:
        raise DpgridError(f"model.norm must be one of {', '.join(NORMS)}, got {norm!r}")
    if norm == "group":
        if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or channels % groups:
            raise DpgridError(f"model.groups must be a whole number that divides the {channels} scattering channels, "
                              f"got {groups!r}")
        return nn.GroupNorm(groups, channels, affine=False)
    if norm == "data":
        if not isinstance(norm_noise, (int, float)) or isinstance(norm_noise, bool) or not (
                math.isfinite(norm_noise) and 0.1 <= norm_noise <= 1e4):
            raise DpgridError(f"model.norm_noise must be a number in [0.1, 1e4] (the statistics' noise multiplier), "
                              f"got {norm_noise!r}")
        if norm_clip != "test" and not (isinstance(norm_clip, (list, tuple)) and len(norm_clip) == 2 and all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0
                for c in norm_clip)):
            raise DpgridError(f"model.norm_clip must be `test` (the medians on the public test split) or two positive "
                              f"numbers [C_mean, C_square], got {norm_clip!r}")
        return DataNormalization(channels, float(norm_noise), norm_clip)
    return nn.Identity()


def image_of(image) -> tuple:
    from dpgrid import DpgridError

    if not (isinstance(image, (list, tuple)) and len(image) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in image)):
        raise DpgridError(f"model.image must be [channels, height, width], got {image!r}")
    return tuple(image)


MAX_ANGLES = 32  # the second order holds L^2 paths per image channel


def scattering_stage(image, J: int, L: int) -> tuple:
    """(the stage, K channels, (h, w)) for images [C, H, W]."""
    from dpgrid import DpgridError

    C, H, W = image_of(image)
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    scales = [j for j in range(1, 12) if H % 2 ** j == 0 and W % 2 ** j == 0 and 2 ** j <= min(H, W)]
    if not (whole(J) and J in scales):
        raise DpgridError(f"model.J must be a whole number whose 2^J divides both sides of the {H} x {W} images: "
                          f"{', '.join(map(str, scales)) or 'none'}; got {J!r}")
    if not (whole(L) and 1 <= L <= MAX_ANGLES):
        raise DpgridError(f"model.L must be a whole number of angles in 1..{MAX_ANGLES}, got {L!r}")
    stage = Scattering2d(J, L, (H, W))
    return stage, stage.channels * C, stage.side


def scatternet_linear(image=(1, 28, 28), J: int = 2, L: int = 8, norm: str = "group", groups: int = 27,
                      norm_noise: float = 8.0, norm_clip="test", classes: int = 10) -> nn.Sequential:
    """Scattering -> normalisation -> Linear(K h w, classes): 3969 x 10 + 10 = 39,700 parameters on 28 x 28 images."""
    stage, K, (h, w) = scattering_stage(image, J, L)
    return nn.Sequential(stage, normalization(norm, K, groups, norm_noise, norm_clip), nn.Flatten(),
                         nn.Linear(K * h * w, int(classes)))


def scatternet_cnn(image=(1, 28, 28), J: int = 2, L: int = 8, norm: str = "group", groups: int = 27,
                   norm_noise: float = 8.0, norm_clip="test", classes: int = 10) -> nn.Sequential:
    """Scattering -> normalisation -> a tanh CNN. Grey images (81 x 7 x 7 on MNIST): conv 3x3 stride 2 (16) -> conv 3x3
    (32) -> Linear(32 x 4 x 4, 32) -> Linear(32, classes), 33,066 parameters. Colour images (243 x 8 x 8 on CIFAR-10):
    conv 3x3 (64) -> max-pool 2 -> conv 3x3 (64) -> Linear(64 x 4 x 4, classes)."""
    stage, K, (h, w) = scattering_stage(image, J, L)
    norm_layer = normalization(norm, K, groups, norm_noise, norm_clip)
    if image[0] == 1:
        side = (h + 1) // 2  # the stride-2 convolution (padding 1)
        body = [nn.Conv2d(K, 16, 3, stride=2, padding=1), nn.Tanh(), nn.Conv2d(16, 32, 3, padding=1), nn.Tanh(),
                nn.Flatten(), nn.Linear(32 * side * side, 32), nn.Tanh(), nn.Linear(32, int(classes))]
    else:
        body = [nn.Conv2d(K, 64, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2, 2), nn.Conv2d(64, 64, 3, padding=1), nn.Tanh(),
                nn.Flatten(), nn.Linear(64 * (h // 2) * (w // 2), int(classes))]
    return nn.Sequential(stage, norm_layer, *body)


def tanh_cnn(image=(1, 28, 28), classes: int = 10) -> nn.Sequential:
    """The end-to-end CNN of raw pixels (Papernot et al. 2020's tanh networks, as the authors train them). Grey 28 x 28:
    conv 8x8 stride 2 (16) -> max-pool 2 stride 1 -> conv 4x4 stride 2 (32) -> max-pool 2 stride 1 -> Linear(512, 32) ->
    Linear(32, classes), 26,010 parameters. Colour 32 x 32: conv 3x3 32, 32 -> pool -> 64, 64 -> pool -> 128, 128 ->
    pool -> Linear(2048, 128) -> Linear(128, classes)."""
    C, H, W = image_of(image)
    if C == 1:
        from dpgrid import DpgridError

        if (H, W) != (28, 28):
            raise DpgridError(f"model=tanh_cnn's grey form is for 28 x 28 images, got model.image={list(image)}")
        return nn.Sequential(nn.Conv2d(1, 16, 8, stride=2, padding=2), nn.Tanh(), MaxPool2x2Stride1(),
                             nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), MaxPool2x2Stride1(), nn.Flatten(),
                             nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, int(classes)))
    layers, c = [], C
    for width in (32, 64, 128):
        layers += [nn.Conv2d(c, width, 3, padding=1), nn.Tanh(), nn.Conv2d(width, width, 3, padding=1), nn.Tanh(),
                   nn.MaxPool2d(2, 2)]
        c = width
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * (H // 8) * (W // 8), 128), nn.Tanh(),
                         nn.Linear(128, int(classes)))
