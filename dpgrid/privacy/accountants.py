"""The (epsilon, delta) accountants of a composition of Poisson-subsampled Gaussian mechanisms, and the
search for the smallest noise multiplier that meets a target. Keys of ACCOUNTANTS are privacy.accountant's
values for grids accounted by composition.

- rdp: Opacus's RDP analysis (the paper's moments accountant; the default);
- pld: dp-accounting's privacy loss distributions; prv: Opacus's PRV accountant. Both are tighter than RDP,
  so they calibrate less noise for the same (epsilon, delta).
"""

import math
import os
import sys

from dpgrid import DpgridError, cache_folder

MAX_NOISE_MULTIPLIER = 1e4  # beyond this the target epsilon is treated as unreachable
RDP_ORDERS_EXTRA = [80, 96, 128, 256, 512]  # beyond Opacus's defaults: they matter for small epsilon or many steps


def rdp_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, orders=None) -> float:
    """epsilon of `steps` compositions of the Poisson-subsampled Gaussian mechanism (Opacus RDP)."""
    return rdp_curve(sample_rate, noise_multiplier, orders)(steps, delta)


def rdp_curve(sample_rate: float, noise_multiplier: float, orders=None):
    """rdp_epsilon as a function of (steps, delta) at one noise multiplier: Opacus's one-step RDP curve
    (dpgrid.privacy.gaussian_rdp: Opacus's sums as arrays), computed once and scaled by the steps (RDP composes by
    adding; compute_rdp returns the one-step curve times steps, as here, so every value is the same bit for bit
    whichever way it is asked), turned into epsilon by Opacus."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import get_privacy_spent

    from dpgrid.privacy.gaussian_rdp import compute_rdp

    orders = orders or RDPAccountant.DEFAULT_ALPHAS + RDP_ORDERS_EXTRA
    one_step = compute_rdp(sample_rate, noise_multiplier, 1, orders)
    return lambda steps, delta: float(get_privacy_spent(orders=orders, rdp=one_step * steps, delta=delta)[0])


def epsilon_curve(accountant: str, sample_rate: float, noise_multiplier: float, prior=()):
    """epsilon_of(accountant, sample_rate, noise_multiplier, steps, delta) as a function of (steps, delta), each
    asked once. For rdp the one-step RDP curve is computed once (rdp_curve). `prior`: mechanisms [(q, nu, count)]
    composed with the steps (a model's private statistics, dpgrid.privacy.Plan.statistics)."""
    found = {}
    if prior:
        compute = lambda steps, delta: composed_epsilon([*prior, (sample_rate, noise_multiplier, steps)], delta,  # noqa: E731
                                                        accountant)
    elif accountant == "rdp":
        compute = rdp_curve(sample_rate, noise_multiplier)
    else:
        compute = lambda steps, delta: epsilon_of(accountant, sample_rate, noise_multiplier, steps, delta)  # noqa: E731

    def epsilon(steps: int, delta: float) -> float:
        if (steps, delta) not in found:
            found[steps, delta] = compute(steps, delta)
        return found[steps, delta]
    return epsilon


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
              accountant: str = "rdp", prior=()) -> float:
    """Smallest noise multiplier (to relative precision rtol) whose epsilon is at most the target; `prior`: mechanisms
    [(q, nu, count)] that run before the steps and compose with them (a model's private statistics)."""
    if prior:
        return smallest_noise(lambda nu: composed_epsilon([*prior, (sample_rate, nu, steps)], delta, accountant),
                              epsilon, rtol, f"for {steps} steps at sampling rate {sample_rate:.4g} and delta={delta}, "
                              "after the model's private statistics", key=[accountant, sample_rate, steps, delta,
                                                                          [list(e) for e in prior]])
    return smallest_noise(lambda nu: epsilon_of(accountant, sample_rate, nu, steps, delta), epsilon, rtol,
                          f"for {steps} steps at sampling rate {sample_rate:.4g} and delta={delta}",
                          key=[accountant, sample_rate, steps, delta])


