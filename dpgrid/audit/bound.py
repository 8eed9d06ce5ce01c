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
"""

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom

GUESSES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # k / m: the fractions of canaries guessed on each side
EPSILON_CAP = 100.0  # no bound beyond this is reported (every guess right out of thousands reaches ~10)


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[W >= v] at most, for an (epsilon, delta)-DP training with m canaries and r guesses (module docstring)."""
    p = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, p))  # P[Bin(r, p) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    worst = float(np.max((binom.sf(v - i - 1, r, p) - tail) / i))
    return min(tail + 2 * m * delta * worst, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, significance: float) -> float:
    """The largest epsilon at which W = v correct of r guesses has a p-value below `significance` (0 when none)."""
    if r == 0 or p_value(m, r, v, 0.0, delta) > significance:
        return 0.0
    if p_value(m, r, v, EPSILON_CAP, delta) <= significance:
        return EPSILON_CAP
    return brentq(lambda eps: p_value(m, r, v, eps, delta) - significance, 0.0, EPSILON_CAP, xtol=1e-6)


def audit_scores(scores, coins, delta: float, confidence: float) -> dict:
    """The bound from the canaries' scores (higher: more likely in) and their coins (True: in): the best over
    GUESSES, each at (1 - confidence) / len(GUESSES). What it found for each k is returned too."""
    m = len(scores)
    order = sorted(range(m), key=lambda i: scores[i])
    significance = (1 - confidence) / len(GUESSES)
    tried = []
    for fraction in GUESSES:
        k = max(1, math.floor(fraction * m))
        if 2 * k > m:
            continue
        correct = sum(coins[i] for i in order[-k:]) + sum(not coins[i] for i in order[:k])
        tried.append({"guesses": 2 * k, "correct": correct,
                      "epsilon": epsilon_lower_bound(m, 2 * k, correct, delta, significance)})
    best = max(tried, key=lambda t: t["epsilon"])
    return {"epsilon_lower_bound": best["epsilon"], "guesses": best["guesses"], "correct": best["correct"],
            "tried": tried, "significance_each": significance}
