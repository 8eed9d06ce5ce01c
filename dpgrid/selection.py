"""Private selection by random stopping, instead of composing the grid's runs (`privacy.selection=random_stopping`).

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
  at most Upsilon = log(1/delta_2) / gamma candidates; (eps_1, delta_1) per candidate as in dpgrid.privacy.

The RDP curves are converted to (epsilon, delta) as every dpgrid plan is (Opacus's conversion).
"""

import json
import math
import warnings

import numpy as np

from . import DpgridError

RULES = ("truncated_negative_binomial", "poisson", "liu_talwar")
# orders lambda (and lambda-hat): fine near 1, where the log(E[K]) / (lambda - 1) term is steep
ORDERS = [1 + x / 20 for x in range(1, 80)] + [5 + x / 2 for x in range(0, 30)] + list(range(20, 64)) + \
         [64, 80, 96, 128, 192, 256, 384, 512, 1024]


def tnb_mean(eta: float, gamma: float) -> float:
    """E[K] of the truncated negative binomial (Papernot & Steinke, after Definition 1)."""
    if gamma >= 1:
        return 1.0
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma ** eta))


def tnb_gamma(eta: float, mean: float) -> float:
    """gamma such that E[K] = mean (E[K] falls as gamma grows), to relative precision 1e-12."""
    low, high = 1e-300, 1.0
    for _ in range(2000):
        mid = math.sqrt(low * high) if high / low > 2 else (low + high) / 2
        low, high = (mid, high) if tnb_mean(eta, mid) > mean else (low, mid)
        if high - low <= 1e-12 * high:
            break
    return high


def liu_talwar_parameters(epsilon_f: float, delta_f: float, n_candidates: int, delta_2: float = 1e-20):
    """Per-candidate (epsilon_1, delta_1) so that LT selection is (epsilon_f, delta_f)-DP.

    Liu & Talwar 2019, Theorem 3.4 (Mohapatra et al. 2022, Theorem 1): with stopping probability
    gamma = 1/K and Upsilon = log(1/delta_2) / gamma, LT is (3 e1 + 3 sqrt(2 d1), sqrt(2 d1) Upsilon + d2)-DP.
    Returns (epsilon_1, delta_1, Upsilon); epsilon_1 <= 0 means the target is out of LT's reach."""
    gamma = 1.0 / n_candidates
    upsilon = math.log(1 / delta_2) / gamma
    root = (delta_f - delta_2) / upsilon  # sqrt(2 delta_1)
    return (epsilon_f - 3 * root) / 3, root ** 2 / 2, upsilon


def parameters(rule: str, eta: float, mean: float, delta: float) -> dict:
    """The stopping rule's parameters as plan.json records them."""
    if rule == "truncated_negative_binomial":
        return {"rule": rule, "eta": eta, "mean": mean, "gamma": tnb_gamma(eta, mean)}
    if rule == "poisson":
        return {"rule": rule, "mean": mean, "mu": mean}
    eps1, delta1, upsilon = liu_talwar_parameters(1.0, delta, mean)
    return {"rule": rule, "mean": mean, "gamma": 1 / mean, "max_candidates": math.ceil(upsilon), "delta_2": 1e-20,
            "candidate_delta": delta1}


def candidate_rdp(sample_rate: float, noise_multiplier: float, steps: int, orders=ORDERS) -> np.ndarray:
    from opacus.accountants.analysis.rdp import compute_rdp

    return np.asarray(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=orders))


def rdp_delta(orders, rdp, epsilon: float) -> float:
    """delta of an (orders, rdp) curve at epsilon (Canonne, Kamath & Steinke 2020, Proposition 12):
    delta = min_lambda exp((lambda - 1)(rdp - epsilon)) / lambda * (1 - 1/lambda)^(lambda - 1)."""
    bounds = [(a - 1) * (r - epsilon + math.log1p(-1 / a)) - math.log(a) for a, r in zip(orders, rdp) if a > 1]
    return math.exp(min(0.0, min(bounds)))  # every mechanism is (epsilon, 1)-DP


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


