"""The 2-D scattering transform (Bruna & Mallat 2013; Oyallon & Mallat 2015) as a fixed, parameter-free feature stage:
the handcrafted features of Tramèr & Boneh (ICLR 2021), who use kymatio's `Scattering2D(J=2, shape=(H, W), L=8)`.

With Morlet wavelets psi_{j, theta} (scales j < J, L angles) and the Gaussian low-pass phi_J, for an image x

    S0 x = x * phi_J,     S1 x = |x * psi_{j1, t1}| * phi_J,     S2 x = ||x * psi_{j1, t1}| * psi_{j2, t2}| * phi_J  (j1 < j2),

each subsampled by 2^J: 1 + J L + L^2 J (J - 1) / 2 channels (81 at J = 2, L = 8) of (H / 2^J) x (W / 2^J) per image
channel, in kymatio's order (S0; S1 by (j1, t1); S2 by (j1, t1) then (j2, t2)) and layout: channel c's coefficients are
channels 81 c ... 81 c + 80 of the output. Convolutions are products in Fourier on the image reflection-padded to a
multiple of 2^J (kymatio's `compute_padding`), subsampling is periodisation in Fourier, and the filter bank is kymatio's
(`kymatio.scattering2d.filter_bank`, the same in 0.2.0, which the paper used, and 0.3.0), rebuilt here in NumPy: what
this module computes equals kymatio's output to float32 rounding (tests/test_scatternet.py compares them where kymatio is
installed). It does not import kymatio: kymatio 0.3.0's `import kymatio.torch` fails with SciPy >= 1.15 (its 3-D module
imports scipy.special.sph_harm, which SciPy removed). A batch applies all L filters of a scale at once (kymatio loops
over them), and it is as fast as kymatio on a 2-core CPU (scripts/bench.py --scattering, benchmarks/scattering_cpu.json).

The features depend on no data: the stage is public (a dpgrid.models.stages.FixedFeatures), and a dataset's features are
computed once and kept (dpgrid.data.features).
"""

import numpy as np
import torch
from torch import nn

from dpgrid.models.stages import FixedFeatures


# --- kymatio's filter bank (kymatio/scattering2d/filter_bank.py), in Fourier --------------------------------------

def gabor_2d(M: int, N: int, sigma: float, theta: float, xi: float, slant: float = 1.0) -> np.ndarray:
    """g_sigma(u) e^{i xi (cos theta, sin theta) . u} on an M x N grid, periodised over 5 x 5 tiles; normalised by
    2 * 3.1415 * sigma^2 / slant (kymatio's constant, 3.1415, not pi)."""
    R = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    curv = R @ np.diag([1.0, slant * slant]) @ R.T / (2 * sigma * sigma)
    gab = np.zeros((M, N), np.complex128)
    for ex in range(-2, 3):
        for ey in range(-2, 3):
            xx, yy = np.mgrid[ex * M:M + ex * M, ey * N:N + ey * N]
            arg = -(curv[0, 0] * xx * xx + (curv[0, 1] + curv[1, 0]) * xx * yy + curv[1, 1] * yy * yy) \
                + 1j * (xx * xi * np.cos(theta) + yy * xi * np.sin(theta))
            gab += np.exp(arg)
    return gab / (2 * 3.1415 * sigma * sigma / slant)


def morlet_2d(M: int, N: int, sigma: float, theta: float, xi: float, slant: float) -> np.ndarray:
    """A Gabor wavelet minus its envelope scaled so that the sum has zero mean: psi = g (e^{i xi.u} - beta)."""
    wave, envelope = gabor_2d(M, N, sigma, theta, xi, slant), gabor_2d(M, N, sigma, theta, 0.0, slant)
    return wave - wave.sum() / envelope.sum() * envelope


