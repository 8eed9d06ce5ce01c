"""Tuning on a subsample's files (dpgrid.privacy.subsample_tuning is its accounting): the tuning set X1
(tuning_set.json, private), the tuning phase's summary and the configuration it chose, selection.json (what the
procedure releases), and how a table reads the grid back, vouched for by its rows."""

import json

import pandas as pd

from dpgrid import DpgridError
from dpgrid.results.files import read_frame, read_json, write_json
from dpgrid.results.runs import REPAIR, same, summarize
from dpgrid.results.procedure import Phase, configuration_lines, other_analyses, seed_names
from dpgrid.results.selection import RandomStoppingProcedure, candidate_summary

TUNING_SET = "tuning_set.json"


def header(out) -> list:
    """runs.csv's columns ([] when it holds none)."""
    path = out / "runs.csv"
    return path.read_text().partition("\n")[0].split(",") if path.exists() else []


def tuning_set(out, spec, n_train: int):
    """X1 as a boolean mask over the training set: read from tuning_set.json, or drawn (each example with
    probability q1; 53 random bits each, seeded or secure) and written there. A seeded grid's file must hold its own
    draw (drawn again and compared); a secure grid's, the draw its ledger recorded (dpgrid.results.ledger)."""
    import torch

    rate, path = spec.plan.record.tuning["rate"], out / TUNING_SET
    if path.exists():
        try:
            recorded = json.loads(path.read_text())
            members = recorded["members"]
            if recorded["n_train"] != n_train or recorded["rate"] != rate or not all(
                    isinstance(i, int) and 0 <= i < n_train for i in members):
                raise ValueError
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
            raise DpgridError(f"{path} is damaged or not this grid's tuning set (N = {n_train}, "
                              f"privacy.selection.tuning_rate={rate:g}); restore it, or pass overwrite=true to start a new tuning "
                              "(it spends a new epsilon)") from None
        mask = torch.zeros(n_train, dtype=torch.bool)
        mask[members] = True
        if not spec.train.secure_rng and not torch.equal(mask, drawn_tuning_set(spec, n_train, rate)):
            raise DpgridError(f"{path} is not the tuning set this seeded grid draws (edited or replaced): its runs would "
                              "train on other examples than the analysis assumes; restore it, or delete it with runs.csv "
                              "and curves.csv to train the tuning again (seeded: the same runs)")
        return mask
    mask = drawn_tuning_set(spec, n_train, rate)
    write_json(path, {"rate": rate, "n_train": n_train, "search": spec.plan.record.tuning["search"],
                      "members": mask.nonzero().flatten().tolist()})
    return mask


def drawn_tuning_set(spec, n_train: int, rate: float):
    """A fresh draw of X1: each example with probability exactly q1 (53 random bits each, more on a tie), seeded from
    the grid's names or from the operating system's secure generator."""
    import numpy as np
    import torch

    from dpgrid.privacy.randomness import SecureRandom, coins_from_uniform, derive_seed

    if spec.train.secure_rng:
        source = SecureRandom()
        bits = torch.from_numpy((source.uint64(n_train) >> np.uint64(11)).astype(np.int64))
    else:
        source = torch.Generator().manual_seed(derive_seed(*seed_names(spec), "tuning_set"))
        bits = torch.randint(0, 2 ** 53, (n_train,), generator=source, dtype=torch.int64)
    return coins_from_uniform(bits, 53, rate, source)  # each example in with probability exactly q1


def tuning_summary(runs, search: str, axes: list, task: str):
    """summary.csv: the tuning phase per candidate (random stopping) or per configuration, the chosen one best."""
    tuning = None if runs is None or "phase" not in runs else runs[runs.phase == "tuning"]
    if tuning is None or not len(tuning):
        return pd.DataFrame()
    return candidate_summary(tuning, axes, task) if search == "random_stopping" else summarize(tuning, axes, task)


def chosen_configuration(out, spec, to_train: list, draw):
    """The configuration the tuning phase chose (its rows in runs.csv), or None."""
    runs = read_frame(out / "runs.csv") if (out / "runs.csv").exists() else None
    if runs is not None and draw is not None and "draw" in runs:
        runs = runs[runs.draw.astype(str) == draw]
    summary = tuning_summary(runs, spec.plan.record.tuning["search"], spec.plan.axes, spec.dataset.task)
    if not len(summary) or not summary.best.any():
        return None
    chosen = summary[summary.best].iloc[0].config_id
    return next(c for c in to_train if c["config_id"] == chosen)


