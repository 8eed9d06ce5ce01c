"""A selection's draw: K candidates from the stopping rule's law, by inversion of uniforms with 53 random bits (seeded
or secure), each probability in log space and the cumulative summed exactly; then K configurations uniformly with
replacement. The laws' parameters are dpgrid.privacy.random_stopping's; keeping the draw is dpgrid.results.selection's.
"""

import math

import numpy as np
from scipy.special import betaln, gammaln


def uniforms(count: int, source) -> list:
    """`count` uniforms in [0, 1) with 53 random bits each, from a seeded torch.Generator or a SecureRandom."""
    import torch

    if isinstance(source, torch.Generator):
        bits = torch.randint(0, 2 ** 53, (count,), generator=source, dtype=torch.int64).tolist()
    else:
        bits = [int(x) >> 11 for x in source.uint64(count)]
    return [b / 2 ** 53 for b in bits]


def draw_count(stopping: dict, u: float) -> int:
    """K by inversion of its law at the uniform u in [0, 1): the smallest k with P[K <= k] > u.

    Every probability is computed in log space (lgamma and log-beta functions, log1p: nothing underflows or loses
    its digits to a rounding of 1 - q, however large E[K] or the binomial's rounds), and the cumulative is summed
    exactly chunk by chunk (math.fsum), so the draw follows the law to the rounding of its terms. The work grows
    with the K drawn, never with the law's extent: less than training the candidates it draws."""
    rule, mean = stopping["rule"], stopping["mean"]
    if rule == "poisson":
        log_mean = math.log(mean)
        return inverse_cdf(lambda k: k * log_mean - mean - gammaln(k + 1), 0, u)
    if rule == "binomial":
        m, q = stopping["rounds"], stopping["p"]
        log_q, log_rest = math.log(q), math.log1p(-q)
        return inverse_cdf(lambda k: log_choose(m, k) + k * log_q + (m - k) * log_rest, 0, u, last=m)
    if rule == "liu_talwar":  # geometric: stop with probability gamma after each candidate, at most max_candidates
        gamma = stopping["gamma"]
        log_gamma, log_rest = math.log(gamma), math.log1p(-gamma)
        return inverse_cdf(lambda k: log_gamma + (k - 1) * log_rest, 1, u, last=stopping["max_candidates"])
    eta, gamma = stopping["eta"], stopping["gamma"]
    log_rest = math.log1p(-gamma)
    if eta == 0:  # the logarithmic distribution: (1 - gamma)^k / (k log 1/gamma)
        log_norm = math.log(-math.log(gamma))
        return inverse_cdf(lambda k: k * log_rest - np.log(k) - log_norm, 1, u)
    # (1 - gamma)^k / (gamma^-eta - 1) * Gamma(k + eta) / (Gamma(eta) k!); for eta in (-1, 0) Gamma(eta) and
    # gamma^-eta - 1 are both negative
    log_norm = float(gammaln(eta)) + math.log(abs(math.expm1(-eta * math.log(gamma))))
    return inverse_cdf(lambda k: k * log_rest + log_rising_ratio(k, eta) - log_norm, 1, u)


def log_choose(m: int, k):
    """log C(m, k) for k in 0..m, accurate for m up to 2^53: -log B(m - k + 1, k) - log k."""
    k = np.asarray(k, dtype=float)
    inside = np.clip(k, 1, m)
    return np.where((k == 0) | (k == m), 0.0, -betaln(m - inside + 1, inside) - np.log(inside))


def log_rising_ratio(k, eta: float):
    """log Gamma(k + eta) / Gamma(k + 1) for k >= 1, eta > -1, without the cancellation of two lgammas of large k."""
    k = np.asarray(k, dtype=float)
    if eta < 1:  # B(k + eta, 1 - eta) = Gamma(k + eta) Gamma(1 - eta) / Gamma(k + 1)
        return betaln(k + eta, 1 - eta) - float(gammaln(1 - eta))
    if eta == 1:
        return np.zeros_like(k)
    return float(gammaln(eta - 1)) - betaln(k + 1, eta - 1)  # B(k + 1, eta - 1) = Gamma(k + 1) Gamma(eta - 1) / Gamma(k + eta)


def inverse_cdf(log_pmf, first: int, u: float, last: int = None) -> int:
    """The smallest k >= first with P[K <= k] > u, for the law whose log probabilities `log_pmf` gives (numpy arrays
    of k in, out); `last`: the largest value (its probability is all that is left). Chunks of growing size; each
    chunk's mass is summed exactly (math.fsum) into the cumulative below it. Where rounding leaves the cumulative
    a hair under u after the last term that does not underflow, that term's k is the draw (a shift of less than
    1e-15 of probability)."""
    passed, start, size, reached = [], first, 256, None
    while True:
        stop = start + size if last is None else min(start + size, last + 1)
        ks = np.arange(start, stop, dtype=float)
        p = np.exp(log_pmf(ks))
        below = math.fsum(passed)
        hit = np.flatnonzero(below + np.cumsum(p) > u)
        if len(hit):
            return start + int(hit[0])
        positive = np.flatnonzero(p > 0)
        if len(positive):
            reached = start + int(positive[-1])
        elif below > 0.5 or (last is not None and stop > last):  # past the tail: every later term underflows
            return reached if reached is not None else first
        if last is not None and stop > last:
            return last
        passed.append(math.fsum(p))
        start, size = stop, min(2 * size, 1 << 16)


def draw_candidates(stopping: dict, config_ids: list, source) -> list:
    """The candidates, in order: K from the stopping rule, then K configurations uniformly with replacement."""
    count = draw_count(stopping, uniforms(1, source)[0])
    return [config_ids[min(int(u * len(config_ids)), len(config_ids) - 1)] for u in uniforms(count, source)]
