"""Tuning on a subsample: its bounds (dpgrid.privacy.subsample_bounds) checked against an accountant dpgrid did not
write (Opacus's subsampled Gaussian) and attacked on toys computed exactly.

A toy tuning phase outputs a configuration h from a finite set with distribution P on X1 and Q on X1 with the
changed example; a toy final phase outputs o from a finite set with distribution R_h on the data without it and
S_h with it. The whole procedure's output (h, o) then has an exact distribution on the two neighbouring datasets:
- final on X (full):  (h, o) ~ P(h) R_h(o)  against  ((1 - q1) P(h) + q1 Q(h)) S_h(o)
- final on X \\ X1 (rest):  P(h) R_h(o)  against  q1 Q(h) R_h(o) + (1 - q1) P(h) S_h(o)
Its exact Renyi divergences and privacy profile, both ways, must stay below dpgrid's bounds computed from the
phases' exact curves, for random toys and for the worst toys a search finds; bounds weakened on purpose (the tuning
phase left out, the amplification taken as linear in q1, the composition taken as the larger phase) must fail."""

import math

import numpy as np
import pytest

from dpgrid.privacy import subsample_bounds as st

from .conftest import fast_layer_runs

ORDERS = st.INTEGER_ORDERS[:40]  # orders 2..41: exact divergences of toys stay finite in floats there
EPSILONS = np.array([0.0, 0.1, 0.3, 0.6, 1.0, 1.5, 2.0, 3.0])


def renyi(p, q, orders=ORDERS) -> np.ndarray:
    keep = (p > 0) | (q > 0)
    p, q = p[keep], q[keep]
    a = np.asarray(orders, dtype=float)[:, None]
    terms = a * np.log(p) + (1 - a) * np.log(q)
    top = terms.max(axis=1, keepdims=True)
    return np.maximum((top[:, 0] + np.log(np.exp(terms - top).sum(axis=1))) / (a[:, 0] - 1), 0.0)


def both(p, q, orders=ORDERS) -> np.ndarray:
    return np.maximum(renyi(p, q, orders), renyi(q, p, orders))


def hockey(p, q, epsilons) -> np.ndarray:
    e = np.exp(np.asarray(epsilons, dtype=float))[:, None]
    return np.clip(p[None, :] - e * q[None, :], 0, None).sum(axis=1)


def profile(pairs):
    """epsilons -> the largest hockey-stick divergence, both ways, over the pairs."""
    return lambda eps: np.max([np.maximum(hockey(a, b, np.atleast_1d(eps)), hockey(b, a, np.atleast_1d(eps)))
                               for a, b in pairs], axis=0)


def toy(rng, outcomes=3, configs=3, spread=2.0):
    """(P, Q, [R_h], [S_h]): positive distributions, Q and S_h tilted from P and R_h by up to `spread` in log."""
    def pair(n):
        base = rng.dirichlet(np.ones(n))
        tilt = base * np.exp(rng.uniform(-spread, spread, n))
        return base, tilt / tilt.sum()
    p, q = pair(configs)
    finals = [pair(outcomes) for _ in range(configs)]
    return p, q, [r for r, _ in finals], [s for _, s in finals]


def exact_pair(p, q, r, s, rate, final_data):
    """The whole procedure's output distributions on the two neighbours (flattened over (h, o))."""
    r, s = np.array(r), np.array(s)
    base = (p[:, None] * r).ravel()
    if final_data == "full":
        other = (((1 - rate) * p + rate * q)[:, None] * s).ravel()
    else:
        other = (rate * q[:, None] * r + (1 - rate) * p[:, None] * s).ravel()
    return base, other


def rdp_bound(p, q, r, s, rate, final_data, weaken=None):
    """dpgrid's Renyi bound from the phases' exact curves (orders 2..256 for Zhu & Wang's sum)."""
    a = both(p, q, st.INTEGER_ORDERS)
    f = np.max([both(x, y, st.INTEGER_ORDERS) for x, y in zip(r, s)], axis=0)
    one = st.amplified_rdp(a, rate)
    if weaken == "no_tuning":
        total = f
    elif weaken == "linear":
        total = rate * a + f
    elif weaken == "larger_phase":
        total = np.maximum(one, f)
    else:
        total = one + f if final_data == "full" else st.mixture_rdp(rate, a, f)
    return total[:len(ORDERS)]


