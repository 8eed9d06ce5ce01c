"""A run's private randomness: seeded (reproducible, for research) or secure (for real data).

Seeded mode draws Poisson masks and noise from torch.Generators seeded from public names: anyone who
knows the names can regenerate every batch and every noise vector, so its epsilon holds only against
an adversary who does not know them. `privacy.secure_rng=true` draws ALL of it (masks, permutations,
noise) from the operating system's cryptographically secure generator instead, as Opacus's secure mode
does: `SecureRandom` below, which never touches torch's Mersenne Twister.
"""

from __future__ import annotations

import hashlib
import math
import os
from fractions import Fraction

import numpy as np

from dpgrid.lazy import lazy_import

torch = lazy_import("torch")


class SecureRandom:
    """Draws from os.urandom, fetched in blocks (one system call serves many small draws)."""

    BLOCK = 1 << 20

    def __init__(self):
        self._buffer, self._used = b"", 0

    def bytes(self, count: int) -> np.ndarray:
        if count > self.BLOCK:
            return np.frombuffer(os.urandom(count), dtype=np.uint8)
        if self._used + count > len(self._buffer):
            self._buffer, self._used = os.urandom(self.BLOCK), 0
        out = np.frombuffer(self._buffer, dtype=np.uint8, count=count, offset=self._used)
        self._used += count
        return out

    def uint64(self, count: int) -> np.ndarray:
        return self.bytes(8 * count).view(np.uint64)

    def poisson_indices(self, n: int, sample_rate: float) -> torch.Tensor:
        """Indices of a Poisson sample, each of n examples independently with probability q, exactly.

        Example i is in iff U_i < q for a uniform U_i, decided on U_i's binary expansion: its first
        byte against floor(256 q), and only on a tie (probability 1/256) its next 64 bits against the
        rest of q. The realised rate is q rounded down to a multiple of 2^-72, which is q itself for
        q >= 2^-20 and never above it (the subsampled Gaussian's privacy only improves as q falls).
        One byte per example: 60 kB a step for MNIST."""
        scaled = sample_rate * 256.0  # exact: a power of two
        whole = int(math.floor(scaled))
        rest = int((scaled - whole) * 2.0 ** 64)  # floor of the remaining fraction, on 64 bits
        first = self.bytes(n)
        chosen = first < whole
        ties = np.flatnonzero(first == whole)
        if len(ties):
            chosen[ties[self.uint64(len(ties)) < np.uint64(rest)]] = True
        return torch.from_numpy(np.flatnonzero(chosen))

    def permutation(self, n: int) -> torch.Tensor:
        """A uniformly random permutation: the order of n random 64-bit keys."""
        return torch.from_numpy(np.argsort(self.uint64(n), kind="stable"))

    def normal(self, shape) -> torch.Tensor:
        """Standard normals, Box-Muller in float64 on 53 random bits per uniform (torch's vectorised
        log/cos/sin: 5x faster than numpy's for a 113k-parameter model)."""
        count = math.prod(shape)
        half = (count + 1) // 2
        u = torch.from_numpy((self.uint64(2 * half) >> np.uint64(11)).astype(np.float64))
        u.add_(1.0).mul_(2.0 ** -53)  # uniform on (0, 1]
        radius = u[:half].log().mul_(-2.0).sqrt_()
        angle = u[half:].mul_(2.0 * math.pi)
        return torch.cat([radius * angle.cos(), radius * angle.sin()])[:count].reshape(shape)


def poisson_batch(n: int, sample_rate: float, source) -> torch.Tensor:
    """Indices of a Poisson sample (on the CPU, so that sampling is identical on every device and
    never synchronises a GPU) from a seeded torch.Generator or a SecureRandom; each example is in with probability
    exactly `sample_rate`, the rate the accountant is given."""
    if isinstance(source, SecureRandom):
        return source.poisson_indices(n, sample_rate)
    return torch.nonzero(seeded_coins(n, sample_rate, source)).squeeze(1)


FLOAT32_BITS = 24  # torch.rand's float32 uniforms are the multiples of 2^-24 in [0, 1)


