"""Accounting of full-batch noisy gradient descent with a noise schedule (the PUR paper, Section 3.2 and
Proposition 4): each step releases the mean gradient, of sensitivity 2L/N under replacement, plus N(0, sigma_t^2 I),
a rho_t-zCDP Gaussian mechanism with rho_t = (2L/N)^2 / (2 sigma_t^2) = 2 L^2 / (N^2 sigma_t^2); zCDP composes
by addition, rho = sum_t rho_t (Bun & Steinke 2016).

Two conversions to (epsilon, delta):
- `zcdp`, the paper's:   epsilon = rho + 2 sqrt(rho log(1/delta))   (Bun & Steinke, Proposition 1.3);
- `rdp`, tighter: rho-zCDP is (alpha, alpha rho)-RDP at every order, converted as every dpgrid plan is (Opacus).
A run stops at the last step whose epsilon is within the target: epsilon_T <= target < epsilon_{T+1}.
"""

import math

CONVERSIONS = ("zcdp", "rdp")
ORDERS = [1 + x / 100 for x in range(1, 100)] + [2 + x / 10 for x in range(0, 80)] + list(range(10, 257)) + \
         [384, 512, 768, 1024, 2048, 4096]


def step_rho(sigma: float, lipschitz: float, n: int) -> float:
    return 2 * lipschitz ** 2 / (n ** 2 * sigma ** 2)


def epsilon(rho: float, delta: float, conversion: str = "zcdp") -> float:
    if rho <= 0:
        return 0.0
    if conversion == "zcdp":
        return rho + 2 * math.sqrt(rho * math.log(1 / delta))
    from opacus.accountants.analysis.rdp import get_privacy_spent

    return float(get_privacy_spent(orders=ORDERS, rdp=[a * rho for a in ORDERS], delta=delta)[0])


def rho_budget(target: float, delta: float, conversion: str = "zcdp") -> float:
    """The largest rho whose epsilon is at most the target (epsilon grows with rho)."""
    if conversion == "zcdp":  # invert epsilon = rho + 2 sqrt(rho log 1/delta): sqrt(rho) = -a + sqrt(a^2 + target)
        a = math.sqrt(math.log(1 / delta))
        return (math.sqrt(a * a + target) - a) ** 2
    low, high = 0.0, 1.0
    while epsilon(high, delta, conversion) <= target:
        low, high = high, 2 * high
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon(mid, delta, conversion) <= target else (low, mid)
    return low


def steps_within(sigmas, lipschitz: float, n: int, budget_rho: float, max_steps: int) -> tuple:
    """(T, rho_T): how many steps of the schedule `sigmas` (an iterable of sigma_1, sigma_2, ...) fit in the
    zCDP budget, at most max_steps."""
    total, steps = 0.0, 0
    for sigma in sigmas:
        cost = step_rho(sigma, lipschitz, n)
        if steps >= max_steps or total + cost > budget_rho:  # the rule NoisyGD.step applies too
            break
        total, steps = total + cost, steps + 1
    return steps, total