def profile_bound(p, q, r, s, rate, final_data, epsilons, weaken=None):
    delta_a, delta_f = profile([(p, q)]), profile(list(zip(r, s)))
    out = []
    for e in epsilons:
        if final_data == "rest":
            out.append(rate * delta_a(e)[0] + (1 - rate) * delta_f(e)[0])
            continue
        ones = st.amplified_delta(delta_a, rate, st.E1_GRID)
        if weaken == "no_tuning":
            out.append(delta_f(e)[0])
        elif weaken == "larger_phase":
            out.append(max(delta_f(e)[0], float(st.amplified_delta(delta_a, rate, [e])[0])))
        else:
            out.append(st.composed_delta(ones, delta_f, e))
    return np.array(out)


def worst(rate, final_data, kind, weaken=None, tries=150, seed=0, enough=math.inf) -> float:
    """The largest exact / bound ratio over random toys and a local search from the worst (Renyi: over orders;
    profile: the excess of the exact delta over the bound, as a ratio of (exact + 1e-12) / (bound + 1e-12)); the
    search ends at the first ratio over `enough` (a weakened bound caught)."""
    rng = np.random.default_rng(seed)

    def ratio(t):
        exact_p, exact_q = exact_pair(*t, rate, final_data)
        if kind == "rdp":
            exact = both(exact_p, exact_q)
            bound = rdp_bound(*t, rate, final_data, weaken)
            return float(np.max(exact / np.maximum(bound, 1e-300)))
        exact = np.maximum(hockey(exact_p, exact_q, EPSILONS), hockey(exact_q, exact_p, EPSILONS))
        bound = profile_bound(*t, rate, final_data, EPSILONS, weaken)
        return float(np.max((exact + 1e-12) / (bound + 1e-12)))

    best, best_toy = 0.0, None
    for _ in range(tries):
        t = toy(rng, spread=rng.uniform(0.1, 4.0))
        value = ratio(t)
        if value > best:
            best, best_toy = value, t
        if best > enough:
            return best
    for _ in range(tries):  # perturb the worst toy in log space
        p, q, r, s = best_toy
        jitter = lambda x: (lambda y: y / y.sum())(x * np.exp(rng.normal(0, 0.3, len(x))))  # noqa: E731
        t = (jitter(p), jitter(q), [jitter(x) for x in r], [jitter(x) for x in s])
        value = ratio(t)
        if value > best:
            best, best_toy = value, t
        if best > enough:
            return best
    return best


def test_zhu_wang_never_undercuts_opacus_subsampled_gaussian():
    for sigma in (0.7, 1.0, 2.0, 5.0):
        for rate in (0.01, 0.1, 0.5):
            bound = st.amplified_rdp(st.INTEGER_ORDERS / (2 * sigma ** 2), rate)
            tight = st.gaussian_rdp(rate, sigma, 1)
            assert np.all(bound >= tight * (1 - 1e-9)), (sigma, rate)
            assert bound[0] == pytest.approx(tight[0], rel=1e-6)  # order 2: the general bound is exact
            assert np.any(bound > 1.05 * tight)  # and it is an upper bound, not Opacus's curve again


TOY_SETTINGS = [(rate, final_data) for rate in (0.1, 0.5) for final_data in st.FINAL_DATA]


@pytest.mark.parametrize("rate, final_data", fast_layer_runs(TOY_SETTINGS, (0.5, "full")))
def test_the_renyi_bound_holds_on_exact_toys(rate, final_data):
    assert worst(rate, final_data, "rdp") <= 1 + 1e-9


@pytest.mark.parametrize("rate, final_data", fast_layer_runs(TOY_SETTINGS, (0.1, "rest")))
def test_the_profile_bound_holds_on_exact_toys(rate, final_data):
    assert worst(rate, final_data, "profile") <= 1 + 1e-6