def seeded_coins(n: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """n independent coins, each True with probability exactly `rate`, from a seeded generator.

    A float32 uniform U = k 2^-24 decides the coin on k's side of rate 2^24 = t + f (t whole, 0 <= f < 1): k < t is in,
    k > t out; only the tie k = t (probability 2^-24) is decided by more bits (`resolve_ties`), so
    P(in) = t 2^-24 + 2^-24 f = rate exactly. (U < rate alone would realise ceil(rate 2^24) 2^-24, rate + 2.5e-8 at
    MNIST's rate.) A tie draws from the same generator, so runs drawn before and after this exactness differ only
    from a step with a tie on."""
    u = torch.rand(n, generator=generator)
    if n and not bool((u * 2.0 ** FLOAT32_BITS).frac().eq(0).all()):  # the exactness rests on it: checked, not assumed
        raise RuntimeError("torch.rand's float32 uniforms are not multiples of 2^-24 in this torch build, which the "
                           "seeded Poisson sampler's exact rate rests on; please report it")
    return coins_from_uniform(u, FLOAT32_BITS, rate, generator, scale=2.0 ** -FLOAT32_BITS)


def coins_from_uniform(k: torch.Tensor, bits: int, rate: float, generator, scale: float = 1.0) -> torch.Tensor:
    """Coins with probability exactly `rate` from `k`, uniform on {0, ..., 2^bits - 1} times `scale` (a power of two:
    the uniforms as drawn, compared without rounding), ties broken by `resolve_ties`."""
    if rate >= 1.0:
        return torch.ones(k.shape, dtype=torch.bool)
    if rate <= 0.0:
        return torch.zeros(k.shape, dtype=torch.bool)
    scaled = Fraction(rate) * 2 ** bits  # exact: a float is a dyadic rational
    whole = math.floor(scaled)
    edge = torch.tensor(whole * scale, dtype=k.dtype)  # exact: a whole number below 2^bits, times a power of two
    chosen = k < edge
    rest = scaled - whole
    if rest:
        ties = torch.nonzero(k == edge).squeeze(1)
        if len(ties):
            chosen[ties] = resolve_ties(len(ties), rest, generator)
    return chosen


CHUNK_BITS = 62  # torch.randint(0, 2^62) is exactly uniform: 2^64 is a multiple of its range


def resolve_ties(count: int, fraction: Fraction, generator) -> torch.Tensor:
    """`count` coins each True with probability exactly `fraction` (a dyadic rational in (0, 1), a/2^m): an m-bit
    uniform integer r, drawn in 62-bit chunks from a seeded generator or a SecureRandom, is below a."""
    m = fraction.denominator.bit_length() - 1  # the denominator is 2^m: a float's fraction is dyadic
    chunks = -(-m // CHUNK_BITS)
    if isinstance(generator, SecureRandom):
        draws = (generator.uint64(count * chunks) >> np.uint64(64 - CHUNK_BITS)).reshape(count, chunks).tolist()
    else:
        draws = torch.randint(0, 2 ** CHUNK_BITS, (count, chunks), generator=generator, dtype=torch.int64).tolist()
    threshold = fraction.numerator << (chunks * CHUNK_BITS - m)
    return torch.tensor([sum(int(d) << (CHUNK_BITS * (chunks - 1 - i)) for i, d in enumerate(row)) < threshold
                         for row in draws], dtype=torch.bool)


def permutation(n: int, source) -> torch.Tensor:
    if isinstance(source, SecureRandom):
        return source.permutation(n)
    return torch.randperm(n, generator=source)


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """A CPU tensor on `device`: on CUDA one pinned, non-blocking copy, so that the host does not wait for the GPU's
    queue (batches, masks and secure noise are drawn on the CPU every step)."""
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def standard_normal(shape, source, device, dtype, out=None) -> torch.Tensor:
    """N(0, I) from a seeded torch.Generator or a SecureRandom; written into `out` (contiguous) when given."""
    if isinstance(source, torch.Generator):
        if out is not None:
            return torch.randn(shape, generator=source, out=out)
        return torch.randn(shape, generator=source, device=device, dtype=dtype)
    z = to_device(source.normal(shape).to(dtype), device)  # drawn on the CPU from the OS's bytes, rounded once
    return z if out is None else out.copy_(z, non_blocking=True)


def derive_seed(*parts) -> int:
    """A 63-bit seed from names only, so a run's randomness never depends on run order or job split."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2 ** 63 - 1)
