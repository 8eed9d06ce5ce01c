"""The truncated negative binomial law of the number of candidates (Papernot & Steinke 2022, Definition 1): its mean
and the gamma that gives a mean, found to 1e-12 in log space; the draws themselves are dpgrid.results.selection's."""

import math

from dpgrid import DpgridError


def tnb_mean(eta: float, gamma: float) -> float:
    """E[K] of the truncated negative binomial (Papernot & Steinke, after Definition 1)."""
    if gamma >= 1:
        return 1.0
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma ** eta))


SMALLEST_GAMMA = 1e-300  # the truncated negative binomial's gamma, kept a normal float64 (its powers and logs exact)


def tnb_gamma(eta: float, mean: float) -> float:
    """gamma such that E[K] = mean (E[K] falls as gamma grows), to relative precision 1e-12. DpgridError where that
    gamma is below SMALLEST_GAMMA (a shape eta near -1 with a large mean: E[K] ~ |eta| gamma^(-(1 + eta)))."""
    low, high = SMALLEST_GAMMA, 1.0
    if tnb_mean(eta, low) < mean:
        raise DpgridError(f"privacy.selection.stopping_eta={eta:g} cannot give {mean:g} candidates expected: its gamma "
                          f"would be below {SMALLEST_GAMMA:g} (E[K] grows like gamma^-(1 + eta), slowly for eta near -1); "
                          f"choose stopping_eta >= {reachable_eta(mean):.3g}, or a smaller privacy.selection.stopping_mean")
    for _ in range(2000):
        mid = math.exp((math.log(low) + math.log(high)) / 2) if high / low > 2 else (low + high) / 2
        low, high = (mid, high) if tnb_mean(eta, mid) > mean else (low, mid)
        if high - low <= 1e-12 * high:
            break
    return high


def reachable_eta(mean: float) -> float:
    """The smallest shape (to 1e-3) whose gamma for `mean` expected candidates stays above SMALLEST_GAMMA."""
    low, high = -1.0, 1.0
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (low, mid) if tnb_mean(mid, SMALLEST_GAMMA) >= mean else (mid, high)
    return math.ceil(high * 1000) / 1000
