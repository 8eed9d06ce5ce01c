"""The one-run lower bound on epsilon (Steinke, Nasr & Jagielski, "Privacy auditing with one (1) training run",
NeurIPS 2023), derived in docs/audit.md.

m canaries, each included in the training data with probability 1/2 by its own secret coin S_i. The auditor ranks
the canaries by a score computed from what was released and guesses "in" for the k highest, "out" for the k lowest,
abstaining on the rest: r = 2k guesses, W of them correct. If the training is (epsilon, delta)-DP with respect to each
canary (adding or removing it), then for every v

    P[W >= v] <= P[Bin(r, p) >= v] + 2 m delta max_{i = 1..v} P[v - i <= Bin(r, p) < v] / i,    p = e^eps / (1 + e^eps)

(their Theorem 3: at delta = 0, W is dominated by the Binomial, as r independent randomised responses would be). An
observed W whose right-hand side is below the significance beta falsifies the claim at that epsilon: the lower bound
is the largest such epsilon, a statement that holds with probability >= 1 - beta over the coins.

Several k are tried (GUESSES); each is tested at beta / len(GUESSES) (Bonferroni), so that the best of them keeps the
stated confidence.

Beside it, the f-DP estimate of Mahloujifar, Melis & Chaudhuri ("Auditing f-differential privacy in one run", ICML
2025): the claim tested is that the training is as private as the Gaussian mechanism whose epsilon at this delta is
epsilon (mu-GDP with mu = 1 / sigma(epsilon, delta)), a claim stronger than (epsilon, delta)-DP and the shape many
composed subsampled Gaussian steps approach. It uses the whole trade-off curve, not only its one point, and so falsifies
larger epsilons from the same guesses; it is exact for a Gaussian mechanism and an estimate otherwise (fdp_epsilon).
"""

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import bdtrc, expit, log_ndtr, ndtr, ndtri

GUESSES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # k / m: the fractions of canaries guessed on each side
EPSILON_CAP = 100.0  # no bound beyond this is reported (every guess right out of thousands reaches ~10)


def binomial_tail(k, n: int, p: float):
    """P[Bin(n, p) > k] (scipy.stats.binom.sf) from its special function: the distribution object costs 50 us a call,
    and the bound's search makes thousands."""
    k = np.asarray(k, dtype=float)
    return np.where(k < 0, 1.0, np.where(k >= n, 0.0, bdtrc(np.clip(k, 0, n), n, p)))


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[W >= v] at most, for an (epsilon, delta)-DP training with m canaries and r guesses (module docstring)."""
    p = float(expit(epsilon))
    tail = float(binomial_tail(v - 1, r, p))  # P[Bin(r, p) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    worst = float(np.max((binomial_tail(v - i - 1, r, p) - tail) / i))
    return min(tail + 2 * m * delta * worst, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, significance: float) -> float:
    """The largest epsilon at which W = v correct of r guesses has a p-value below `significance` (0 when none)."""
    if r == 0 or p_value(m, r, v, 0.0, delta) > significance:
        return 0.0
    if p_value(m, r, v, EPSILON_CAP, delta) <= significance:
        return EPSILON_CAP
    return brentq(lambda eps: p_value(m, r, v, eps, delta) - significance, 0.0, EPSILON_CAP, xtol=1e-6)


def coins_by_score(scores, coins) -> np.ndarray:
    """The canaries' coins (True: in) in the order of their scores, lowest first (ties in the canaries' order): the
    guesses of both estimates are its ends."""
    return np.asarray(coins, dtype=bool)[np.argsort(np.asarray(scores, dtype=float), kind="stable")]


def audit_scores(scores, coins, delta: float, confidence: float) -> dict:
    """The bound from the canaries' scores (higher: more likely in) and their coins (True: in): the best over
    GUESSES, each at (1 - confidence) / len(GUESSES). What it found for each k is returned too."""
    m = len(scores)
    inside = coins_by_score(scores, coins)
    significance = (1 - confidence) / len(GUESSES)
    tried = []
    for fraction in GUESSES:
        k = max(1, math.floor(fraction * m))
        if 2 * k > m:
            continue
        correct = int(inside[-k:].sum() + (~inside[:k]).sum())
        tried.append({"guesses": 2 * k, "correct": correct,
                      "epsilon": epsilon_lower_bound(m, 2 * k, correct, delta, significance)})
    best = max(tried, key=lambda t: t["epsilon"])
    return {"epsilon_lower_bound": best["epsilon"], "guesses": best["guesses"], "correct": best["correct"],
            "tried": tried, "significance_each": significance}


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The mu of the Gaussian mechanism that is (epsilon, delta)-DP with equality (sensitivity over noise; Balle &
    Wang 2018): delta = Phi(mu / 2 - epsilon / mu) - e^epsilon Phi(-mu / 2 - epsilon / mu), increasing in mu; solved
    in the log domain (tests/test_audit.py checks it against dp_accounting's get_sigma_gaussian)."""
    def log_delta(mu):
        a, b = log_ndtr(mu / 2 - epsilon / mu), epsilon + log_ndtr(-mu / 2 - epsilon / mu)
        return a + math.log1p(-math.exp(min(b - a, 0.0))) if b < a else -math.inf

    target, high = math.log(delta), 1.0
    while log_delta(high) < target:
        high *= 2
    return brentq(lambda mu: log_delta(mu) - target, 1e-9, high, xtol=1e-13, rtol=1e-13)


