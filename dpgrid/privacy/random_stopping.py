"""Private selection by random stopping, instead of composing the grid's runs (`privacy.selection=random_stopping`):
its accounting. Drawing the candidates, keeping the draw and reading its release back: dpgrid.results.selection.

A candidate is one configuration drawn uniformly from the grid (with replacement) and trained
`train.seeds` times; its score is the mean of its runs, and the mechanism the accountant sees is those
runs composed (seeds x T subsampled Gaussian steps). The number of candidates K is drawn once, before any
training, and only the best candidate and its score are released (selection.json):

- truncated_negative_binomial (Papernot & Steinke 2022, Definition 1 and Theorem 2), shape eta > -1:
      P[K = k] = (1 - gamma)^k / (gamma^-eta - 1) * prod_{l<k} (l + eta) / (l + 1),  k >= 1
  (eta = 0: the logarithmic distribution P[K = k] = (1 - gamma)^k / (k log 1/gamma); eta = 1: geometric).
  If one candidate is (lambda, eps(lambda))-RDP at every order, the selection is (lambda, eps')-RDP with
      eps' = eps(lambda) + (1 + eta) min_lh [(1 - 1/lh) eps(lh) + log(1/gamma) / lh] + log(E[K]) / (lambda - 1).
- poisson (their Theorem 6): K ~ Poisson(mu) (K = 0 releases nothing); with eps_hat = log(1 + 1/(lambda - 1))
  and delta_hat the candidate's delta at eps_hat,   eps' = eps(lambda) + mu delta_hat + log(mu) / (lambda - 1).
- liu_talwar (Liu & Talwar 2019, Theorem 3.4): stop with probability gamma = 1/mean after each candidate,
  at most Upsilon = log(1/delta_2) / gamma candidates; (eps_1, delta_1) per candidate below.

The RDP curves are converted to (epsilon, delta) as every dpgrid plan is (Opacus's conversion).
"""

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from dpgrid import DpgridError
from dpgrid.privacy.accountants import composed_epsilon, rdp_epsilon, smallest_noise
from dpgrid.privacy.composition import liu_talwar_parameters
from dpgrid.privacy.method import AccountingMethod
from dpgrid.privacy.stopping_laws import tnb_gamma

# orders lambda (and lambda-hat): fine near 1, where the log(E[K]) / (lambda - 1) term is steep
ORDERS = [1 + x / 20 for x in range(1, 80)] + [5 + x / 2 for x in range(0, 30)] + list(range(20, 64)) + \
         [64, 80, 96, 128, 192, 256, 384, 512, 1024]


def parameters(rule: str, eta: float, mean: float, delta: float, rounds: int = None) -> dict:
    """The stopping rule's parameters as plan.json records them."""
    if rule == "truncated_negative_binomial":
        return {"rule": rule, "eta": eta, "mean": mean, "gamma": tnb_gamma(eta, mean)}
    if rule == "poisson":
        return {"rule": rule, "mean": mean, "mu": mean}
    if rule == "binomial":  # m rounds, each trains a candidate with probability p = mean / m
        if rounds is None or rounds <= mean:
            raise DpgridError(f"privacy.selection.stopping_rounds must be a whole number > the expected number of candidates "
                              f"{mean:g} (the binomial's p = mean / rounds < 1), got {rounds}")
        return {"rule": rule, "mean": mean, "rounds": int(rounds), "p": mean / rounds}
    eps1, delta1, upsilon = liu_talwar_parameters(1.0, delta, mean)
    return {"rule": rule, "mean": mean, "gamma": 1 / mean, "max_candidates": math.ceil(upsilon), "delta_2": 1e-20,
            "candidate_delta": delta1}


def candidate_rdp(sample_rate: float, noise_multiplier: float, steps: int, orders=ORDERS) -> np.ndarray:
    from dpgrid.privacy.gaussian_rdp import compute_rdp
    return compute_rdp(sample_rate, noise_multiplier, steps, orders)


