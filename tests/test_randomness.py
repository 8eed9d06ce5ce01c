"""Secure mode's draws: exact Poisson rates, permutations and normals from the OS's generator."""

import math

import numpy as np
import pytest
import torch

from dpgrid.privacy.randomness import SecureRandom, poisson_batch, standard_normal


@pytest.mark.parametrize("q", [512 / 60000, 2.3 / 256, 0.5, 1e-5])
def test_secure_poisson_sample_has_rate_q(q):
    """2.3/256 puts 30 % of the rate in the tie-breaking bits: a sampler that got ties wrong is off by
    13 % there, against a 5-sigma band of 0.5 %."""
    n, repeats = 1_000_000, 4
    source = SecureRandom()
    count = sum(len(source.poisson_indices(n, q)) for _ in range(repeats))
    mean, std = n * repeats * q, math.sqrt(n * repeats * q * (1 - q))
    assert abs(count - mean) < 5 * std + 1


def test_secure_poisson_sample_edges_and_independence_from_torch_seeds():
    source = SecureRandom()
    assert len(source.poisson_indices(1000, 1.0)) == 1000 and len(source.poisson_indices(1000, 0.0)) == 0
    idx = source.poisson_indices(100_000, 0.01)
    assert idx.dtype == torch.int64 and bool((idx[1:] > idx[:-1]).all())
    draws = []
    for _ in range(2):
        torch.manual_seed(0)  # secure draws must not come from torch's (seedable) generator
        draws.append(poisson_batch(100_000, 0.01, SecureRandom()))
    assert not torch.equal(*draws)


def test_secure_permutation_is_a_permutation_and_unseeded():
    source = SecureRandom()
    a, b = source.permutation(5000), source.permutation(5000)
    assert sorted(a.tolist()) == list(range(5000)) and not torch.equal(a, b)


def test_secure_normal_is_standard_and_unseeded():
    source = SecureRandom()
    z = source.normal((400_000,))
    assert z.dtype == torch.float64 and abs(z.mean().item()) < 0.01 and z.std().item() == pytest.approx(1, rel=0.01)
    assert abs(float(np.mean(z.numpy() ** 4)) - 3) < 0.1  # kurtosis of a normal
    assert not torch.equal(standard_normal((10,), source, "cpu", torch.float32),
                           standard_normal((10,), source, "cpu", torch.float32))


def test_secure_bytes_come_in_blocks_and_large_draws_directly():
    source = SecureRandom()
    a, b = source.bytes(10), source.bytes(10)
    assert len(a) == len(b) == 10 and source._used == 20
    assert len(source.bytes(SecureRandom.BLOCK + 1)) == SecureRandom.BLOCK + 1 and source._used == 20


# --- the seeded sampler's rate is the accountant's q, exactly ---------------------------------------------------

def test_every_float32_uniform_but_the_tie_decides_its_coin_by_the_rate():
    """All 2^24 float32 uniforms torch.rand draws: t = floor(q 2^24) of them are in, one (the tie) goes to more bits,
    the rest are out; so P(in) = t/2^24 + P(tie in)/2^24, which is q when the tie comes in with q 2^24 - t."""
    from fractions import Fraction

    from dpgrid.privacy.randomness import FLOAT32_BITS, coins_from_uniform

    every = torch.arange(2 ** FLOAT32_BITS, dtype=torch.float64).mul_(2.0 ** -FLOAT32_BITS).float()
    assert len(torch.unique(every)) == 2 ** FLOAT32_BITS  # each uniform torch.rand can draw, once
    q = 512 / 60000
    whole = math.floor(Fraction(q) * 2 ** FLOAT32_BITS)
    coins = coins_from_uniform(every, FLOAT32_BITS, q, torch.Generator().manual_seed(0), scale=2.0 ** -FLOAT32_BITS)
    assert int(coins[:whole].sum()) == whole and not bool(coins[whole + 1:].any())
    assert int((every < q).sum()) == whole + 1  # comparing with q alone rounds the rate up: the tie always in


def test_a_tie_is_broken_with_the_rates_remaining_fraction_exactly():
    """At 4 coarse bits q = 0.3 leaves 80 % of the tie's 1/16 to the extra bits: the exact sampler meets 0.3 within
    five deviations over 10^7 coins, and the comparison with q alone, which realises 5/16, is 86 deviations off."""
    from dpgrid.privacy.randomness import coins_from_uniform

    generator = torch.Generator().manual_seed(3)
    n, q = 10_000_000, 0.3
    coarse = torch.randint(0, 16, (n,), generator=generator)
    std = math.sqrt(q * (1 - q) / n)
    exact = coins_from_uniform(coarse, 4, q, generator).double().mean().item()
    rounded = (coarse < q * 16).double().mean().item()
    assert abs(exact - q) < 5 * std
    assert abs(rounded - q) > 50 * std  # the test can tell a sampler that rounds q from one that does not


@pytest.mark.parametrize("q", [512 / 60000, 1 / 3, 2 ** -30 * 3, 0.5])
def test_ties_come_in_with_the_fraction_and_are_drawn_in_enough_bits(q):
    from fractions import Fraction

    from dpgrid.privacy.randomness import resolve_ties

    fraction = Fraction(q) * 2 ** 24 - math.floor(Fraction(q) * 2 ** 24)
    if not fraction:
        return  # q 2^24 whole: no tie to break
    n = 400_000
    share = resolve_ties(n, fraction, torch.Generator().manual_seed(1)).double().mean().item()
    assert abs(share - float(fraction)) < 5 * math.sqrt(float(fraction) * (1 - float(fraction)) / n) + 1e-9
    secure = resolve_ties(n, fraction, SecureRandom()).double().mean().item()
    assert abs(secure - float(fraction)) < 5 * math.sqrt(float(fraction) * (1 - float(fraction)) / n) + 1e-9


def test_the_seeded_stream_is_the_comparison_with_q_until_a_tie():
    """Runs drawn before the sampler was exact keep their batches: the coins equal `torch.rand < q` wherever no draw
    hit the tie (MNIST's N and q: about one tie in 270 steps)."""
    from dpgrid.privacy.randomness import seeded_coins

    q, n = 512 / 60000, 60000
    ours, before = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(50):
        u = torch.rand(n, generator=before)
        tie = bool((u == math.floor(q * 2 ** 24) * 2.0 ** -24).any())
        coins = seeded_coins(n, q, ours)
        if tie:
            break
        assert torch.equal(coins, u < q)
