"""Random stopping accounted by privacy profiles (privacy.selection.selection_accountant=profile): the selection's
delta(epsilon) bounded directly from one candidate's privacy profile, in the spirit of Koskela, Redberg & Wang,
"Privacy Profiles for Private Selection" (ICML 2024). Their theorems were out of reach; the bound below is
derived and proved in docs/selection.md ("Profile accounting"), and attacked on exact toy selections
(tests/test_selection_toys.py).

A candidate is M (its seeds x T Poisson-subsampled Gaussian steps; its profile delta_M from dp-accounting's PLD,
the larger of the add and remove directions). The selection A draws K with generating function f, runs M K
times and releases the best output. With u(e3) = 1 - (1 - delta_M(e3)) e^-e3 and, per rule,

    truncated_negative_binomial (eta, gamma):  log R = (1 + eta) log max(1 + (1 - gamma) delta_M(e3) / gamma,
                                                                            1 / (1 - (1 - gamma) u))
    poisson (mu):                              log R = mu u
    binomial (m rounds, p each):               log R = (m - 1) log(1 + p u / (1 - p))

the theorem is   delta_A(eps) <= E[K] delta_M(eps - log R(e3))   for every e3 >= 0, so at a target delta

    eps_A(delta) = eps_M(delta / E[K]) + min_e3 log R(e3)        (the minimum over a grid of e3);

and by bands of s = P[Y > y], 0 = a_0 < ... < a_J = 1, with L_j the largest log f'(F)/f'(G) on band j,

    delta_A(eps) <= sum_j f'(1 - a_j) min(delta_M(eps - L_j(e3)), a_{j+1} - a_j).

dpgrid uses the smaller of the two.
"""

import math

import numpy as np

# e3, where the bound takes its ratio of f' values: fine near 0, where log R is steep
E3_GRID = np.concatenate([[0.0], np.geomspace(1e-3, 30.0, 80)])
# the banded bound: bands of s = P[Y > y] (0, then geometric up to 1) and its values of e3 (fewer: it is a sum)
BAND_EDGES = np.concatenate([[0.0], np.geomspace(1e-6, 1.0, 40)])
BAND_E3 = np.concatenate([[0.0], np.geomspace(1e-3, 30.0, 40)])
# where the candidate's profile is read (CandidateProfile.delta): every 0.004 up to 12, where selections' budgets
# lie, then every 0.05 (one PLD query costs in proportion to its points: 3,900 take 0.08 s); and exactly at the
# bound's values of e3, whose small ones a grid step would read at e3 = 0 (Poisson, E[K] = 25, eps = 1: nu 3.88
# -> 3.75)
PROFILE_GRID = np.unique(np.concatenate([np.arange(-1.0, 12.0, 0.004), np.arange(12.0, 40.0, 0.05), E3_GRID, BAND_E3]))
# dp-accounting's discretisation of the privacy loss: pessimistic (a coarser grid only overstates delta), and 1e-3
# builds a candidate's PLD 7x faster than its default 1e-4 for a bound within 0.3 % (MNIST, K = 7: eps 2.385 -> 2.39)
VALUE_DISCRETIZATION = 1e-3


class CandidateProfile:
    """delta_M(epsilon) of one candidate: `steps` Poisson-subsampled Gaussian steps (dp-accounting's PLD)."""

    def __init__(self, sample_rate: float, noise_multiplier: float, steps: int):
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=VALUE_DISCRETIZATION)
        accountant.compose(dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)),
                           steps)
        self.pld = accountant._pld  # the composed privacy loss distribution (both directions)
        self._grid_deltas = None

    def delta(self, epsilons) -> np.ndarray:
        """delta_M at each epsilon, read from the PLD's profile on PROFILE_GRID at the grid point at or below it:
        delta_M does not increase with epsilon, so this overstates it by at most one grid step's worth (0.004 in
        epsilon below 12), never understates it; below the grid, 1."""
        if self._grid_deltas is None:  # one PLD query for the grid: each of its calls costs 0.1 s
            self._grid_deltas = np.clip(np.asarray(self.pld.get_delta_for_epsilon(PROFILE_GRID), dtype=float), 0, 1)
        epsilons = np.asarray(epsilons, dtype=float)
        at = np.searchsorted(PROFILE_GRID, epsilons, side="right") - 1
        return np.where(at >= 0, self._grid_deltas[np.clip(at, 0, None)], 1.0)


