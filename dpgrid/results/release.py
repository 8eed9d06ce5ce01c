"""The model a grid releases (train.save_models), written once every run of the grid has finished.

Each finished run's final weights are kept in weights/<config_id>_seed<s>.safetensors before its row is committed
(private, like runs.csv: a run that did not finish has none). Once every run of the grid has finished, the runs it
releases are copied to model/ beside model.json, the statement of what covers them (dpgrid.results.statement):

- a composition grid releases its best configuration: the final weights of each of its seeds. Choosing it read
  every seed's score of every configuration, so its release is covered by the epsilon of all K x seeds runs
  (epsilon_with_seeds; epsilon itself when the seeds are accounted);
- a random-stopping selection releases its chosen candidate's seeds, covered by the selection's epsilon
  (Papernot & Steinke, Liu & Talwar: the best candidate's output, here its trained models, with its score).
  Nothing in model/ names the candidate's index or depends on the other candidates: seed j of the candidate is
  model/seed<j>.

Then weights/ is deleted (train.save_models=released), or kept as the private log of every run's model (all);
none keeps nothing. A release in a run directory that is not sound is refused before the grid trains again
(`check_release`; a secure grid's ledger judges its own).
"""

import hashlib
import json
import shutil
import warnings
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.results.files import delete_release, environment, write_atomic, write_json
from dpgrid.results.procedure import procedure_of
from dpgrid.results.statement import MODEL, STATEMENT, release_problem, repair_hint, sealed, statement

WEIGHTS = "weights"


def weights_file(out: Path, config_id: str, seed: int) -> Path:
    return Path(out) / WEIGHTS / f"{config_id}_seed{seed}.safetensors"


PRIVATE_WEIGHTS = ("a run's final weights, a private working file of its grid (weights/): not released, and no "
                   "epsilon covers it alone; the grid's release (model/) is what its epsilon covers")


def keep_weights(out: Path, config_id: str, seed: int, state: dict, dataset: str) -> None:
    """A finished run's final weights (a state dict of tensors), written whole or not at all, with a statement that no
    epsilon covers them: a model fine-tuned from such a file composes no epsilon on `dataset`'s examples (it is never
    taken for public)."""
    from safetensors.torch import save

    from dpgrid.privacy.provenance import account

    path = weights_file(out, config_id, seed)
    with environment(path.parent):
        path.parent.mkdir(exist_ok=True)
    said = {"covered_by": None, "why": PRIVATE_WEIGHTS, "dataset": dataset, "accounts": [account(dataset, None, None)]}
    write_atomic(path, save({name: t.detach().to("cpu").contiguous() for name, t in state.items()},
                            metadata={"dpgrid": json.dumps(said)}))


def final_weights(model) -> dict:
    """A copy of a model's final weights (its adapters merged: the base architecture's), or None when one is not
    finite (a diverged run keeps no model)."""
    import torch

    from dpgrid.models.finetuning import merged_state

    state = {name: t.detach().to("cpu").clone() for name, t in merged_state(model).items()}
    return state if all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point()) else None


def chosen_runs(spec, runs, summary) -> tuple:
    """(the configuration released, [(its run's seed, its index j among the configuration's seeds)], why it is
    covered), or (None, [], '') when nothing is released (every run diverged, or no candidate)."""
    plan = spec.plan
    best = summary[summary.best] if len(summary) else summary
    if not len(best):
        return None, [], ""
    row = best.iloc[0]
    configuration = {"config_id": row.config_id, **{a: float(row[a]) for a in plan.axes}}
    seeds, why = procedure_of(plan.method).release_reason(plan, row, runs)
    return configuration, seeds, why


def release_when_finished(out: Path, spec, runs, summary, work: list, plan_record: dict) -> str:
    """The released model, once every run of the grid has finished (dpgrid.results.models); a line saying what
    was written or why nothing was."""
    if runs is None or not len(runs):
        return ""
    from dpgrid.results.curves import read_curves
    from dpgrid.results.runs import run_ids

    everything = procedure_of(spec.plan.method).every_run(spec.plan, work)
    left = len(everything - set(run_ids(runs)))
    if left:
        return ("" if spec.train.save_models == "none" else
                f"model: released once every run of the grid has finished ({left} of {len(everything)} runs left, "
                "grid.only); their final weights are kept in weights/ meanwhile")
    if spec.train.save_models == "none":  # a split grid's earlier parts may have kept weights: none keeps none
        with environment(out / WEIGHTS):
            shutil.rmtree(out / WEIGHTS, ignore_errors=True)
        return ""
    return release(out, spec, runs, summary, read_curves(out / "curves.csv")[0], plan_record)


def release(out: Path, spec, runs, summary, curves, plan_record: dict) -> str:
    """Write model/ (the released runs' weights and model.json, sealed) once every run of the grid has finished;
    remove weights/ unless train.save_models=all. Returns a line for the console ('' when nothing is said).
    Idempotent: a finished grid run again keeps the release it made, checked (a damaged one is refused before)."""
    out = Path(out)
    if spec.train.save_models == "none":
        return ""
    configuration, seeds, why = chosen_runs(spec, runs, summary)
    if configuration is None:
        return ""
    target = out / MODEL
    record, problem = release_problem(out) if target.exists() else (None, "none")
    if problem or not same_release(record, spec, configuration, seeds):
        missing = [s for s, _ in seeds if not weights_file(out, configuration["config_id"], s).exists()]
        if missing:
            return (f"model: not released: the final weights of {configuration['config_id']}'s runs were not kept "
                    "(train.save_models=none when they ran, or weights/ was removed)")
        record = write_release(out, spec, runs, curves, plan_record, configuration, seeds, why)
    if spec.train.save_models == "released":
        with environment(out / WEIGHTS):
            shutil.rmtree(out / WEIGHTS, ignore_errors=True)
    epsilon = (f"covered by epsilon = {record['covered_by']['epsilon']:.4g}, delta = {record['covered_by']['delta']:g}"
               if record["covered_by"] else record["why"])
    return f"model: {target} ({configuration['config_id']}, {len(seeds)} seed(s); {epsilon}; model.json says why)"