@pytest.mark.parametrize("weaken", ["no_tuning", "linear", "larger_phase"])
def test_weakened_renyi_bounds_are_caught(weaken):
    assert worst(0.5, "full", "rdp", weaken, enough=1.01) > 1.01


@pytest.mark.parametrize("weaken", ["no_tuning", "larger_phase"])
def test_weakened_profile_bounds_are_caught(weaken):
    assert worst(0.5, "full", "profile", weaken, enough=1.01) > 1.01


def test_the_amplified_profile_is_exact_for_a_tuning_phase_alone():
    """A alone, after subsampling: (1 - q1) P + q1 Q against P. The bound q1 delta_A(log(1 + (e^e - 1) / q1)) is
    Balle et al.'s, tight for the remove direction: equal when A's loss takes two values."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        p = rng.dirichlet(np.ones(2))
        q = rng.dirichlet(np.ones(2))
        rate = rng.uniform(0.05, 0.9)
        mixed = (1 - rate) * p + rate * q
        exact = np.maximum(hockey(mixed, p, EPSILONS), hockey(p, mixed, EPSILONS))
        bound = st.amplified_delta(profile([(p, q)]), rate, EPSILONS)
        assert np.all(exact <= bound + 1e-12)


def test_the_dominating_mixture_lies_above_the_points_and_is_a_pair():
    epsilons = st.E1_GRID
    rng = np.random.default_rng(5)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
        deltas = profile([(p, q)])(epsilons)
        eps_i, w_i, w_inf = st.dominating_mixture(epsilons, deltas)
        assert w_i.sum() + w_inf <= 1 + 1e-12 and np.all(w_i >= 0)
        u = np.exp(epsilons)[:, None]
        mixture = w_inf + (w_i * np.clip(np.exp(eps_i) - u, 0, None) / (1 + np.exp(eps_i))).sum(axis=1)
        assert np.all(mixture >= deltas - 1e-12)


def test_subsampling_the_tuning_set_spends_less_than_the_same_search_on_the_full_data():
    """MNIST's figures (q = 256 / 60000, T = 2344, 5 seeds, 49 configurations, delta 1e-5, nu 1.5): random stopping
    on the full data spends more than tuning on a tenth composed with the final training, under both analyses."""
    from dpgrid.privacy.random_stopping import parameters, selection_epsilon

    q, steps, seeds, delta = 256 / 60000, 2344, 5, 1e-5
    stopping = parameters("truncated_negative_binomial", 0, 49.0, delta)
    full_search = selection_epsilon(q, 1.5, seeds * steps, delta, stopping)
    setting = st.Setting(q, steps, seeds, 49, delta, 0.1, "random_stopping", "full", stopping)
    rdp = st.rdp_spent(setting, 1.5, 1.5)
    prof = st.profile_spent(setting, 1.5, 1.5)
    assert rdp["total"] < 0.8 * full_search and prof["total"] < 0.8 * full_search
    assert rdp["final"] < rdp["total"] < rdp["final"] + rdp["tuning"]
    assert prof["total"] <= rdp["total"]  # the profile analysis is the tighter at q1 = 0.1


def test_calibration_meets_the_target_in_each_split():
    from dpgrid.privacy.random_stopping import parameters

    stopping = parameters("poisson", 0, 10.0, 1e-5)
    setting = st.Setting(0.01, 300, 2, 10, 1e-5, 0.2, "random_stopping", "full", stopping)
    nu_1, nu_2 = st.calibrate_phases(setting, 3.0, "shared", "rdp")
    assert nu_1 == nu_2
    assert st.rdp_spent(setting, nu_1, nu_2)["total"] <= 3.0 < st.rdp_spent(setting, nu_1 * 0.999, nu_2 * 0.999)["total"]
    nu_1, nu_2 = st.calibrate_phases(setting, 3.0, 0.3, "rdp")
    spent = st.rdp_spent(setting, nu_1, nu_2)
    assert spent["tuning"] <= 0.9 + 1e-9 and spent["total"] <= 3.0
    assert st.rdp_spent(setting, nu_1, nu_2 * 0.999)["total"] > 3.0
    assert not math.isclose(nu_1, nu_2)