def release_record(plan, summary, final) -> dict:
    """selection.json: the chosen configuration and its tuning score, the final model's score over its seeds, and
    the public accounting; nothing that depends on how many candidates were drawn or on another candidate."""
    tuning = plan.record.tuning
    record = {"selection": "subsample_tuning", "tuning_rate": tuning["rate"], "search": tuning["search"],
              "final_data": tuning["final_data"], "stopping": plan.record.stopping, "epsilon": plan.epsilon_spent,
              "delta": plan.delta, "noise_multiplier": {"tuning": tuning["tuning"]["noise_multiplier"],
                                                        "final": tuning["final"]["noise_multiplier"]},
              "accountant": plan.accountant, "analysis": plan.record.selection_accountant, "covered": plan.method.covers,
              "neighbouring": plan.method.adjacency.words, "chosen": None, "final": None}
    if not len(summary) or not summary.best.any():
        return record
    row = summary[summary.best].iloc[0]
    record["chosen"] = {"config_id": row.config_id, **{a: float(row[a]) for a in plan.axes},
                        "tuning_score": float(row["mean"])}
    record["final"] = final_score(final)
    return record


def final_score(final):
    """The final model's score over its seeds (None before its runs): under data.validation=test_half, the report
    half's (its best step chosen on the other half), as every reported score."""
    if final is not None and len(final):
        column = "report_value" if "report_value" in final else "best_value"
        ok = final[~final.diverged.astype(bool)][column].astype(float)
        return {"score": float(ok.mean()) if len(ok) else None,
                "std": float(ok.std(ddof=0)) if len(ok) else None,
                "seeds": int(len(ok)), "diverged": int(len(final) - len(ok))}
    return None


def tuned_runs(folder, runs, plan: dict):
    """The rows as a table reads its privacy figures: each phase's noise checked against plan.json's, then the
    final phase's (the procedure's one noise multiplier)."""
    for phase in ("tuning", "final"):
        expected = plan["tuning"][phase]["noise_multiplier"]
        found = set(runs.noise_multiplier[runs.phase == phase].astype(float)) if "phase" in runs else {None}
        if found and found != {expected}:
            raise DpgridError(f"plan.json says the {phase} phase's noise_multiplier = {expected} but runs.csv says "
                              f"{sorted(found, key=str)}; the results were not made with this plan")
    return runs.assign(noise_multiplier=plan["noise_multiplier"])


def tuning_release(folder, runs, plan: dict, axes: list, task: str) -> dict:
    """What selection.json releases (the chosen configuration, the final model's score over its seeds), recomputed
    from the rows; DpgridError when it does not match them (an edited file)."""
    released = read_json(folder / "selection.json", REPAIR)
    chosen, final = released.get("chosen"), released.get("final")
    summary = tuning_summary(runs, plan["tuning"]["search"], axes, task)
    best = summary[summary.best] if len(summary) else summary
    found = None if not len(best) else best.iloc[0].config_id
    mine = runs[(runs.phase == "final") & (runs.config_id == found)] if found else runs.iloc[0:0]
    score = final_score(mine)
    same_score = (score is None) == (final is None) and (score is None or same(score["score"], final["score"]))
    if (chosen or {}).get("config_id") != found or not same_score:
        raise DpgridError(f"{folder / 'selection.json'} does not release what its rows select and train (edited); "
                          f"{REPAIR}")
    scored = chosen and score and score["score"] is not None
    return {"chosen": chosen, "value": score["score"] if scored else None, "std": score["std"] if scored else None,
            "n_seeds": score["seeds"] if scored else None, "seeds": mine.seed.astype(int).tolist()}