def log_f_prime(stopping: dict, x):
    """log f'(x), f the generating function of the number of candidates (x in [0, 1], arrays too)."""
    x = np.asarray(x, dtype=float)
    rule = stopping["rule"]
    if rule == "poisson":
        return math.log(stopping["mu"]) + stopping["mu"] * (x - 1)
    if rule == "binomial":
        m, p = stopping["rounds"], stopping["p"]
        return math.log(m * p) + (m - 1) * np.log1p(-p * (1 - x))
    eta, gamma = stopping["eta"], stopping["gamma"]
    c = (1 - gamma) / math.log(1 / gamma) if eta == 0 else eta * (1 - gamma) / (gamma ** -eta - 1)
    with np.errstate(divide="ignore"):  # x = 1 where 1 - gamma rounds to 1: f' is infinite there, as its limit is
        return math.log(c) - (eta + 1) * np.log1p(-(1 - gamma) * x)


def log_ratio_at(stopping: dict, s, e3, delta3):
    """log f'(1 - s) - log f'(1 - min(1, e^e3 s + delta3)): the largest log f'(F(y)) / f'(G(y)) at an output with
    P[Y > y] = s, given the profile's S_Q <= e^e3 S_P + delta3 (docs/selection.md, Step 3)."""
    reached = np.minimum(1.0, np.exp(e3) * s + delta3)
    return log_f_prime(stopping, 1 - s) - log_f_prime(stopping, 1 - reached)


def log_ratio(stopping: dict, e3: np.ndarray, delta3: np.ndarray) -> np.ndarray:
    """log R(e3): a bound on log f'(F(y)) - log f'(G(y)) at every output y, from delta_M(e3) (docs/selection.md)."""
    u = 1 - (1 - delta3) * np.exp(-e3)
    rule = stopping["rule"]
    if rule == "poisson":
        return stopping["mu"] * u
    if rule == "binomial":
        m, p = stopping["rounds"], stopping["p"]
        return (m - 1) * np.log1p(p * u / (1 - p))
    eta, gamma = stopping["eta"], stopping["gamma"]
    return (1 + eta) * np.maximum(np.log1p((1 - gamma) * delta3 / gamma), -np.log1p(-(1 - gamma) * u))


def smallest_shift(delta, stopping: dict) -> float:
    """min over e3 of log R(e3), for a candidate profile `delta` (epsilons -> deltas): over E3_GRID, then refined
    between the grid points around the best."""
    shift = log_ratio(stopping, E3_GRID, delta(E3_GRID))
    best = int(np.argmin(shift))
    fine = np.linspace(E3_GRID[max(0, best - 1)], E3_GRID[min(len(E3_GRID) - 1, best + 1)], 21)
    return float(min(shift[best], log_ratio(stopping, fine, delta(fine)).min()))


def banded_delta(delta, stopping: dict, epsilon: float) -> float:
    """The banded bound (Step 2 by bands of s = P[Y > y]): min over e3 of
    sum_j f'(1 - a_j) min(delta_M(epsilon - L_j(e3)), a_{j+1} - a_j), L_j the largest log ratio on band j."""
    e3, delta3 = BAND_E3[:, None], delta(BAND_E3)[:, None]
    a, b = BAND_EDGES[None, :-1], BAND_EDGES[None, 1:]
    top = (1 - delta3) * np.exp(-e3)  # s*, where the ratio turns from rising (or monotone) to falling
    shift = np.maximum(log_ratio_at(stopping, a, e3, delta3), log_ratio_at(stopping, b, e3, delta3))
    inside = (a < top) & (top < b)
    shift = np.where(inside, np.maximum(shift, log_ratio_at(stopping, np.broadcast_to(top, shift.shape), e3, delta3)),
                     shift)
    weight = np.exp(log_f_prime(stopping, 1 - a))
    bands = weight * np.minimum(delta((epsilon - shift).ravel()).reshape(shift.shape), b - a)
    return float(min(1.0, bands.sum(axis=1).min()))


def selection_delta(delta, stopping: dict, epsilon: float) -> float:
    """The bound on the selection's delta at epsilon from a candidate profile `delta`: the smaller of the
    one-band bound E[K] delta_M(epsilon - min_e3 log R(e3)) and the banded one; at most 1."""
    uniform = stopping["mean"] * delta(np.array([epsilon - smallest_shift(delta, stopping)]))[0]
    return float(min(1.0, uniform, banded_delta(delta, stopping, epsilon)))


def selection_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, stopping: dict) -> float:
    """epsilon at delta of the whole selection; `steps` = one candidate's. The one-band bound in closed form,
    eps_M(delta / E[K]) + min_e3 log R(e3), then the banded bound by bisection below it (to relative 1e-5)."""
    profile = CandidateProfile(sample_rate, noise_multiplier, steps)
    uniform = float(profile.pld.get_epsilon_for_delta(delta / stopping["mean"])) + smallest_shift(profile.delta, stopping)
    if banded_delta(profile.delta, stopping, uniform) > delta:
        return uniform
    low, high = 0.0, uniform
    while high - low > 1e-5 * high:  # (each step reads the profile at its grid: microseconds)
        middle = (low + high) / 2
        low, high = (middle, high) if banded_delta(profile.delta, stopping, middle) > delta else (low, middle)
    return high
