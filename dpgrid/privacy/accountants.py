"""The (epsilon, delta) accountants of a composition of Poisson-subsampled Gaussian mechanisms, and the
search for the smallest noise multiplier that meets a target. Keys of ACCOUNTANTS are privacy.accountant's
values for grids accounted by composition.

- rdp: Opacus's RDP analysis (the paper's moments accountant; the default);
- pld: dp-accounting's privacy loss distributions; prv: Opacus's PRV accountant. Both are tighter than RDP,
  so they calibrate less noise for the same (epsilon, delta).
"""

import math
import sys

from dpgrid import DpgridError

MAX_NOISE_MULTIPLIER = 1e4  # beyond this the target epsilon is treated as unreachable
RDP_ORDERS_EXTRA = [80, 96, 128, 256, 512]  # beyond Opacus's defaults: they matter for small epsilon or many steps


def rdp_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, orders=None) -> float:
    """epsilon of `steps` compositions of the Poisson-subsampled Gaussian mechanism (Opacus RDP)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    orders = orders or RDPAccountant.DEFAULT_ALPHAS + RDP_ORDERS_EXTRA
    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=orders)
    return float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])


def pld_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)), steps)
    return float(accountant.get_epsilon(delta))


def prv_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta=delta))


ACCOUNTANTS = {"rdp": rdp_epsilon, "pld": pld_epsilon, "prv": prv_epsilon}


def epsilon_of(accountant: str, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    return ACCOUNTANTS[accountant](sample_rate, noise_multiplier, steps, delta)


def calibrate(epsilon: float, sample_rate: float, steps: int, delta: float, rtol: float = 1e-4,
              accountant: str = "rdp") -> float:
    """Smallest noise multiplier (to relative precision rtol) whose epsilon is at most the target."""
    return smallest_noise(lambda nu: epsilon_of(accountant, sample_rate, nu, steps, delta), epsilon, rtol,
                          f"for {steps} steps at sampling rate {sample_rate:.4g} and delta={delta}")


def smallest_noise(spent, epsilon: float, rtol: float, what: str) -> float:
    """Smallest nu (to relative precision rtol) with spent(nu) <= epsilon; spent falls as nu grows.

    The answer is the bisection's: double `high` from 1 until spent(high) <= epsilon, then halve [low, high]
    until it is narrower than rtol * high; return high. Each evaluation of spent is a whole accounting (0.1 s
    to seconds), so the halving is replayed instead: a root finder (Brent) locates nu* with spent(nu*) =
    epsilon far inside rtol, the halving is replayed against it without evaluating spent, and its final
    interval is checked with two evaluations, spent(high) <= epsilon < spent(low). Every point the halving
    visits ends at most `low` or at least `high` of that final interval, so as spent falls with nu, the two
    checks give each of its comparisons the answer the evaluated halving would give: the same nu, bit for
    bit. When a check fails (nu* closer to a halving point than Brent's precision), the halving runs in full.
    Either way spent(answer) <= epsilon has been evaluated, never assumed."""
    evaluated = {}

    def value(nu) -> float:  # each nu evaluated once
        if nu not in evaluated:
            evaluated[nu] = spent(nu)
        return evaluated[nu]

    def over(nu) -> bool:
        return value(nu) > epsilon

    low, high = 0.0, 1.0
    while over(high):
        low, high = high, 2 * high
        if high > MAX_NOISE_MULTIPLIER:
            floor = spent(MAX_NOISE_MULTIPLIER)
            raise DpgridError(f"privacy.epsilon={epsilon} is unreachable {what}: even noise multiplier "
                              f"{MAX_NOISE_MULTIPLIER:g} spends epsilon = {floor:.3g}; raise epsilon above that "
                              f"or shrink the grid")
    estimate = locate(lambda nu: value(nu) - epsilon, low, high, rtol * high * 1e-3)
    if estimate is not None:
        a, b = halving(low, high, rtol, lambda mid: mid < estimate)
        if (a == 0.0 or over(a)) and not over(b):
            return b
    return halving(low, high, rtol, over)[1]


def halving(low: float, high: float, rtol: float, over) -> tuple:
    """[low, high] halved until narrower than rtol * high, keeping over(low) and not over(high)."""
    while high - low > rtol * high:
        mid = (low + high) / 2
        low, high = (mid, high) if over(mid) else (low, mid)
    return low, high


def locate(excess, low: float, high: float, tolerance: float):
    """nu in [low, high] where excess(nu) = 0 (excess falls with nu, excess(high) <= 0), to `tolerance`; None
    when it cannot be bracketed with finite values."""
    from scipy.optimize import brentq

    a = low if low > 0 else high / 2
    while excess(a) <= 0 and a > tolerance:  # below 1: find a point that still spends too much
        a /= 2
    try:
        left, right = excess(a), excess(high)
        if not (math.isfinite(left) and math.isfinite(right) and left > 0 >= right):
            return None
        return brentq(excess, a, high, xtol=tolerance, rtol=4 * sys.float_info.epsilon)
    except (ValueError, RuntimeError, OverflowError):
        return None