def rdp_delta(orders, rdp, epsilon: float) -> float:
    """delta of an (orders, rdp) curve at epsilon (Canonne, Kamath & Steinke 2020, Proposition 12):
    delta = min_lambda exp((lambda - 1)(rdp - epsilon)) / lambda * (1 - 1/lambda)^(lambda - 1)."""
    orders, rdp = np.asarray(orders, dtype=float), np.asarray(rdp, dtype=float)
    a, r = orders[orders > 1], rdp[orders > 1]
    bounds = (a - 1) * (r - epsilon + np.log1p(-1 / a)) - np.log(a)
    return math.exp(min(0.0, float(bounds.min())))  # every mechanism is (epsilon, 1)-DP


def selection_rdp(orders, rdp, stopping: dict) -> np.ndarray:
    """The selection's RDP curve from one candidate's (Theorem 2 or Theorem 6 above), at the same orders."""
    orders, rdp = np.asarray(orders, dtype=float), np.asarray(rdp, dtype=float)
    mean = stopping["mean"]
    if stopping["rule"] == "poisson":
        out = np.array([r + mean * rdp_delta(orders, rdp, math.log1p(1 / (a - 1))) + math.log(mean) / (a - 1)
                        for a, r in zip(orders, rdp)])
    else:
        eta, gamma = stopping["eta"], stopping["gamma"]
        c = (1 + eta) * np.min((1 - 1 / orders) * rdp + math.log(1 / gamma) / orders)
        out = rdp + c + math.log(mean) / (orders - 1)
    # RDP grows with the order: a bound at a higher order holds at every lower one
    return np.minimum.accumulate(out[::-1])[::-1]


