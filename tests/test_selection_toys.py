"""The random-stopping theorems dpgrid accounts selections by, attacked on toys whose selection can be computed
exactly: a candidate is a draw from a finite, ordered set of outcomes (its configuration and score; higher is
better) with distribution p on a dataset and q on a neighbouring one, and the selection releases the best of K
draws (nothing when K = 0). With G the probability generating function of K, the best of K draws is at most y
with probability G(F(y)), so the released outcome's distribution is exact:
    P[out = y] = G(F(y)) - G(F(y - 1)),   P[out = nothing] = G(0).
Its Renyi divergence, both ways, must stay below dpgrid's bound (privacy.random_stopping.selection_rdp) computed
from the candidate's exact Renyi divergences, at every order, for every toy: random ones and ones searched for the
largest exact / bound ratio."""

import math

import numpy as np
import pytest

from dpgrid.privacy.random_stopping import ORDERS, parameters, selection_rdp

EXACT_ORDERS = np.array([a for a in ORDERS if a <= 64])  # the orders at which the exact divergence is compared


def pgf(stopping: dict):
    """s -> E[s^K] of the stopping rule (Papernot & Steinke 2022, Definition 1 and Section 3.3)."""
    if stopping["rule"] == "poisson":
        return lambda s: np.exp(stopping["mu"] * (s - 1))
    eta, gamma = stopping["eta"], stopping["gamma"]
    if eta == 0:
        return lambda s: np.log1p(-(1 - gamma) * s) / math.log(gamma)
    return lambda s: ((1 - (1 - gamma) * s) ** -eta - 1) / (gamma ** -eta - 1)


def released(p: np.ndarray, stopping: dict) -> np.ndarray:
    """The selection's output distribution: nothing (K = 0), then each outcome as the best of K draws."""
    g, cdf = pgf(stopping), np.concatenate([[0.0], np.cumsum(p)])
    cdf[-1] = 1.0
    values = g(cdf)
    return np.concatenate([[values[0]], np.diff(values)])


def renyi(p: np.ndarray, q: np.ndarray, orders) -> np.ndarray:
    """D_lambda(p || q) exactly, in logs (outcomes impossible under both are dropped)."""
    keep = (p > 0) | (q > 0)
    p, q = p[keep], q[keep]
    if np.any((p > 0) & (q == 0)):
        return np.full(len(orders), np.inf)
    with np.errstate(divide="ignore"):
        lp, lq = np.log(p), np.log(q)
    a = np.asarray(orders, dtype=float)[:, None]
    terms = np.where(p > 0, a * lp + (1 - a) * lq, -np.inf)  # (orders, outcomes)
    top = terms.max(axis=1, keepdims=True)
    out = (top[:, 0] + np.log(np.exp(terms - top).sum(axis=1))) / (a[:, 0] - 1)
    return np.maximum(out, 0.0)


def both_ways(p, q, orders):
    return np.maximum(renyi(p, q, orders), renyi(q, p, orders))


def worst_ratio(p, q, stopping) -> float:
    """max over orders of (the selection's exact divergence) / (dpgrid's bound): above 1 is a broken theorem."""
    candidate = both_ways(p, q, ORDERS)
    bound = selection_rdp(ORDERS, candidate, stopping)[: len(EXACT_ORDERS)]
    exact = both_ways(released(p, stopping), released(q, stopping), EXACT_ORDERS)
    return float(np.max(exact / bound))


RULES = [parameters("truncated_negative_binomial", 0.0, 7, 1e-5), parameters("truncated_negative_binomial", 1.0, 7, 1e-5),
         parameters("truncated_negative_binomial", -0.5, 20, 1e-5), parameters("poisson", 0.0, 7, 1e-5)]


def toy(rng, outcomes: int, closeness: float):
    """A candidate's distributions on two neighbouring datasets: q is p moved towards another distribution."""
    p = rng.dirichlet(np.full(outcomes, 0.5))
    other = rng.dirichlet(np.full(outcomes, 0.5))
    return p, (1 - closeness) * p + closeness * other


@pytest.mark.parametrize("stopping", RULES, ids=lambda s: f"{s['rule']}-{s.get('eta', '')}")
def test_no_toy_selection_exceeds_the_bound_it_is_accounted_by(stopping):
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(40 if stopping["rule"] == "poisson" else 300):  # Poisson's bound costs 30 ms a curve
        p, q = toy(rng, int(rng.integers(2, 8)), float(rng.uniform(0.01, 0.6)))
        worst = max(worst, worst_ratio(p, q, stopping))
    assert worst <= 1 + 1e-9, worst


@pytest.mark.parametrize("stopping", [*RULES[:2], pytest.param(RULES[3], marks=pytest.mark.slow)],
                         ids=lambda s: f"{s['rule']}-{s.get('eta', '')}")  # Poisson's: 5 s of search
def test_a_search_for_the_worst_toy_stays_below_the_bound(stopping):
    """Hill climbing on (p, q) towards the largest exact / bound ratio, from several starts: the theorems are
    worst-case bounds, so no search may cross 1; it also shows how much room they leave on their worst toy."""
    rng = np.random.default_rng(1)
    best = 0.0
    starts, steps = (2, 80) if stopping["rule"] == "poisson" else (4, 120)  # Poisson's bound: 30 ms a curve
    for _ in range(starts):
        p, q = toy(rng, 4, 0.2)
        ratio = worst_ratio(p, q, stopping)
        for step in range(steps):
            scale = 0.3 * (1 - step / steps) + 0.02
            p2 = np.abs(p * np.exp(scale * rng.normal(size=4)))
            q2 = np.abs(q * np.exp(scale * rng.normal(size=4)))
            p2, q2 = p2 / p2.sum(), q2 / q2.sum()
            r = worst_ratio(p2, q2, stopping)
            if r > ratio:
                p, q, ratio = p2, q2, r
        best = max(best, ratio)
    assert 0 < best <= 1 + 1e-9, best


def test_the_exact_selection_is_right_on_a_case_by_hand():
    """Two outcomes, K geometric (eta = 1) with mean 2: P[K = k] = 2^-k. The best of K draws is the low outcome
    only when every draw is: P[low] = sum_k 2^-k a^k = a / (2 - a)."""
    stopping = parameters("truncated_negative_binomial", 1.0, 2, 1e-5)
    assert stopping["gamma"] == pytest.approx(0.5)
    a = 0.3
    out = released(np.array([a, 1 - a]), stopping)
    assert out[0] == pytest.approx(0) and out[1] == pytest.approx(a / (2 - a)) and out.sum() == pytest.approx(1)
    poisson = released(np.array([a, 1 - a]), parameters("poisson", 0.0, 2, 1e-5))
    assert poisson[0] == pytest.approx(math.exp(-2)) and poisson[1] == pytest.approx(math.exp(2 * (a - 1)) - math.exp(-2))