def smallest_noise(spent, epsilon: float, rtol: float, what: str, key=None, target: str = None,
                   remedy: str = None) -> float:
    """Smallest nu (to relative precision rtol) with spent(nu) <= epsilon; spent falls as nu grows. Where no nu up
    to MAX_NOISE_MULTIPLIER meets the target, DpgridError in the user's terms: `target` names the epsilon by the
    settings it comes from (default privacy.epsilon), `remedy` what to change (default: more epsilon, fewer runs or
    steps).

    The answer is the bisection's: double `high` from 1 until spent(high) <= epsilon, then halve [low, high]
    until it is narrower than rtol * high; return high. Each evaluation of spent is a whole accounting (0.1 s
    to seconds), so the search is replayed instead: given an estimate of nu* (spent(nu*) = epsilon), the
    doubling and the halving are replayed against it without evaluating spent, and their final interval is
    checked with two evaluations, spent(high) <= epsilon < spent(low). Every point the search visits ends at
    most `low` or at least `high` of that final interval, so as spent falls with nu, the two checks give each
    of its comparisons the answer the evaluated search would give: the same nu, bit for bit. The estimate is
    the answer an earlier search with the same `key` found (`NoiseCache`), else Brent's root
    of spent(nu) = epsilon, far inside rtol; when a check fails, the halving runs in full. Either way
    spent(answer) <= epsilon has been evaluated here, never taken from the cache."""
    evaluated = {}

    def value(nu) -> float:  # each nu evaluated once
        if nu not in evaluated:
            evaluated[nu] = spent(nu)
        return evaluated[nu]

    def over(nu) -> bool:
        return value(nu) > epsilon

    def checked(estimate):  # the search's answer, when the estimate leads to it; else None
        interval = replayed(estimate, rtol)
        if interval is not None and (interval[0] == 0.0 or over(interval[0])) and not over(interval[1]):
            return interval[1]
        return None

    cache = NoiseCache(key, epsilon, rtol)
    answer = checked(cache.read()) if cache.read() is not None else None
    if answer is not None:
        return answer
    low, high = 0.0, 1.0
    while over(high):
        low, high = high, 2 * high
        if high > MAX_NOISE_MULTIPLIER:
            floor = spent(MAX_NOISE_MULTIPLIER)
            raise DpgridError(f"{target or f'privacy.epsilon={epsilon:g}'} is unreachable {what}: even noise "
                              f"multiplier {MAX_NOISE_MULTIPLIER:g} spends epsilon = {floor:.3g}; "
                              + (remedy or "raise privacy.epsilon above that, or train fewer runs or steps "
                                 "(grid.k, train.epochs or train.steps)"))
    estimate = locate(lambda nu: value(nu) - epsilon, low, high, rtol * high * 1e-3)
    answer = checked(estimate) if estimate is not None else None
    if answer is None:
        answer = halving(low, high, rtol, over)[1]
    cache.write(answer)
    return answer


def replayed(estimate: float, rtol: float):
    """The search's final [low, high] if spent(nu) > epsilon exactly when nu < estimate; None beyond the range."""
    low, high = 0.0, 1.0
    while high < estimate:
        low, high = high, 2 * high
        if high > MAX_NOISE_MULTIPLIER:
            return None
    return halving(low, high, rtol, lambda mid: mid < estimate)


class NoiseCache:
    """The answers of earlier searches, one small file each under DPGRID_CACHE (default
    $XDG_CACHE_HOME/dpgrid/noise or ~/.cache/dpgrid/noise; "off": none), keyed by what the search accounts (accountant,
    q, T, delta, the libraries' versions), its target and precision. Only an estimate: smallest_noise
    evaluates the answer again before using it, so a stale, edited or damaged entry costs time, never privacy."""

    def __init__(self, key, epsilon: float, rtol: float):
        self.path = None
        folder = cache_folder("DPGRID_CACHE", "noise")
        if key is not None and folder is not None:
            import hashlib
            import json

            text = json.dumps([key, epsilon, rtol, library_versions()], sort_keys=True, default=str)
            self.path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.txt"

    def read(self):
        try:
            found = float(self.path.read_text()) if self.path else None
        except (OSError, ValueError):
            return None
        return found if found is not None and math.isfinite(found) and found > 0 else None

    def write(self, noise_multiplier: float) -> None:
        if self.path is None:
            return
        try:  # write-then-rename: a reader sees a whole entry or none
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.part")
            partial.write_text(repr(noise_multiplier))
            os.replace(partial, self.path)
        except OSError:  # a read-only or full home: the search is just not remembered
            pass


def library_versions() -> list:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("opacus", "dp-accounting"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} absent")
    return found


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


def composed_epsilon(events, delta: float, accountant: str = "rdp") -> float:
    """epsilon at delta of several Poisson-subsampled Gaussian mechanisms composed, `events`: [(sample rate, noise
    multiplier, steps), ...] (a model fine-tuned from a private checkpoint: the checkpoint's grid's steps and its own;
    a model's private statistics and the grid's steps). rdp: Opacus's curves added at every order, then converted;
    pld: dp-accounting's PLDs composed; prv: Opacus's PRV accountant over the whole history."""
    events = [(float(q), float(nu), int(steps)) for q, nu, steps in events]
    if accountant == "prv":
        from opacus.accountants import PRVAccountant

        prv = PRVAccountant()
        prv.history = [(nu, q, steps) for q, nu, steps in events]
        return float(prv.get_epsilon(delta=delta))
    if accountant == "pld":
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        pld = pld_privacy_accountant.PLDAccountant()
        for q, nu, steps in events:
            pld.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(nu)), steps)
        return float(pld.get_epsilon(delta))
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import get_privacy_spent

    from dpgrid.privacy.gaussian_rdp import compute_rdp

    orders = RDPAccountant.DEFAULT_ALPHAS + RDP_ORDERS_EXTRA
    rdp = sum(compute_rdp(q, nu, steps, orders) for q, nu, steps in events)
    return float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])