def selection_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, stopping: dict) -> float:
    """epsilon at delta of the whole selection; `steps` = one candidate's steps (seeds x T)."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    candidate = candidate_rdp(sample_rate, noise_multiplier, steps)
    if stopping["rule"] == "liu_talwar":  # Theorem 3.4: eps_f = 3 eps_1 + 3 sqrt(2 delta_1)
        delta1 = stopping["candidate_delta"]
        return 3 * float(get_privacy_spent(orders=ORDERS, rdp=candidate, delta=delta1)[0]) + 3 * math.sqrt(2 * delta1)
    return float(get_privacy_spent(orders=ORDERS, rdp=selection_rdp(ORDERS, candidate, stopping), delta=delta)[0])


def uniforms(count: int, source) -> list:
    """`count` uniforms in [0, 1) with 53 random bits each, from a seeded torch.Generator or a SecureRandom."""
    import torch

    if isinstance(source, torch.Generator):
        bits = torch.randint(0, 2 ** 53, (count,), generator=source, dtype=torch.int64).tolist()
    else:
        bits = [int(x) >> 11 for x in source.uint64(count)]
    return [b / 2 ** 53 for b in bits]


def draw_count(stopping: dict, u: float) -> int:
    """K by inversion of its distribution at the uniform u."""
    rule, mean = stopping["rule"], stopping["mean"]
    if rule == "poisson":
        k, p = 0, math.exp(-mean)
        pmf = lambda k, previous: previous * mean / k  # noqa: E731
    elif rule == "liu_talwar":
        gamma = stopping["gamma"]
        k, p = 1, gamma
        pmf = lambda k, previous: previous * (1 - gamma)  # noqa: E731
    else:
        eta, gamma = stopping["eta"], stopping["gamma"]
        k = 1
        p = (1 - gamma) / math.log(1 / gamma) if eta == 0 else (1 - gamma) * eta / (gamma ** -eta - 1)
        pmf = lambda k, previous: previous * (1 - gamma) * (k - 1 + eta) / k  # noqa: E731
    cumulative = p
    while cumulative <= u and p > 0:
        k += 1
        p = pmf(k, p)
        cumulative += p
    return min(k, stopping["max_candidates"]) if rule == "liu_talwar" else k


def draw_candidates(stopping: dict, config_ids: list, source) -> list:
    """The candidates, in order: K from the stopping rule, then K configurations uniformly with replacement."""
    count = draw_count(stopping, uniforms(1, source)[0])
    return [config_ids[min(int(u * len(config_ids)), len(config_ids) - 1)] for u in uniforms(count, source)]


def draw_digest(stopping: dict, drawn: list) -> str:
    """The identity of one draw: every candidate row records it, so a draw cannot change under its rows."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps({"stopping": stopping, "candidates": drawn}, sort_keys=True).encode()).hexdigest()[:16]


def candidates(out, plan, configs: list, source, overwrite: bool = False) -> tuple:
    """(the drawn candidates' configurations in order, the draw's digest). Drawn once and kept in
    candidates.json (private, like runs.csv), so that a resumed selection trains the same candidates.

    A selection is drawn once: drawing again on the same data is a second selection that spends epsilon
    again. A candidates.json that is missing, damaged or edited next to candidate rows in runs.csv (rows
    of another draw, a candidate index beyond the draw, a configuration the draw did not put there) is
    refused naming the file; overwrite=true deletes the selection's files and draws anew, saying so. With
    no candidate trained yet, a damaged file is drawn again (nothing was computed from the data)."""
    from pathlib import Path

    import pandas as pd

    from .files import environment, write_json

    out, by_id = Path(out), {c["config_id"]: c for c in configs}
    path, runs_path = out / "candidates.json", out / "runs.csv"
    runs = pd.read_csv(runs_path, dtype={"config_id": str}) if runs_path.exists() and runs_path.stat().st_size else None
    trained = runs is not None and len(runs) > 0
    drawn, problem = recorded_draw(path, plan, by_id)
    if trained and drawn is None and not problem:
        problem = f"{path} is missing but {runs_path} holds candidate runs"
    if trained and drawn is not None and not problem:
        problem = rows_problem(path, runs_path, runs, drawn, draw_digest(plan.stopping, drawn))
    if problem and trained and not overwrite:
        raise DpgridError(f"{problem}; a new draw would be a second selection on the same data, spending epsilon again: "
                          "restore the file, or pass overwrite=true to start a new selection (it spends a new epsilon)")
    if problem and trained:
        warnings.warn(f"overwrite=true: {problem}; the selection's files are deleted and a NEW selection is drawn: it "
                      "spends a new (epsilon, delta) on the same data, on top of the earlier one's", stacklevel=2)
        for name in ("runs.csv", "curves.csv", "summary.csv", "selection.json", "candidates.json"):
            with environment(out / name):
                (out / name).unlink(missing_ok=True)
    elif problem:
        warnings.warn(f"{problem}; no candidate was trained yet, so the candidates are drawn again", stacklevel=2)
    if problem or drawn is None:
        drawn = draw_candidates(plan.stopping, list(by_id), source)
        write_json(path, {"stopping": plan.stopping, "candidates": drawn})
    return [by_id[c] for c in drawn], draw_digest(plan.stopping, drawn)


def recorded_draw(path, plan, by_id: dict) -> tuple:
    """(the candidates candidates.json records, or None when there is no file; what is wrong with it, or '')."""
    if not path.exists():
        return None, ""
    try:
        recorded = json.loads(path.read_text())
        drawn, stopping = recorded["candidates"], recorded["stopping"]
        if not (isinstance(drawn, list) and all(isinstance(c, str) for c in drawn)):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return [], f"{path} is damaged (not the JSON of a draw)"
    if stopping != json.loads(json.dumps(plan.stopping)):
        return drawn, f"{path} records the stopping rule {stopping}, this plan's is {plan.stopping}"
    if any(c not in by_id for c in drawn):
        return drawn, f"{path} names a configuration that is not in this grid"
    return drawn, ""


def rows_problem(path, runs_path, runs, drawn: list, digest: str) -> str:
    """Why the candidate rows of runs.csv were not trained from this draw ('' when they were)."""
    if "draw" not in runs or set(runs["draw"].astype(str)) != {digest}:
        return f"{path} is not the draw the candidate rows of {runs_path} were trained from (edited or replaced)"
    for candidate, config_id in zip(runs["candidate"], runs["config_id"]):
        if not (0 <= int(candidate) < len(drawn) and drawn[int(candidate)] == config_id):
            return f"{path} does not hold candidate {int(candidate)} ({config_id}) of {runs_path}"
    return ""