def periodize(x: np.ndarray, res: int) -> np.ndarray:
    """A filter in Fourier for a signal subsampled by 2^res: the frequencies above the new Nyquist band zeroed, then
    the 2^res x 2^res aliases summed."""
    M, N = x.shape
    k = 2 ** res
    x = x.copy()
    x[int(M * 2 ** (-res - 1)):int(M * 2 ** (-res - 1)) + int(M * (1 - 2 ** -res)), :] = 0
    x[:, int(N * 2 ** (-res - 1)):int(N * 2 ** (-res - 1)) + int(N * (1 - 2 ** -res))] = 0
    return x.reshape(k, M // k, k, N // k).sum(axis=(0, 2))


def filter_bank(M: int, N: int, J: int, L: int) -> tuple:
    """(phi, psi) in Fourier on the padded M x N grid: phi[res] for res < J; psi[(j, theta)][res] for the resolutions
    kymatio keeps, res < min(j + 1, max(J - 1, 1)). Real arrays (the filters' transforms are real)."""
    phi_hat = np.real(np.fft.fft2(gabor_2d(M, N, 0.8 * 2 ** (J - 1), 0.0, 0.0)))
    phi = [periodize(phi_hat, res) for res in range(J)]
    psi = {}
    for j in range(J):
        for theta in range(L):
            wavelet = morlet_2d(M, N, 0.8 * 2 ** j, (int(L - L / 2 - 1) - theta) * np.pi / L, 3.0 / 4.0 * np.pi / 2 ** j,
                                4.0 / L)
            hat = np.real(np.fft.fft2(wavelet))
            psi[j, theta] = [periodize(hat, res) for res in range(min(j + 1, max(J - 1, 1)))]
    return phi, psi


def padded_size(size: int, J: int) -> int:
    """kymatio's compute_padding: the next multiple of 2^J with at least 2^(J-1) pixels on each side."""
    return ((size + 2 ** J) // 2 ** J + 1) * 2 ** J


def subsample(x: torch.Tensor, k: int) -> torch.Tensor:
    """The Fourier transform of the signal subsampled by k in space: the k x k periodisation, averaged."""
    if k == 1:
        return x
    *lead, M, N = x.shape
    return x.reshape(*lead, k, M // k, k, N // k).mean(-2).mean(-3)  # one dimension at a time: 2-3x faster in complex


class Scattering2d(FixedFeatures):
    """S_J x of images (..., C, H, W) -> (..., 81 C, H / 2^J, W / 2^J) at J = 2, L = 8 (kymatio's Scattering2D, its
    channels of each input channel together). An input that already has the output's shape is returned as it is:
    the precomputed features dpgrid trains on. Filters are buffers that are not saved with the model (they follow from
    J, L and the shape)."""

    def __init__(self, J: int = 2, L: int = 8, shape=(28, 28)):
        super().__init__()
        H, W = (int(s) for s in shape)
        if J < 1 or L < 1 or 2 ** J > min(H, W) or H % 2 ** J or W % 2 ** J:
            raise ValueError(f"Scattering2d: needs J >= 1, L >= 1 and an image whose sides are multiples of 2^J and at "
                             f"least 2^J, got J={J}, L={L}, shape {(H, W)}")
        self.J, self.L, self.shape = int(J), int(L), (H, W)
        self.side = (H // 2 ** self.J, W // 2 ** self.J)
        M, N = padded_size(H, J), padded_size(W, J)
        self.pads = ((M - H) // 2, (M - H + 1) // 2, (N - W) // 2, (N - W + 1) // 2)
        phi, psi = filter_bank(M, N, self.J, self.L)
        as_tensor = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
        for res, f in enumerate(phi):
            self.register_buffer(f"phi{res}", as_tensor(f), persistent=False)
        for j in range(self.J):
            # psi_j at each resolution it is used at: (L, M / 2^res, N / 2^res)
            for res in range(len(psi[j, 0])):
                self.register_buffer(f"psi{j}_{res}", as_tensor([psi[j, t][res] for t in range(self.L)]),
                                     persistent=False)

    @property
    def channels(self) -> int:
        J, L = self.J, self.L
        return 1 + J * L + L * L * J * (J - 1) // 2

    def identity(self) -> dict:
        return {"stage": "scattering2d", "J": self.J, "L": self.L, "shape": list(self.shape), "version": self.version}

    def output_shape(self, image_channels: int = 1) -> tuple:
        return (self.channels * image_channels, *self.side)

    def extra_repr(self) -> str:
        return f"J={self.J}, L={self.L}, shape={self.shape}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) == self.side:  # features already (the side of images is 2^J times larger)
            return x
        if x.dim() < 3 or tuple(x.shape[-2:]) != self.shape:
            raise ValueError(f"Scattering2d: images (..., C, {self.shape[0]}, {self.shape[1]}) or their features "
                             f"(..., {self.channels} C, {self.side[0]}, {self.side[1]}) expected, got shape {tuple(x.shape)}")
        S = self.transform(x.reshape(-1, *self.shape))  # (n * C, channels, h, w)
        return S.reshape(*x.shape[:-3], x.shape[-3] * self.channels, *self.side)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """(n, H, W) real -> (n, channels, H / 2^J, W / 2^J): the L filters of a scale applied at once."""
        J, L = self.J, self.L
        real = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        x = nn.functional.pad(x.to(real).unsqueeze(1), (self.pads[2], self.pads[3], self.pads[0], self.pads[1]),
                              mode="reflect").squeeze(1)
        X = torch.fft.fft2(x)  # (n, M, N)
        phi = [getattr(self, f"phi{res}").to(real) for res in range(J)]

        def low_pass(U_hat, res):  # |.| * phi_J, subsampled to the output grid, its border (1 pixel) cut
            S = torch.fft.ifft2(subsample(U_hat * phi[res], 2 ** (J - res))).real
            return S[..., 1:-1, 1:-1]

        out = [low_pass(X, 0).unsqueeze(1)]  # S0: (n, 1, h, w)
        first = {}  # j1 -> FFT of |x * psi_{j1, .}| at resolution 2^-j1: (n, L, M / 2^j1, N / 2^j1)
        for j1 in range(J):
            U = torch.fft.ifft2(subsample(X.unsqueeze(1) * getattr(self, f"psi{j1}_0").to(real), 2 ** j1)).abs()
            first[j1] = torch.fft.fft2(U)
            out.append(low_pass(first[j1], j1))  # S1 for (j1, theta1), theta1 = 0..L-1
        for j1 in range(J - 1):  # S2 for (j1, theta1), then (j2, theta2) with j2 > j1: kymatio's order
            psi = {j2: getattr(self, f"psi{j2}_{j1}").to(real) for j2 in range(j1 + 1, J)}  # at resolution 2^-j1
            for theta1 in range(L):  # one theta1 at a time: L times less memory than all at once, and faster on a CPU
                paths = []
                for j2 in range(j1 + 1, J):  # (n, L, h, w): theta2
                    U = torch.fft.ifft2(subsample(first[j1][:, theta1].unsqueeze(1) * psi[j2], 2 ** (j2 - j1))).abs()
                    paths.append(low_pass(torch.fft.fft2(U), j2))
                out.append(torch.cat(paths, dim=1))
        return torch.cat(out, dim=1)