def gaussian_power_inverse(epsilon: float, delta: float):
    """x -> the least false-positive rate at which a test of the Gaussian mechanism that is (epsilon, delta)-DP with
    equality reaches power x: Phi(Phi^-1(x) - mu)."""
    mu = gaussian_mu(epsilon, delta)
    return lambda x: float(ndtr(ndtri(x) - mu))


def fdp_margin(m: int, k: int, v: int, epsilon: float, delta: float, significance: float) -> float:
    """Positive when v right of k "in" guesses among m canaries falsify, at `significance`, that the training is as
    private as the (epsilon, delta) Gaussian mechanism: Mahloujifar et al.'s recursion. Were the claim true and the
    guesses this good with probability at least `significance`, the expected masses of right and wrong guesses (per
    canary), starting from significance v / m and significance (k - v) / m, must grow guess by guess (from the v-th
    right one down) as the trade-off curve forces: the wrong mass at least the curve's least false-positive rate for
    the right mass, the right mass by i / (k - i) of each increase of the wrong one. The margin is by how much
    together they exceed k / m, the guesses made (falsified when positive)."""
    least_false = gaussian_power_inverse(epsilon, delta)
    right, wrong = significance * v / m, significance * (k - v) / m
    for i in range(v - 1, -1, -1):
        forced = max(wrong, least_false(right))
        if forced == wrong:  # neither mass moves again
            break
        right, wrong = min(right + i / (k - i) * (forced - wrong), 1.0), forced
    return right + wrong - k / m


def fdp_epsilon(m: int, k: int, v: int, delta: float, significance: float) -> float:
    """The largest epsilon at which fdp_margin is positive (0 when none; EPSILON_CAP at most): the margin falls as
    epsilon grows."""
    if k == 0 or fdp_margin(m, k, v, 0.0, delta, significance) <= 0:
        return 0.0
    if fdp_margin(m, k, v, EPSILON_CAP, delta, significance) > 0:
        return EPSILON_CAP
    return brentq(lambda eps: fdp_margin(m, k, v, eps, delta, significance), 0.0, EPSILON_CAP, xtol=1e-7)


def fdp_scores(scores, coins, delta: float, confidence: float) -> dict:
    """The f-DP estimate from the canaries' scores: "in" for the k highest (one-sided, as Mahloujifar et al.), k / m
    each of GUESSES, each at (1 - confidence) / len(GUESSES); the best."""
    m = len(scores)
    inside = coins_by_score(scores, coins)
    significance = (1 - confidence) / len(GUESSES)
    tried = []
    for fraction in GUESSES:
        k = max(1, math.floor(fraction * m))
        correct = int(inside[-k:].sum())
        tried.append({"guesses": k, "correct": correct, "epsilon": fdp_epsilon(m, k, correct, delta, significance)})
    best = max(tried, key=lambda t: t["epsilon"])
    return {"epsilon_lower_bound": best["epsilon"], "guesses": best["guesses"], "correct": best["correct"],
            "tried": tried, "significance_each": significance}