def selection_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, stopping: dict,
                      prior=()) -> float:
    """epsilon at delta of the whole selection; `steps` = one candidate's steps (seeds x T). `prior`: mechanisms
    [(q, nu, count)] run once before the selection, whose output every candidate reads (a model's private
    statistics): their RDP adds to the selection's at every order (adaptive composition)."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    candidate = candidate_rdp(sample_rate, noise_multiplier, steps)
    if stopping["rule"] == "liu_talwar":  # Theorem 3.4: eps_f = 3 eps_1 + 3 sqrt(2 delta_1)
        if prior:
            raise DpgridError("privacy.selection.stopping=liu_talwar gives (epsilon, delta) per candidate, which dpgrid "
                              "does not compose with a model's private statistics; use truncated_negative_binomial or poisson")
        delta1 = stopping["candidate_delta"]
        return 3 * float(get_privacy_spent(orders=ORDERS, rdp=candidate, delta=delta1)[0]) + 3 * math.sqrt(2 * delta1)
    rdp = selection_rdp(ORDERS, candidate, stopping) + sum(candidate_rdp(q, nu, count) for q, nu, count in prior)
    return float(get_privacy_spent(orders=ORDERS, rdp=rdp, delta=delta)[0])


def profile_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, stopping: dict,
                    prior=()) -> float:
    from dpgrid.privacy import selection_profiles
    if prior:
        raise DpgridError("privacy.selection.selection_accountant=profile bounds the selection's epsilon at one delta, "
                          "which dpgrid does not compose with a model's private statistics; use selection_accountant=rdp")
    return selection_profiles.selection_epsilon(sample_rate, noise_multiplier, steps, delta, stopping)


# privacy.selection.selection_accountant -> the selection's epsilon at (q, nu, one candidate's steps, delta, stopping rule)
ANALYSES = {"rdp": selection_epsilon, "profile": profile_epsilon}
COVERS = {"rdp": ("truncated_negative_binomial", "poisson", "liu_talwar"),
          "profile": ("truncated_negative_binomial", "poisson", "binomial")}
RULES = tuple(dict.fromkeys(rule for rules in COVERS.values() for rule in rules))  # privacy.selection.stopping's choices
MAX_MEAN = 1e6     # E[K] of a stopping rule: the draws' statistical tests reach this far
MAX_ROUNDS = 2 ** 53  # the binomial's rounds m: every whole number up to here is exact in float64


def epsilon_by_analysis(sample_rate: float, noise_multiplier: float, steps: int, delta: float, stopping: dict,
                        prior=()) -> dict:
    """The selection's epsilon at this nu under each analysis that covers its rule (plan.json records both); with
    `prior` (a model's private statistics), the Renyi analysis alone, which composes them."""
    return {name: spent(sample_rate, noise_multiplier, steps, delta, stopping, prior) for name, spent in ANALYSES.items()
            if stopping["rule"] in COVERS[name] and not (prior and name != "rdp")}


def selection_noise(sample_rate: float, steps: int, epsilon: float, delta: float, stopping: dict,
                    analysis: str = "rdp", prior=()) -> float:
    """The smallest nu at which the selection spends (epsilon, delta) under `analysis` (ANALYSES); `steps` = one
    candidate's (seeds x T); `prior` as in selection_epsilon."""
    spent = lambda nu: ANALYSES[analysis](sample_rate, nu, steps, delta, stopping, prior)  # noqa: E731
    return smallest_noise(spent, epsilon, 1e-4, f"by {stopping['rule']} selection among {stopping['mean']:g} "
                          f"candidates (expected) of {steps} steps each",
                          key=["random_stopping", sample_rate, steps, delta, stopping] + ([] if analysis == "rdp"
                                                                                           else [analysis])
                          + ([[list(e) for e in prior]] if prior else []),
                          remedy="raise privacy.epsilon above that, or expect fewer candidates or train fewer steps "
                                 "(privacy.selection.stopping_mean or grid.k, train.seeds, train.epochs or train.steps)")


class RandomStopping(AccountingMethod):
    """nu at which the whole random-stopping selection spends (epsilon, delta): the candidate's RDP curve (its
    seeds x T subsampled Gaussian steps, Opacus) with the stopping rule's theorem on top, then RDP -> (epsilon,
    delta); or, under privacy.selection.selection_accountant=profile, the candidate's PLD profile and the profile bound
    (dpgrid.privacy.selection_profiles).

    It trains the drawn candidates (candidate i: seeds i * seeds ... (i + 1) * seeds - 1, each a fresh run starting
    from seed j's weights for its j-th, whatever i: identically distributed, as the theorems assume) and releases
    the best one alone (selection.json, its model); the draw and its keeping are dpgrid.results.selection's."""
    @dataclass
    class Options:  # conf/privacy/selection/random_stopping.yaml says what each is
        stopping: str = "truncated_negative_binomial"
        stopping_eta: float = 0.0
        stopping_mean: Optional[float] = None
        stopping_rounds: Optional[int] = None
        selection_accountant: str = "rdp"
        stopping_seed: int = 0

    @dataclass(frozen=True)
    class Record:
        stopping: dict              # the rule and its parameters
        selection_accountant: str   # the analysis: rdp (Papernot & Steinke) or profile
        epsilon_by_analysis: dict   # the selection's epsilon at this nu under each analysis that covers its rule

    name = "random_stopping"
    accounts_seeds = True  # a candidate is its seeds' runs composed
    composes_statistics = True  # the Renyi analysis adds the model's private statistics (selection_epsilon's prior)
    accountants = ("rdp", "pld")
    covers = ("the chosen candidate's output: its configuration and score (selection.json) and its trained models and "
              "learning curves (model/); not the other candidates nor how many there were (runs.csv, curves.csv, "
              "summary.csv, candidates.json, ledger.json and cli.log are the experimenter's private log)")
    procedure = "dpgrid.results.selection.RandomStoppingProcedure"

    @classmethod
    def check_options(cls, read) -> None:
        check_stopping(read, COVERS)

    def calibrate(self, plan, strategy_cls, options: dict, privacy: dict, problem: dict) -> dict:
        mean = float(privacy["stopping_mean"]) if privacy.get("stopping_mean") is not None else float(plan.n_configs)
        stopping = parameters(str(privacy["stopping"]), float(privacy["stopping_eta"]), mean, plan.delta,
                              privacy.get("stopping_rounds"))
        steps = plan.seeds * plan.steps  # one candidate: its seeds' runs composed
        analysis = str(privacy.get("selection_accountant", "rdp"))
        prior = plan.statistics
        nu = selection_noise(plan.sample_rate, steps, plan.epsilon, plan.delta, stopping, analysis, prior)
        by_analysis = epsilon_by_analysis(plan.sample_rate, nu, steps, plan.delta, stopping, prior)
        epsilon = by_analysis[analysis]  # seeds accounted: the grid's, the published tables' and the budget's epsilon
        per_run = (composed_epsilon([*prior, (plan.sample_rate, nu, steps)], plan.delta) if prior else
                   rdp_epsilon(plan.sample_rate, nu, steps, plan.delta))
        return dict(account_seeds=True, composed_runs=plan.seeds,
                    record=self.Record(stopping, analysis, by_analysis), noise_multiplier=nu,
                    per_query=strategy_cls.split_noise(nu, options, plan.batch_size),
                    epsilon_spent=epsilon, epsilon_grid=epsilon, epsilon_with_seeds=epsilon,
                    epsilon_per_run=per_run)


def check_stopping(read, covers: dict) -> None:
    """Random stopping's keys (`covers`: the rules each analysis covers), and what a selection cannot run with."""
    key, selection = "privacy.selection.", read.get("privacy.selection.name")
    read.choice(key + "stopping", tuple(r for r in RULES if any(r in c for c in covers.values())))
    read.real(key + "stopping_eta", "a number in (-1, 100]", lambda v: -1 < v <= 100)
    if read.has(key + "stopping_mean"):
        read.real(key + "stopping_mean", f"a number in (1, {MAX_MEAN:.0e}] (the expected number of candidates; "
                  "dpgrid's draws are checked against their law up to there)", lambda v: 1 < v <= MAX_MEAN)
    read.whole(key + "stopping_seed", low=0)
    analysis = read.choice(key + "selection_accountant", tuple(ANALYSES))
    if (rule := read.get(key + "stopping")) not in covers[analysis]:
        raise DpgridError(f"{key}stopping={rule} is not covered by {key}selection_accountant={analysis}; it covers "
                          f"{', '.join(covers[analysis])}")
    if rule == "binomial" and not read.has(key + "stopping_rounds"):
        raise DpgridError(f"{key}stopping=binomial needs {key}stopping_rounds, its number of rounds m (a whole number > "
                          "the expected number of candidates; each round trains a candidate with probability mean / m)")
    rounds = read.get(key + "stopping_rounds")  # unused by the other rules, but never a bad value
    if rounds is not None and not (isinstance(rounds, int) and 2 <= rounds <= MAX_ROUNDS):
        read.refuse(key + "stopping_rounds", "a whole number in 2..2^53 (beyond 2^53 a whole number has no exact "
                    "float, and the draw and the accounting would round the rounds)", rounds)
    # the candidate's accountant: Renyi curves for the RDP theorems, dp-accounting's PLD for the profile bound
    accountant = {"rdp": ("rdp", "the stopping theorems are Renyi bounds"), "profile": (
        "pld", "the profile bound needs the candidate's privacy profile, which RDP and PRV curves do not give here")}
    refusals = {"privacy.budget": ("per_grid", "a selection's budget is the whole selection's; per_run means nothing"),
                "privacy.accountant": accountant[analysis],
                "train.sampling": ("poisson", "shuffled batches claim no epsilon to select with")}
    for setting, (needed, why) in refusals.items():
        if str(read.get(setting)) != needed:
            chosen = f"{key}selection_accountant={analysis}" if setting == "privacy.accountant" else \
                f"privacy.selection={selection}"
            raise DpgridError(f"{chosen} needs {setting}={needed}, got {read.get(setting)}: {why}")
    if read.has("grid.only"):
        raise DpgridError(f"privacy.selection={selection} cannot run with grid.only: a selection draws its "
                          "candidates from the whole grid and cannot be split by hand")
