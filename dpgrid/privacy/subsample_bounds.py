"""The accounting of tuning on a subsample (privacy.selection=subsample_tuning, dpgrid.privacy.subsample_tuning;
Koskela & Kulkarni, NeurIPS 2023): the candidates
train on a Poisson subsample X1 of the data, the chosen hyperparameters are carried to the full data, and one
final model trains there. Only the chosen hyperparameters, the final model and the public accounting leave the
grid. The analysis, proved step by step in docs/selection.md ("Tuning on a subsample"):

Each example joins X1 with probability q1 (public, privacy.selection.tuning_rate), drawn once from the grid's randomness.
The tuning phase A runs on X1 (random stopping over the grid, or every configuration composed) and outputs the
chosen configuration h; the final phase F trains h's `seeds` runs on the full data X (privacy.selection.final_data=full) or
on X \\ X1 (rest). Write eps_A, delta_A for A's curves on X1 and eps_F, delta_F for F's.

Renyi analysis (integer orders a >= 2):
- tuning alone, A after Poisson subsampling of rate q1 (Zhu & Wang 2019, Theorem 6, a general upper bound; and
  joint convexity, which gives log(1 + q1 (e^{(a-1) eps_A(a)} - 1)) / (a - 1)); the smaller of the two:
      eps_1(a) <= 1/(a-1) log[(1-q1)^{a-1} (a q1 - q1 + 1) + C(a,2) q1^2 (1-q1)^{a-2} e^{eps_A(2)}
                              + 3 sum_{l=3..a} C(a,l) q1^l (1-q1)^{a-l} e^{(l-1) eps_A(l)}]
- full:  eps(a) <= eps_1(a) + eps_F(a)                                     (adaptive composition)
- rest:  eps(a) <= 1/(a-1) log[q1 e^{(a-1) eps_A(a)} + (1-q1) e^{(a-1) eps_F(a)}]   (a random partition)

Profile analysis (privacy.selection.selection_accountant=profile; delta_F from dp-accounting's PLD, delta_A from the
selection's profile bound or the composed PLD):
- tuning alone:  delta_1(e') <= q1 delta_A(log(1 + (e^{e'} - 1) / q1))     (amplification by subsampling)
- full:  delta(e) <= min_{e1 >= 0} delta_1(e1) + (1 - delta_1(e1)) [s delta_F(e - e1) + (1 - s) delta_F(e + e1)],
         s = e^{e1} / (1 + e^{e1}), delta_F(x) = 1 - e^x (1 - delta_F(-x)) for x < 0  (A after subsampling is
         dominated by randomized response of (e1, delta_1(e1)); composed with F's profile exactly)
- rest:  delta(e) <= q1 delta_A(e) + (1 - q1) delta_F(e)

Calibration (privacy.selection.tuning_split): `shared` (the default) gives both phases one noise multiplier nu, the
smallest at which the whole procedure spends (epsilon, delta): the candidates are tuned at the noise the final
model trains with, which is what makes their choice carry over. A number s in (0, 1): the tuning phase's nu_1 is
the smallest at which tuning alone spends s * epsilon, then the final phase's nu_2 the smallest at which the whole
procedure spends epsilon.

The carry-over rule: the sampling rate q = B / N, T, the clip and the learning rate (of the mean gradient: dpgrid
divides noisy sums by the expected batch size) are kept; the expected batch size scales with the data, B1 = q1 B
on X1 (and (1 - q1) B on X \\ X1), so a candidate costs q1 of a full run's compute.
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

from dpgrid.privacy.accountants import smallest_noise

INTEGER_ORDERS = np.arange(2, 257)  # Zhu & Wang's bound holds at integer orders
SEARCHES = ("random_stopping", "composition")  # privacy.selection.tuning_search: how the tuning phase chooses
FINAL_DATA = ("full", "rest")                   # privacy.selection.final_data: what the final model trains on
E1_GRID = np.concatenate([[0.0], np.geomspace(1e-3, 20.0, 120)])  # where the tuning phase's profile is read


# ---------------------------------------------------------------- the Renyi analysis
def amplified_rdp(rdp: np.ndarray, rate: float) -> np.ndarray:
    """RDP at INTEGER_ORDERS of a mechanism (RDP `rdp` at INTEGER_ORDERS, both directions) run on a Poisson subsample
    of rate `rate`: the smaller of Zhu & Wang's general bound (Theorem 6) and joint convexity."""
    rdp = np.asarray(rdp, dtype=float)
    a, l, log_binomial_2, log_3_binomial = zhu_wang_coefficients()
    log_q, log_rest = math.log(rate), math.log1p(-rate)
    # terms[i, j]: the l = j + 3 term of order a = INTEGER_ORDERS[i]; -inf past l = a, so every order is one row
    terms = np.where(l <= a, log_3_binomial + l * log_q + (a - l) * log_rest + (l - 1) * rdp[l.astype(int) - 2], -np.inf)
    a = a[:, 0]
    first = (a - 1) * log_rest + np.log(a * rate - rate + 1)
    second = log_binomial_2 + 2 * log_q + (a - 2) * log_rest + rdp[0]
    zhu_wang = logsumexp(np.column_stack([first, second, terms]), axis=1) / (a - 1)
    convex = np.logaddexp(log_rest, log_q + (a - 1) * rdp) / (a - 1)
    return np.maximum(0.0, np.minimum(zhu_wang, convex))