class SubsampleTuningProcedure(RandomStoppingProcedure):
    """Tuning on a subsample (dpgrid.privacy.subsample_tuning is its accounting): the candidates train on the tuning
    set X1 (phase=tuning; random stopping's draw, or every configuration), then the chosen configuration's seeds on
    the full data or on X \\ X1 (phase=final); the final model is released with the chosen hyperparameters."""

    def phases(self, out, spec, to_train: list, data):
        plan, tuning = spec.plan, spec.plan.record.tuning
        members = tuning_set(out, spec, data.n_train)
        random_stopping = tuning["search"] == "random_stopping"
        if random_stopping:
            runs, draw = self.candidate_runs(out, spec, to_train)
        else:
            runs, draw = [(c, s) for c in to_train for s in range(plan.seeds)], None
        first = tuning["tuning"]
        yield Phase(runs, draw, train_rows=members.nonzero().flatten(), noise_multiplier=first["noise_multiplier"],
                    per_query=first["per_query"], batch_size=first["batch_size"],
                    n_train=plan.n_train * tuning["rate"], fields={"phase": "tuning"})
        chosen = chosen_configuration(out, spec, to_train, draw)
        if chosen is None:  # no candidate drawn, or none converged: nothing to carry over
            return
        base = 1 + max(seed for _, seed in runs)  # the final runs' seeds follow the candidates'
        final, full = tuning["final"], tuning["final_data"] == "full"
        yield Phase([(chosen, base + s) for s in range(plan.seeds)], draw,
                    train_rows=None if full else (~members).nonzero().flatten(),
                    noise_multiplier=final["noise_multiplier"], per_query=dict(plan.per_query),
                    batch_size=final["batch_size"], n_train=plan.n_train * (1 if full else 1 - tuning["rate"]),
                    fields={"phase": "final", **({"candidate": -1} if random_stopping else {})},
                    streams=("final", base))  # its seeds follow the candidates', its noise does not

    def batch_sizes(self, plan) -> tuple:
        tuning = plan.record.tuning
        return (tuning["tuning"]["batch_size"], tuning["final"]["batch_size"])

    def run_fields(self, plan, seed: int, draw) -> dict:
        return dict(candidate=seed // plan.seeds, draw=draw) if plan.record.tuning["search"] == "random_stopping" else {}

    def summarize(self, out, runs, plan, task: str):
        from dpgrid.results.files import write_json

        summary = tuning_summary(runs, plan.record.tuning["search"], plan.axes, task)
        final = None if runs is None or "phase" not in runs else runs[runs.phase == "final"]
        released = release_record(plan, summary, final)
        write_json(out / "selection.json", released)
        return summary, released

    def release_reason(self, plan, summary_row, runs):
        ok = ~runs.diverged.astype(bool)
        mine = runs[(runs.phase == "final") & (runs.config_id == summary_row.config_id) & ok]
        seeds = [(int(s), int(s) % plan.seeds) for s in sorted(mine.seed)]
        why = ("the final model of a tuning on a subsample: the configuration chosen on the tuning set, trained on "
               f"{'the full data' if plan.record.tuning['final_data'] == 'full' else 'the data outside the tuning set'}; "
               f"covered by the procedure's epsilon ({plan.record.selection_accountant} analysis), which covers {plan.method.covers}")
        return seeds, why

    def table_runs(self, folder, runs, plan: dict):
        return tuned_runs(folder, runs, plan)

    def table_release(self, folder, runs, plan: dict, axes: list, task: str):
        return tuning_release(folder, runs, plan, axes, task)

    def expected_runs(self, plan, runs: int) -> float:
        # the candidates' runs cost q1 of a full one each (their batches are q1 B)
        return plan.record.tuning["tuning"]["expected_runs"] * plan.record.tuning["rate"] + plan.record.tuning["final"]["runs"]

    def describe(self, plan) -> list:
        t = plan.record.tuning
        tuning, final = t["tuning"], t["final"]
        stop = plan.record.stopping
        search = (f"random stopping, {stop['rule']}, {stop['mean']:g} candidates expected" if stop else
                  f"every one of the {plan.n_configs} configurations")
        where = "the full data" if t["final_data"] == "full" else "the examples outside the tuning set"
        split = ("one noise multiplier for both phases (privacy.selection.tuning_split=shared)" if t["split"] == "shared" else
                 f"the tuning phase alone spends {t['split']:g} x epsilon (privacy.selection.tuning_split)")
        others = other_analyses(plan)
        return [f"  tuning on a subsample: each example joins the tuning set with probability q1 = {t['rate']:g} "
                f"(about {t['rate'] * plan.n_train:,.0f} of {plan.n_train:,})",
                f"  budget (eps, delta) = ({plan.epsilon:g}, {plan.delta:g}) for the whole procedure; it covers "
                f"{plan.method.covers}",
                f"  {split}; eps spent = {plan.epsilon_spent:.5g} ({plan.record.selection_accountant} analysis"
                + (f"; the same noise spends {others}" if others else "") + ")",
                f"    tuning phase: {search}, each trained {plan.seeds} times on the tuning set: nu_1 = "
                f"{tuning['noise_multiplier']:.5g}, T = {tuning['steps']:,} steps, expected batch q1 B = "
                f"{tuning['batch_size']:.4g}; alone it spends eps = {tuning['epsilon']:.5g}",
                f"    final phase: the chosen configuration's clip and lr carried over, {final['runs']} runs on {where}: "
                f"nu_2 = {final['noise_multiplier']:.5g}, T = {final['steps']:,} steps, expected batch "
                f"{final['batch_size']:.4g}; alone it spends eps = {final['epsilon']:.5g}",
                f"  expected compute: {t['relative_compute']:.2f} x the same search on the full data "
                f"({tuning['expected_runs']:g} tuning runs of q1 B examples a step, then {final['runs']} full runs)"
                ] + configuration_lines(plan)

    def unreleased_draw(self, out, committed: int) -> str:
        if not committed:
            return ""
        if not (out / TUNING_SET).exists():
            return f"{out / TUNING_SET} is missing but this secure grid trained {committed} run(s)"
        return super().unreleased_draw(out, committed) if "candidate" in header(out) else ""
