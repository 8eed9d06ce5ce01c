"""Private selection by random stopping: drawing the candidates once, keeping the draw (candidates.json) so
that a resumed selection trains the same candidates, and what the selection releases (selection.json). Its
accounting is dpgrid.privacy.random_stopping's.
"""

import hashlib
import json
import math
import warnings

import numpy as np
import pandas as pd
from scipy.special import betaln, gammaln

from dpgrid import DpgridError
from dpgrid.results.runs import summarize


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


def draw_digest(stopping: dict, drawn: list) -> str:
    """The identity of one draw: every candidate row records it, so a draw cannot change under its rows."""
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

    from dpgrid.results.files import delete_release, read_frame, write_json

    out, by_id = Path(out), {c["config_id"]: c for c in configs}
    path, runs_path = out / "candidates.json", out / "runs.csv"
    runs = read_frame(runs_path) if runs_path.exists() and runs_path.stat().st_size else None
    trained = runs is not None and len(runs) > 0
    drawn, problem = recorded_draw(path, plan, by_id)
    if trained and drawn is None and not problem:
        problem = f"{path} is missing but {runs_path} holds candidate runs"
    if trained and drawn is not None and not problem:
        problem = rows_problem(path, runs_path, runs, drawn, draw_digest(plan.record.stopping, drawn))
    if problem and trained and not overwrite:
        raise DpgridError(f"{problem}; a new draw would be a second selection on the same data, spending epsilon again: "
                          "restore the file, or pass overwrite=true to start a new selection (it spends a new epsilon)")
    if problem and trained:
        warnings.warn(f"overwrite=true: {problem}; the selection's files are deleted and a NEW selection is drawn: it "
                      "spends a new (epsilon, delta) on the same data, on top of the earlier one's", stacklevel=2)
        delete_release(out)
    elif problem:
        warnings.warn(f"{problem}; no candidate was trained yet, so the candidates are drawn again", stacklevel=2)
    if problem or drawn is None:
        drawn = draw_candidates(plan.record.stopping, list(by_id), source)
        write_json(path, {"stopping": plan.record.stopping, "candidates": drawn})
    return [by_id[c] for c in drawn], draw_digest(plan.record.stopping, drawn)


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
    if stopping != json.loads(json.dumps(plan.record.stopping)):
        return drawn, f"{path} records the stopping rule {stopping}, this plan's is {plan.record.stopping}"
    if any(c not in by_id for c in drawn):
        return drawn, f"{path} names a configuration that is not in this grid"
    return drawn, ""


def rows_problem(path, runs_path, runs, drawn: list, digest: str) -> str:
    """Why the candidate rows of runs.csv were not trained from this draw ('' when they were). Rows of candidate -1 are
    no candidate's (a tuning on a subsample's final runs, trained from the same draw)."""
    if "candidate" in runs:
        runs = runs[runs.candidate.astype(int) >= 0]
    if "draw" not in runs or set(runs["draw"].astype(str)) != {digest}:
        return f"{path} is not the draw the candidate rows of {runs_path} were trained from (edited or replaced)"
    for candidate, config_id in zip(runs["candidate"], runs["config_id"]):
        if not (0 <= int(candidate) < len(drawn) and drawn[int(candidate)] == config_id):
            return f"{path} does not hold candidate {int(candidate)} ({config_id}) of {runs_path}"
    return ""


def summarize_selection(runs, plan, axes: list, task: str):
    """(summary, selection): one summary row per candidate (private), and what the mechanism releases: the
    best candidate's configuration, hyperparameters and score (the best mean over its seeds, as a grid's
    best configuration), with the public accounting. Nothing in `selection` depends on how many
    candidates were drawn or on any other candidate (Papernot & Steinke's theorems cover the best one alone)."""
    selection = {"selection": "random_stopping", "stopping": plan.record.stopping, "epsilon": plan.epsilon_spent,
                 "delta": plan.delta, "noise_multiplier": plan.noise_multiplier, "accountant": plan.accountant,
                 "analysis": plan.record.selection_accountant or "rdp", "covered": plan.method.covers}
    if runs is None or not len(runs):
        return pd.DataFrame(), {**selection, "chosen": None}
    summary = candidate_summary(runs, axes, task)
    chosen = summary[summary.best]
    released = None
    if len(chosen):
        row = chosen.iloc[0]
        released = {"config_id": row.config_id, **{a: float(row[a]) for a in axes}, "score": float(row["mean"])}
    return summary, {**selection, "chosen": released}


def candidate_summary(runs, axes: list, task: str) -> pd.DataFrame:
    """summarize() per candidate (a configuration drawn twice is two candidates), with its index."""
    labelled = runs.assign(config_id=[f"{int(c)}:{i}" for c, i in zip(runs.candidate, runs.config_id)])
    summary = summarize(labelled, axes, task)
    split = summary.config_id.str.split(":", n=1)
    summary.insert(0, "candidate", split.str[0].astype(int))
    summary["config_id"] = split.str[1]
    return summary


def selection_release(folder, runs, plan: dict, axes: list, task: str) -> dict:
    """What selection.json releases (the chosen configuration and its score), recomputed from its candidates' rows;
    nothing that depends on how many candidates were drawn or on another candidate. DpgridError when it does not
    match them (an edited file)."""
    from dpgrid.results.files import read_json
    from dpgrid.results.runs import REPAIR, same

    chosen = read_json(folder / "selection.json", REPAIR).get("chosen")
    summary = candidate_summary(runs, axes, task)
    best = summary[summary.best]
    found = None if not len(best) else (best.iloc[0].config_id, float(best.iloc[0]["mean"]))
    if (chosen is None) != (found is None) or (found and (chosen.get("config_id") != found[0]
                                                          or not same(float(chosen.get("score")), found[1]))):
        raise DpgridError(f"{folder / 'selection.json'} does not release what its candidates' rows select (edited); "
                          f"{REPAIR}")
    if not chosen:
        return {"chosen": None, "value": None, "std": None, "n_seeds": None}
    return {"chosen": chosen, "value": chosen["score"], "std": None,
            "n_seeds": int(best.iloc[0].n_seeds - best.iloc[0].n_diverged)}  # the chosen candidate's own
