"""The number of candidates of a random-stopping selection follows its law exactly, for small, large and extreme
parameters: every law is compared with an independent computation in 40-digit arithmetic (mpmath, which torch
brings), by inversion at a stratified grid of uniforms (the count of the grid's points that land on k is
n P[K = k], to within one point) and by its mean."""

import math

import mpmath
import numpy as np
import pytest

from dpgrid.privacy.random_stopping import parameters
from dpgrid.results.draws import draw_count

from .conftest import fast_layer_runs

mpmath.mp.dps = 40
N = 2000  # grid points: each k's count is n P[K = k] within one


def law(stopping: dict):
    """(k, P[K = k]) for k = its least value, +1, ..., in 40-digit arithmetic: the first term from the law's
    definition (docs/selection.md), the next ones by the ratio P[K = k] / P[K = k - 1]."""
    rule, mean = stopping["rule"], mpmath.mpf(stopping["mean"])
    if rule == "poisson":
        k, p, ratio = 0, mpmath.exp(-mean), lambda k: mean / k
    elif rule == "binomial":
        m, q = stopping["rounds"], mean / stopping["rounds"]
        k, p, ratio = 0, (1 - q) ** m, lambda k: mpmath.mpf(m - k + 1) / k * q / (1 - q)
    elif rule == "liu_talwar":
        gamma = mpmath.mpf(stopping["gamma"])
        k, p, ratio = 1, gamma, lambda k: 1 - gamma
    else:
        eta, gamma = mpmath.mpf(stopping["eta"]), mpmath.mpf(stopping["gamma"])
        first = 1 / mpmath.log(1 / gamma) if eta == 0 else eta / (gamma ** -eta - 1)
        k, p, ratio = 1, (1 - gamma) * first, lambda k: (1 - gamma) * (k - 1 + eta) / k
    while True:
        if rule == "liu_talwar" and k == stopping["max_candidates"]:
            yield k, (1 - mpmath.mpf(stopping["gamma"])) ** (k - 1)  # the mechanism stops there
            return
        yield k, p
        k += 1
        p *= ratio(k)


CASES = {  # small, large and extreme parameters of every rule
    "poisson 3": parameters("poisson", 0, 3, 1e-5),
    "poisson 800 (exp(-mean) underflows)": parameters("poisson", 0, 800, 1e-5),
    "poisson 1e4": parameters("poisson", 0, 1e4, 1e-5),
    "binomial 3 of 7": parameters("binomial", 0, 3, 1e-5, rounds=7),
    "binomial 3 of 1e16 rounds": parameters("binomial", 0, 3, 1e-5, rounds=10 ** 16),
    "binomial 900 of 2^53 rounds": parameters("binomial", 0, 900, 1e-5, rounds=2 ** 53),
    "logarithmic 7": parameters("truncated_negative_binomial", 0, 7, 1e-5),
    "logarithmic 1e3": parameters("truncated_negative_binomial", 0, 1e3, 1e-5),
    "geometric 4": parameters("truncated_negative_binomial", 1, 4, 1e-5),
    "negative binomial eta 2.5, 50": parameters("truncated_negative_binomial", 2.5, 50, 1e-5),
    "eta -0.5, 4": parameters("truncated_negative_binomial", -0.5, 4, 1e-5),
    "eta 100, 1e3": parameters("truncated_negative_binomial", 100, 1e3, 1e-5),
    "liu_talwar 7": parameters("liu_talwar", 0, 7, 1e-5),
}


@pytest.mark.parametrize("name", fast_layer_runs(list(CASES), "poisson 800 (exp(-mean) underflows)", "binomial 900 of 2^53 rounds",
                                                 "logarithmic 7", "eta -0.5, 4", "liu_talwar 7"))  # each law once
def test_the_draws_follow_their_law(name):
    stopping = CASES[name]
    n = N if stopping["mean"] < 800 else N // 4  # a draw of a large mean walks its law's first E[K] terms
    grid = (np.arange(n) + 0.5) / n
    draws = np.array([draw_count(stopping, u) for u in grid])
    values, counts = np.unique(draws, return_counts=True)
    # the grid's points below each value's upper edge, against the law's CDF there (to within one point)
    edges, cumulative, terms = {}, mpmath.mpf(0), law(stopping)
    k = None
    for value in values:
        while k is None or k < value:
            k, p = next(terms)
            cumulative += p
        edges[value] = float(cumulative)
    below = np.cumsum(counts)
    for value, n_below in zip(values, below):
        assert abs(n_below - edges[value] * n) <= 1, (name, value, n_below, edges[value] * n)
    assert np.mean(draws) == pytest.approx(stopping["mean"], rel=0.05 if stopping["mean"] < 1e3 else 0.2)


def test_the_draw_has_no_floor_of_zero_or_of_rounding():
    """The failures this replaced: binomial rounds of 1e16 drew 224 for a mean of 3; a mean above ~745 drew 0."""
    rounds = parameters("binomial", 0, 3, 1e-5, rounds=10 ** 16)
    assert [draw_count(rounds, u) for u in (0.001, 0.5, 0.999)] == [0, 3, 10]  # Poisson(3)'s quantiles
    for rule in ("poisson", "binomial"):
        stopping = parameters(rule, 0, 800, 1e-5, rounds=10 ** 9)
        assert 700 < draw_count(stopping, 0.5) < 900


def test_the_largest_admissible_mean_draws_its_quantiles():
    """E[K] = 10^6, the bound of privacy.stopping_mean: the draw is the law's quantile, as scipy's Poisson
    quantile function (an independent implementation, by the incomplete gamma function) gives it."""
    from scipy.stats import poisson

    stopping = parameters("poisson", 0, 1e6, 1e-5)
    for u in (0.001, 0.3, 0.5, 0.97):
        assert draw_count(stopping, u) == int(poisson.ppf(u, 1e6))


def test_the_largest_uniform_still_draws_a_finite_count():
    largest = 1 - 2 ** -53
    for stopping in CASES.values():
        assert math.isfinite(draw_count(stopping, largest)) and draw_count(stopping, 0.0) >= 0