def zhu_wang_coefficients() -> tuple:
    """(the orders as a column, l = 3..256 as a row, log C(a, 2), log(3 C(a, l))): Zhu & Wang's coefficients, which
    depend on the orders alone."""
    a = INTEGER_ORDERS[:, None].astype(float)
    l = np.arange(3, INTEGER_ORDERS[-1] + 1, dtype=float)[None, :]
    log_binomial_2 = gammaln(a[:, 0] + 1) - gammaln(3) - gammaln(a[:, 0] - 1)
    log_3_binomial = math.log(3) + gammaln(a + 1) - gammaln(l + 1) - gammaln(np.maximum(a - l, 0) + 1)
    return a, l, log_binomial_2, log_3_binomial


def mixture_rdp(rate: float, rdp_a: np.ndarray, rdp_b: np.ndarray) -> np.ndarray:
    """RDP at INTEGER_ORDERS of a mixture: with probability `rate` only mechanism a sees the changed example, else only
    b (joint convexity of E_Q[(P/Q)^a])."""
    a = INTEGER_ORDERS - 1.0
    return np.logaddexp(math.log(rate) + a * rdp_a, math.log1p(-rate) + a * rdp_b) / a


def gaussian_rdp(sample_rate: float, noise_multiplier: float, steps: int) -> np.ndarray:
    """`steps` Poisson-subsampled Gaussian steps at INTEGER_ORDERS (Opacus's analysis, dpgrid.privacy.gaussian_rdp)."""
    from dpgrid.privacy.gaussian_rdp import compute_rdp

    return compute_rdp(sample_rate, noise_multiplier, steps, INTEGER_ORDERS)


def rdp_to_epsilon(rdp: np.ndarray, delta: float) -> float:
    from opacus.accountants.analysis.rdp import get_privacy_spent

    return float(get_privacy_spent(orders=[float(a) for a in INTEGER_ORDERS], rdp=rdp, delta=delta)[0])


# ---------------------------------------------------------------- the profile analysis
def amplified_delta(delta_a, rate: float, epsilons) -> np.ndarray:
    """delta at `epsilons` of a mechanism with profile `delta_a` (both directions) run on a Poisson subsample of
    rate `rate` (Balle, Barthe & Gaboardi 2018: advanced joint convexity; docs/selection.md, Step T2)."""
    epsilons = np.asarray(epsilons, dtype=float)
    inner = np.log1p(np.expm1(epsilons) / rate)
    return rate * np.asarray(delta_a(inner), dtype=float)


def rdp_delta(rdp: np.ndarray, epsilons) -> np.ndarray:
    """delta at each of `epsilons` from an RDP curve at INTEGER_ORDERS (Canonne, Kamath & Steinke 2020,
    Proposition 12, as dpgrid.privacy.random_stopping.rdp_delta)."""
    a = INTEGER_ORDERS[:, None].astype(float)
    e = np.asarray(epsilons, dtype=float)[None, :]
    bounds = (a - 1) * (rdp[:, None] - e + np.log1p(-1 / a)) - np.log(a)
    return np.exp(np.minimum(0.0, bounds.min(axis=0)))


def signed_delta(delta_f, epsilons) -> np.ndarray:
    """A profile (epsilon >= 0, both directions) extended to epsilon < 0, where
    H_{e^x}(P || Q) = 1 - e^x + e^x H_{e^-x}(Q || P)."""
    epsilons = np.asarray(epsilons, dtype=float)
    positive = np.asarray(delta_f(np.abs(epsilons)), dtype=float)
    return np.where(epsilons >= 0, positive, 1 - np.exp(epsilons) * (1 - positive))