def same_release(record, spec, configuration: dict, seeds: list) -> bool:
    """Whether a sound model/ is this grid's release of this configuration and these seeds (a finished grid run
    again)."""
    return (record is not None and record.get("config_hash") == spec.config_hash
            and record.get("configuration") == json.loads(json.dumps(configuration))
            and [m.get("seed") for m in record.get("models", [])] == [j for _, j in seeds])


def write_release(out: Path, spec, runs, curves, plan_record: dict, configuration: dict, seeds: list, why: str) -> dict:
    """model/: the released runs' weights and model.json, made in a folder beside it and swapped in whole."""
    from safetensors.torch import load, save

    new, old = out / f".{MODEL}.new", out / f".{MODEL}.old"
    for folder in (new, old):
        with environment(folder):
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(exist_ok=True)
    with environment(new):
        new.mkdir()
    record = statement(spec, plan_record, configuration, why)
    halves = spec.validation == "test_half"  # the selection half chooses, the report half's values are reported
    last = last_values(curves, configuration["config_id"], "report_value" if halves else "value")
    chose = last_values(curves, configuration["config_id"]) if halves else last
    entries = []
    for seed, j in seeds:
        tensors = load(weights_file(out, configuration["config_id"], seed).read_bytes())
        content = save(tensors, metadata={"dpgrid": json.dumps({
            "covered_by": record["covered_by"], "why": record["why"], "configuration": configuration, "seed": j,
            # what a grid fine-tuned from this file composes with its own (dpgrid.models.finetuning.checkpoint_provenance)
            "dataset": record["dataset"], "events": record["events"], "accounts": record["accounts"],
            "config_hash": record["config_hash"],
            "privacy": {"accountant": (record.get("privacy") or {}).get("accountant")}})})
        name = f"seed{j}.safetensors"
        write_atomic(new / name, content)
        entries.append({"seed": j, "file": name, "sha256": hashlib.sha256(content).hexdigest(),
                        "test_value": last.get(seed), **({"selection_value": chose.get(seed)} if halves else {})})
    metric = runs.metric.iloc[0]
    released = runs[runs.config_id == configuration["config_id"]]
    released = released[released.seed.astype(int).isin([s for s, _ in seeds])]
    released = released["report_value" if halves else "best_value"].astype(float)
    what = ("the mean over the released seeds of each run's value on the report half of the test set, at the "
            "validation the selection half chose; each model's test_value is its final weights' on the report half "
            "(the default seed was chosen on the selection half: selection_value)" if halves else
            "the mean over the released seeds of each run's best value over its validations (what chose the "
            "configuration); each model's test_value is its final weights' (the last validation), which may be lower")
    record.update(metric=metric, models=entries, default_seed=best_seed(entries, metric, "selection_value" if halves
                                                                        else "test_value"),
                  score={"value": float(released.mean()) if len(released) else None, "what": what})
    selection = out / "selection.json"
    record = sealed(record, selection.read_bytes() if procedure_of(spec.plan.method).releases_best_only and
                    selection.exists() else None)
    write_json(new / STATEMENT, record)
    target = out / MODEL
    with environment(target):
        if target.exists():
            target.rename(old)
        new.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    return record


def last_values(curves, config_id: str, column: str = "value") -> dict:
    """Each run's last validation value (the test value of its final weights), by seed; `column`: report_value for the
    report half of data.validation=test_half."""
    if curves is None or not len(curves) or column not in curves:
        return {}
    mine = curves[curves.config_id == config_id].sort_values("step")
    return {int(seed): float(g[column].iloc[-1]) for seed, g in mine.groupby("seed")}


def best_seed(entries: list, metric: str, chosen_by: str = "test_value"):
    """The seed whose final model scores best on the (public) test set, or its selection half (`chosen_by`): a choice
    among released models."""
    from dpgrid.data import tasks

    scored = [e for e in entries if e.get(chosen_by) is not None]
    if not scored:
        return entries[0]["seed"] if entries else None
    sign = 1 if tasks.get(metric).higher_is_better else -1
    return max(scored, key=lambda e: (sign * e[chosen_by], -e["seed"]))["seed"]


def check_release(out: Path, spec, plan: dict) -> None:
    """Before a grid trains: refuse a release in `out` that is not sound or not this grid's (`plan`: the plan.json it
    writes), naming what to do (repair_hint), or with overwrite=true delete it and train the grid anew. A secure
    grid's ledger judges its release (dpgrid.results.ledger)."""
    from dpgrid.results import ledger

    out = Path(out)
    if not (out / MODEL).exists() or ledger.kept(spec):
        return
    record, problem = release_problem(out, plan=plan)
    if not problem:
        return
    if not spec.overwrite:
        raise DpgridError(f"{problem}; {repair_hint(record)}")
    warnings.warn(f"overwrite=true: {problem}; the grid's results are deleted and it trains anew", stacklevel=2)
    delete_release(out)
