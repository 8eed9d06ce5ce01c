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