def dominating_mixture(epsilons: np.ndarray, deltas: np.ndarray) -> tuple:
    """A symmetric pair that dominates every mechanism whose profile is at most `deltas` at `epsilons` (increasing,
    from 0): a mixture of randomized responses, (their epsilons, their weights, the weight of an infinite loss;
    the rest is randomized response of epsilon 0). Its profile, as a function of u = e^eps, is the lower convex hull
    of the points (u, delta) from some point k on, extended as a line to u = 1: a true profile, convex in u and below
    the points, lies below the hull's chords, and below the line where the line passes above the points before k
    (docs/selection.md, Step T3). k is the first at which the weights are those of a pair (at most 1 in all);
    None when there is none."""
    u = np.exp(epsilons)
    d = np.minimum.accumulate(np.clip(deltas, 0.0, 1.0))  # a profile does not increase
    for k in range(len(u) - 1):
        hull = [k]
        for j in range(k + 1, len(u)):  # the lower convex hull of the points k.., left to right
            while len(hull) >= 2 and ((d[hull[-1]] - d[hull[-2]]) * (u[j] - u[hull[-2]])
                                      >= (d[j] - d[hull[-2]]) * (u[hull[-1]] - u[hull[-2]])):
                hull.pop()
            hull.append(j)
        hu, hd = u[hull], d[hull]
        slopes = np.append(-np.diff(hd) / np.diff(hu), 0.0)  # the magnitude right of each vertex; 0 past the last
        weights = (slopes[:-1] - slopes[1:]) * (1 + hu[1:])  # a randomized response at each vertex past the first
        line = hd[0] + slopes[0] * (hu[0] - u[:k])  # the profile before point k
        if weights.min(initial=0.0) >= -1e-15 and weights.sum() + hd[-1] <= 1 and np.all(line >= d[:k]):
            return np.log(hu[1:]), np.clip(weights, 0, None), float(hd[-1])
    return None


def composed_delta(tuning_deltas: np.ndarray, delta_f, epsilon: float, e1=E1_GRID) -> float:
    """delta at `epsilon` of the tuning phase (its profile delta_1 read at e1) adaptively composed with the final
    phase (profile delta_f): the smaller of two dominations (docs/selection.md, Step T3) — the best single
    randomized response of (e1, delta_1(e1)), and the mixture of randomized responses whose profile is the convex
    hull of delta_1's points."""
    return composed_profile(tuning_deltas, delta_f, e1)(epsilon)


def composed_profile(tuning_deltas: np.ndarray, delta_f, e1=E1_GRID):
    """epsilon -> composed_delta(tuning_deltas, delta_f, epsilon, e1), the dominating mixture found once."""
    s = 1 / (1 + np.exp(-e1))
    mixture = dominating_mixture(e1, tuning_deltas)

    def delta_at(epsilon: float) -> float:
        single = tuning_deltas + (1 - tuning_deltas) * (s * signed_delta(delta_f, epsilon - e1)
                                                        + (1 - s) * signed_delta(delta_f, epsilon + e1))
        bound = float(single.min())
        if mixture is not None:
            eps_i, w_i, w_inf = mixture
            s_i = 1 / (1 + np.exp(-eps_i))
            rest = 1 - w_inf - w_i.sum()  # randomized responses of epsilon 0: the final phase alone
            bound = min(bound, float(w_inf + np.sum(w_i * (s_i * signed_delta(delta_f, epsilon - eps_i)
                                                             + (1 - s_i) * signed_delta(delta_f, epsilon + eps_i)))
                                     + rest * signed_delta(delta_f, np.array([epsilon]))[0]))
        return float(min(1.0, bound))
    return delta_at


def epsilon_at(delta_of, delta: float, high: float = 200.0) -> float:
    """The smallest epsilon (to relative 1e-6) with delta_of(epsilon) <= delta; delta_of falls with epsilon."""
    if delta_of(0.0) <= delta:
        return 0.0
    low = 0.0
    while delta_of(high) > delta:
        low, high = high, 2 * high
        if high > 1e4:
            return math.inf
    while high - low > 1e-6 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


# ---------------------------------------------------------------- the two phases
@dataclass(frozen=True)
class Setting:
    """The public figures of one subsample tuning, whatever the noise."""
    sample_rate: float    # q, both phases
    steps: int            # T, both phases
    seeds: int            # runs per candidate and of the final model
    n_configs: int        # K
    delta: float
    rate: float           # q1
    search: str           # random_stopping | composition
    final_data: str       # full | rest
    stopping: dict        # random stopping's rule and parameters ({} for composition)

    @property
    def tuning_steps(self) -> int:
        """The composed steps of the tuning phase's unit: one candidate's seeds, or the whole grid's runs."""
        return self.seeds * self.steps * (1 if self.search == "random_stopping" else self.n_configs)


