"""Papernot & Steinke (ICLR 2022), "Hyperparameter tuning with Renyi differential privacy", Theorems 2 and 6,
transcribed from the paper for tests/test_selection.py. It shares no code with dpgrid (nor with
dp-accounting, whose RDP accountant also implements them): the base mechanism's RDP is computed here from
the closed form for integer orders, not by Opacus.

Theorem 2 (truncated negative binomial, eta in (-1, inf), gamma in (0, 1)). If Q is (lam, eps)-RDP and
(lam_hat, eps_hat)-RDP, running Q K ~ D_{eta,gamma} times and returning the best is (lam, eps')-RDP with
    eps' = eps + (1 + eta)(1 - 1/lam_hat) eps_hat + (1 + eta) log(1/gamma) / lam_hat + log(E[K]) / (lam - 1),
    E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta))  (eta != 0),   (1/gamma - 1) / log(1/gamma)  (eta = 0).
Theorem 6 (Poisson, mean mu). If Q is (lam, eps)-RDP and (eps_hat, delta_hat)-DP with e^eps_hat <= 1 + 1/(lam - 1),
then running Q K ~ Poisson(mu) times is (lam, eps')-RDP with eps' = eps + mu delta_hat + log(mu) / (lam - 1).
"""

import math


def log_add(a: float, b: float) -> float:
    hi, lo = max(a, b), min(a, b)
    return hi + math.log1p(math.exp(lo - hi)) if lo > -math.inf else hi


def subsampled_gaussian_rdp(q: float, sigma: float, order: int) -> float:
    """One step of the Poisson-subsampled Gaussian at integer order a (Mironov, Talwar & Zhang 2019, Eq. 3):
    A_a = sum_k C(a, k) (1 - q)^(a - k) q^k exp((k^2 - k) / (2 sigma^2)), RDP = log(A_a) / (a - 1)."""
    log_a = -math.inf
    for k in range(order + 1):
        if q == 1 and k < order:
            continue  # (1 - q)^(a - k) = 0
        term = (math.lgamma(order + 1) - math.lgamma(k + 1) - math.lgamma(order - k + 1)
                + ((order - k) * math.log1p(-q) if order > k else 0.0) + (k * math.log(q) if k else 0.0)
                + (k * k - k) / (2 * sigma ** 2))
        log_a = log_add(log_a, term)
    return log_a / (order - 1)


def base_curve(q: float, sigma: float, steps: int, orders: list) -> list:
    return [steps * subsampled_gaussian_rdp(q, sigma, a) for a in orders]


def expected_count(eta: float, gamma: float) -> float:
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma ** eta))


def theorem_2(orders: list, curve: list, eta: float, gamma: float) -> list:
    """eps'(lam) at each order, the best lam_hat chosen among the same orders."""
    extra = min((1 + eta) * (1 - 1 / lh) * eh + (1 + eta) * math.log(1 / gamma) / lh for lh, eh in zip(orders, curve))
    mean = expected_count(eta, gamma)
    return [e + extra + math.log(mean) / (lam - 1) for lam, e in zip(orders, curve)]


def delta_of(orders: list, curve: list, epsilon: float) -> float:
    """(epsilon, delta)-DP from RDP (Canonne, Kamath & Steinke 2020, Proposition 12):
    delta = min over lam of exp((lam - 1)(eps_lam - epsilon)) / lam * (1 - 1/lam)^(lam - 1)."""
    logs = [(lam - 1) * (e - epsilon) - math.log(lam) + (lam - 1) * math.log(1 - 1 / lam) for lam, e in zip(orders, curve)]
    return math.exp(min(0.0, min(logs)))  # every mechanism is (epsilon, 1)-DP


def theorem_6(orders: list, curve: list, mu: float) -> list:
    out = []
    for lam, e in zip(orders, curve):
        eps_hat = math.log(1 + 1 / (lam - 1))  # the largest eps_hat the theorem allows at this order
        out.append(e + mu * delta_of(orders, curve, eps_hat) + math.log(mu) / (lam - 1))
    return out


def monotone(curve: list) -> list:
    """Renyi divergence does not decrease with the order: a bound at a higher order holds at a lower one."""
    out, best = [], math.inf
    for e in reversed(curve):
        best = min(best, e)
        out.append(best)
    return out[::-1]
