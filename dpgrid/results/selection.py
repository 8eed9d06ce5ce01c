"""Private selection by random stopping: drawing the candidates once, keeping the draw (candidates.json) so
that a resumed selection trains the same candidates, and what the selection releases (selection.json). Its
accounting is dpgrid.privacy.random_stopping's.
"""

import hashlib
import json
import warnings

import pandas as pd

from dpgrid import DpgridError
from dpgrid.results.draws import draw_candidates
from dpgrid.results.procedure import Phase, Procedure, configuration_lines, other_analyses, seed_names
from dpgrid.results.runs import summarize


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
                 "analysis": plan.record.selection_accountant or "rdp", "covered": plan.method.covers,
                 "neighbouring": plan.method.adjacency.words}
    if runs is None or not len(runs):
        return pd.DataFrame(), {**selection, "chosen": None}
    summary = candidate_summary(runs, axes, task)
    chosen = summary[summary.best]
    released = None
    if len(chosen):
        row = chosen.iloc[0]
        released = {"config_id": row.config_id, **{a: float(row[a]) for a in axes}, "score": float(row["mean"])}
        if "report_mean" in row:  # data.validation=test_half: the score chose on the selection half; reported apart
            released["report_score"] = float(row["report_mean"])
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
        return {"chosen": None, "value": None, "std": None, "n_seeds": None, "seeds": []}
    seeds = runs.seed[runs.candidate.astype(int) == int(best.iloc[0].candidate)].astype(int).tolist()
    return {"chosen": chosen, "value": chosen.get("report_score", chosen["score"]), "std": None,  # its own seeds (private)
            "n_seeds": int(best.iloc[0].n_seeds - best.iloc[0].n_diverged), "seeds": seeds}


class RandomStoppingProcedure(Procedure):
    """A random-stopping selection (dpgrid.privacy.random_stopping is its accounting): it trains the drawn candidates
    (candidate i: seeds i * seeds ... (i + 1) * seeds - 1, each a fresh run starting from seed j's weights for its
    j-th, whatever i: identically distributed, as the theorems assume) and releases the best one alone
    (selection.json, its model)."""

    releases_best_only = True
    seeds_beyond_plan = True

    def phases(self, out, spec, to_train: list, data):
        runs, draw = self.candidate_runs(out, spec, to_train)
        yield Phase(runs, draw)

    def candidate_runs(self, out, spec, to_train: list) -> tuple:
        """((configuration, seed) of every drawn candidate's runs, the draw's digest): candidate i's seeds are
        i * seeds ... (i + 1) * seeds - 1; the draw is candidates.json's, or made and kept there."""
        import torch

        from dpgrid.privacy.randomness import SecureRandom, derive_seed

        plan = spec.plan
        source = (SecureRandom() if spec.train.secure_rng
                  else torch.Generator().manual_seed(derive_seed(*seed_names(spec), "stopping")))
        drawn, draw = candidates(out, plan, to_train, source, spec.overwrite)
        return [(c, i * plan.seeds + s) for i, c in enumerate(drawn) for s in range(plan.seeds)], draw

    def every_run(self, plan, work: list) -> set:
        return {(c["config_id"], s) for c, s in work}

    def start_seed(self, seed: int, seeds: int) -> int:
        return seed % seeds

    def run_fields(self, plan, seed: int, draw) -> dict:
        return dict(candidate=seed // plan.seeds, draw=draw)

    def group_limit(self, seeds: int, size: int) -> int:
        # A group holds one candidate's runs at most: a stacked run's batch is padded to its group's largest, and its
        # rounding would otherwise depend on the other candidates (the released weights to their last bit).
        return max(d for d in range(1, seeds + 1) if seeds % d == 0 and d <= size)

    def summarize(self, out, runs, plan, task: str):
        from dpgrid.results.files import write_json

        summary, released = summarize_selection(runs, plan, plan.axes, task)
        write_json(out / "selection.json", released)
        return summary, released

    def release_reason(self, plan, summary_row, runs):
        ok = ~runs.diverged.astype(bool)
        mine = runs[(runs.candidate == int(summary_row.candidate)) & ok]
        seeds = [(int(s), int(s) % plan.seeds) for s in sorted(mine.seed)]
        why = ("the chosen candidate of a random-stopping selection, covered by the selection's epsilon "
               f"({plan.record.selection_accountant} analysis), which covers {plan.method.covers}")
        return seeds, why

    def table_release(self, folder, runs, plan: dict, axes: list, task: str):
        return selection_release(folder, runs, plan, axes, task)

    def unreleased_draw(self, out, committed: int) -> str:
        if committed and not (out / "candidates.json").exists():
            return f"{out / 'candidates.json'} is missing but this secure selection trained {committed} run(s)"
        return ""

    def expected_runs(self, plan, runs: int) -> float:
        return plan.record.stopping["mean"] * plan.seeds

    def describe(self, plan) -> list:
        stop = plan.record.stopping
        shape = {"truncated_negative_binomial": f"eta = {stop.get('eta', 0):g}, gamma = {stop.get('gamma', 0):.4g}",
                 "poisson": f"mu = {stop['mean']:g}",
                 "binomial": f"{stop.get('rounds')} rounds, p = {stop.get('p', 0):.4g}",
                 "liu_talwar": f"stop probability {stop.get('gamma', 0):.4g}, at most {stop.get('max_candidates')}"}
        others = other_analyses(plan)
        return [f"  random-stopping selection, {stop['rule']} ({shape[stop['rule']]}): {stop['mean']:g} candidates "
                f"expected, each a configuration drawn from the grid and trained {plan.seeds} times",
                f"  budget (eps, delta) = ({plan.epsilon:g}, {plan.delta:g}) for the whole selection; it covers "
                f"{plan.method.covers}",
                f"  noise multiplier nu = {plan.noise_multiplier:.5g}; eps spent = {plan.epsilon_spent:.5g}; one "
                f"candidate's eps = {plan.epsilon_per_run:.5g}",
                f"  analysis: {plan.record.selection_accountant} (privacy.selection.selection_accountant)"
                + (f"; the same nu spends eps = {others}" if others else "")] + configuration_lines(plan)