def tuning_rdp(setting: Setting, noise_multiplier: float) -> np.ndarray:
    """eps_A at INTEGER_ORDERS: the tuning phase on X1, before the subsampling of X1."""
    from dpgrid.privacy.random_stopping import selection_rdp

    unit = gaussian_rdp(setting.sample_rate, noise_multiplier, setting.tuning_steps)
    return selection_rdp(INTEGER_ORDERS, unit, setting.stopping) if setting.search == "random_stopping" else unit


def rdp_spent(setting: Setting, tuning_noise: float, final_noise: float) -> dict:
    """{'tuning': epsilon of the tuning phase alone, 'final': of the final phase alone, 'total': of the whole
    procedure}, at the setting's delta, under the Renyi analysis."""
    a = tuning_rdp(setting, tuning_noise)
    one = amplified_rdp(a, setting.rate)
    final = gaussian_rdp(setting.sample_rate, final_noise, setting.seeds * setting.steps)
    total = one + final if setting.final_data == "full" else mixture_rdp(setting.rate, a, final)
    return {"tuning": rdp_to_epsilon(one, setting.delta), "final": rdp_to_epsilon(final, setting.delta),
            "total": rdp_to_epsilon(total, setting.delta)}


def tuning_profile(setting: Setting, noise_multiplier: float):
    """delta_A (epsilons -> deltas): the selection's profile bound, or the composed grid's PLD."""
    from dpgrid.privacy.selection_profiles import CandidateProfile, selection_delta

    unit = CandidateProfile(setting.sample_rate, noise_multiplier, setting.tuning_steps)
    if setting.search == "composition":
        return unit.delta
    return np.vectorize(lambda e: selection_delta(unit.delta, setting.stopping, float(e)), otypes=[float])


def profile_spent(setting: Setting, tuning_noise: float, final_noise: float) -> dict:
    """As rdp_spent, under the profile analysis."""
    from dpgrid.privacy.selection_profiles import CandidateProfile

    delta_a = tuning_profile(setting, tuning_noise)
    final = CandidateProfile(setting.sample_rate, final_noise, setting.seeds * setting.steps)
    delta = setting.delta
    tuning_alone = epsilon_at(lambda e: float(amplified_delta(delta_a, setting.rate, [e])[0]), delta)
    if setting.final_data == "full":
        # two bounds on one profile: the amplified profile, and the amplified Renyi curve's (informative where the
        # selection's profile bound is not, near epsilon = 0)
        deltas_1 = np.minimum(amplified_delta(delta_a, setting.rate, E1_GRID),
                              rdp_delta(amplified_rdp(tuning_rdp(setting, tuning_noise), setting.rate), E1_GRID))
        total = epsilon_at(composed_profile(deltas_1, final.delta), delta)
    else:
        total = epsilon_at(lambda e: setting.rate * float(delta_a(np.array([e]))[0])
                           + (1 - setting.rate) * float(final.delta(np.array([e]))[0]), delta)
    return {"tuning": tuning_alone, "final": float(final.pld.get_epsilon_for_delta(delta)), "total": total}


ANALYSES = {"rdp": rdp_spent, "profile": profile_spent}
COVERS = {"rdp": ("truncated_negative_binomial", "poisson"), "profile": ("truncated_negative_binomial", "poisson",
                                                                         "binomial")}


def calibrate_phases(setting: Setting, epsilon: float, split, analysis: str) -> tuple:
    """(nu_1, nu_2) for a target epsilon: one shared nu, or nu_1 at split * epsilon for tuning alone and nu_2 for
    the rest (module docstring). DpgridError when the target cannot be met."""
    spent = ANALYSES[analysis]
    what = f"by tuning on a subsample (privacy.selection.tuning_rate={setting.rate:g})"
    key = ["subsample_tuning", analysis, setting.sample_rate, setting.steps, setting.seeds, setting.n_configs,
           setting.delta, setting.rate, setting.search, setting.final_data, setting.stopping]
    if split == "shared":
        nu = smallest_noise(lambda v: spent(setting, v, v)["total"], epsilon, 1e-4, what, key=key + ["shared"])
        return nu, nu
    share = float(split)
    nu_1 = smallest_noise(lambda v: spent(setting, v, 1e4)["tuning"], share * epsilon, 1e-4,
                          f"for the tuning phase alone {what}", key=key + ["tuning", share],
                          target=f"privacy.selection.tuning_split={share:g} of privacy.epsilon={epsilon:g}",
                          remedy="raise privacy.selection.tuning_split or privacy.epsilon until that share is above "
                                 "it, or tune fewer candidates or steps (grid.k, train.epochs or train.steps)")
    nu_2 = smallest_noise(lambda v: spent(setting, nu_1, v)["total"], epsilon, 1e-4,
                          f"for the final phase after a tuning phase of privacy.selection.tuning_split={share:g} {what}",
                          key=key + ["final", share, nu_1])
    return nu_1, nu_2
