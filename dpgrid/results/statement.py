"""A released model's statement (model/model.json): what covers it, how it was trained and chosen, and its seal.

The statement binds the release together: the grid's plan (plan.json's figures of the grid, not of one command),
each weights file's SHA-256, and a seal, a digest over the statement and the selection.json it was released with.
`release_problem` checks all of it, and what loads, exports or trains beside a release asks it first: a statement
edited after its release, one sealed with another grid's plan (a model/ moved in from elsewhere), a weights file
changed or gone is refused in one line naming the file. The seal detects edits, damage and swaps; it is not a
signature: whoever rewrites a statement and recomputes every digest can forge one (an audit checks a claim from
outside).
"""

import hashlib
import json
from pathlib import Path

from dpgrid import DpgridError, __version__
from dpgrid.results.files import environment, read_json

MODEL, STATEMENT = "model", "model.json"

SEEDED = ("seeded: every batch and noise draw follows from public names, so this epsilon holds only against an "
          "adversary who does not know them; not for real data (privacy.secure_rng=true is)")
SEEDED_NON_PRIVATE = "seeded: every batch follows from public names (reproducible); no epsilon is claimed"
SECURE = "secure: batches and noise from the operating system's secure generator (privacy.secure_rng=true)"
PER_COMMAND = ("grid_only", "parallel_runs")  # plan.json keys one command of a grid sets, not the grid (its release)
CHOSEN_BY = ("the released configuration is the one with the best score, and the default seed the released seed "
             "whose final model scores best, both on the test set, which dpgrid treats as public (it is not "
             "accounted); the values this statement reports are measured on that same test set, so they are "
             "optimistic: report a held-out score beside them (data.validation=test_half measures them apart)")
CHOSEN_ON_HALF = ("the released configuration is the one with the best score, and the default seed the released seed "
                  "whose final model scores best, both on the selection half of the test set (data.validation="
                  "test_half: a fixed, stratified half, which dpgrid treats as public, as the whole test set); the "
                  "values this statement reports (score, each model's test_value) are measured on the other half, "
                  "the report half, which chose nothing: unbiased, on half as many examples")


def statement(spec, plan_record: dict, configuration: dict, chosen_by: str) -> dict:
    """What a release is covered by, in the plan's own figures, with how it was trained and chosen; `plan_record`: the
    plan.json this command wrote (the release binds the grid's part of it, less the data's fingerprint: nothing
    released is computed from the training data but through the noised training)."""
    from dpgrid.privacy.provenance import account, release_cover

    plan, method = spec.plan, spec.plan.method
    private = plan.private and plan.epsilon_spent is not None
    cover = release_cover(spec)
    covered, events, checkpoint, accounts = cover.covered, cover.events, cover.checkpoint, cover.accounts
    provenance = spec.start.init_provenance
    if checkpoint is not None:
        chosen_by += (f"; it was fine-tuned from a private checkpoint ({checkpoint['checkpoint']['source']}): "
                      + (f"{checkpoint['why']}, so both grids together are what covers it, by "
                         f"{checkpoint['composed_by']}" if not checkpoint["declared_disjoint"] else
                         f"{checkpoint['why']}: this epsilon covers {plan.dataset}'s examples, the checkpoint's "
                         f"covers {provenance.dataset}'s, their composition anyone in both"))
    randomness = SECURE if spec.train.secure_rng else SEEDED if plan.private else SEEDED_NON_PRIVATE
    from dpgrid.data import tasks

    disclosure = tasks.get(spec.dataset.task).disclosure  # what of the private data the task's own figures show
    if private and disclosure:
        covered, events, chosen_by = None, None, f"no epsilon covers this model or its scores: the task's figures are {disclosure}"
    if covered is None:  # what a model fine-tuned from it composes with: no epsilon, on this grid's data
        accounts = [account(plan.dataset, None, None)]
    return {
        "covered_by": covered,
        "accounts": accounts,
        "why": chosen_by if private else ("non-private: no clipping, no noise, no epsilon" if not plan.private else
                                          f"no epsilon covers it: {plan.sampling}"),
        "events": events,
        **({"checkpoint": checkpoint} if checkpoint is not None else {}),
        "covers": method.covers if private else None,
        "privacy": {"epsilon_target": plan.epsilon if plan.private else None, "epsilon_spent": plan.epsilon_spent,
                    "epsilon_with_seeds": plan.epsilon_with_seeds, "delta": plan.delta if plan.private else None,
                    "noise_multiplier": plan.noise_multiplier, "per_query": {**plan.per_query, **plan.problem},
                    "accountant": plan.accountant, "budget": plan.budget, "selection": plan.selection,
                    "method": method.name,
                    "analysis": plan.to_dict()["selection_accountant"], "seeds_accounted": plan.account_seeds,
                    "seeds": plan.seeds, "sampling": plan.sampling, "adjacency": method.adjacency.to_dict(),
                    "weak_delta": bool(plan.delta >= 1 / plan.n_train)} if plan.private else None,
        "randomness": randomness,
        "training": {"n_train": plan.n_train, "batch_size": plan.batch_size, "sample_rate": plan.sample_rate,
                     "steps": plan.steps, "epochs": plan.epochs, "sampling": plan.sampling,
                     "eval_every": spec.train.eval_every, "protocol": spec.protocol, "momentum": spec.train.momentum},
        "chosen_by": CHOSEN_ON_HALF if spec.validation == "test_half" else CHOSEN_BY,
        "strategy": plan.strategy, "dataset": plan.dataset, "n_train": plan.n_train,
        "inputs": {"normalize": spec.dataset.normalize,
                   **({"mean": spec.dataset.mean, "std": spec.dataset.std}
                      if spec.dataset.normalize == "standardize" else {})},
        "configuration": configuration,
        "model": dict(spec.settings["model"]),
        "architecture": architecture(spec),
        "split": split(spec),
        **({"start": spec.start.to_dict()} if not spec.start.is_default else {}),
        "config_hash": spec.config_hash, "dpgrid": __version__,
        "plan": grid_plan(plan_record),
    }


def architecture(spec) -> dict:
    """What loads the released weights without dpgrid: the module as PyTorch prints it (its layers, their sizes) and
    each tensor's name and shape, of the base architecture (adapters merged)."""
    from dpgrid.models import build_model

    model = build_model(spec.model)
    return {"module": str(model), "tensors": {name: list(t.shape) for name, t in model.state_dict().items()}}


def split(spec) -> dict:
    """Which examples the released score was measured on: the dataset's loader, its arguments and what its
    docstring says of the split (the test split is treated as public)."""
    from dpgrid.plugins import resolve

    target = spec.dataset.load
    loader = resolve(target, "dataset.load")
    doc = " ".join((loader.__doc__ or "").split("\n\n")[0].split())
    return {"loader": target.target, "arguments": json.loads(json.dumps(dict(target.arguments), default=str)),
            "test": doc, "inputs": spec.dataset.normalize,
            **({"validation": "test_half: dpgrid.data.test_halves(data, dataset name) splits the test split into a "
                              "selection half (chooses) and a report half (reports), fixed, stratified by class, "
                              "seeded by the dataset's name"} if spec.validation == "test_half" else {})}


def grid_plan(plan_record: dict) -> dict:
    """plan.json's figures of the grid (not those one command of it sets), as JSON reads them back, without the data's
    fingerprint (private: plan.json keeps it to refuse other data on a resume)."""
    return without_fingerprint(json.loads(json.dumps({k: v for k, v in plan_record.items() if k not in PER_COMMAND})))


FINGERPRINT = "data_files"  # plan.json's, and the statements of earlier dpgrid releases: each training file's SHA-256


def without_fingerprint(value):
    """`value` (JSON data) with every FINGERPRINT key removed, at any depth."""
    if isinstance(value, dict):
        return {k: without_fingerprint(v) for k, v in value.items() if k != FINGERPRINT}
    if isinstance(value, list):
        return [without_fingerprint(v) for v in value]
    return value


def holds_fingerprint(value) -> bool:
    """Whether JSON data hold a non-empty FINGERPRINT anywhere (a release an earlier dpgrid made)."""
    if isinstance(value, dict):
        return bool(value.get(FINGERPRINT)) or any(holds_fingerprint(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_fingerprint(v) for v in value)
    return False


FINGERPRINTED = ("its metadata holds a fingerprint of the training data (each training file's SHA-256, written by an "
                 "earlier dpgrid), which no epsilon covers: do not publish it as it is")


def sealed(record: dict, selection: bytes = None) -> dict:
    """The statement with its seal: a digest over the statement itself (the weights' checksums and the grid's plan
    among it) and selection.json's bytes, where the grid released one."""
    record = {k: v for k, v in record.items() if k != "seal"}
    return {**record, "seal": seal_of(record, selection)}


def seal_of(record: dict, selection: bytes = None) -> dict:
    body = json.dumps({k: v for k, v in record.items() if k != "seal"}, sort_keys=True, separators=(",", ":"))
    return {"statement": hashlib.sha256(body.encode()).hexdigest(),
            "selection_json": hashlib.sha256(selection).hexdigest() if selection is not None else None}


STATEMENT_KEYS = {"covered_by": (dict, type(None)), "why": str, "randomness": str, "configuration": dict,
                  "model": dict, "models": list, "plan": dict, "seal": dict, "metric": str, "dataset": str,
                  "strategy": str}


def release_problem(run_dir, plan: dict = None) -> tuple:
    """(model.json as read, or None; what is wrong with the release in run_dir/model, '' when nothing): a statement
    that is damaged, not a statement, edited since it was sealed or not sealed at all, a release of another grid
    than plan.json's (a model/ moved in from elsewhere), a weights file missing or changed, selection.json changed.
    `plan`: the plan.json a grid about to run writes, compared instead of the file (which it repairs where damaged);
    selection.json is then not asked for (it writes it again from its rows)."""
    run_dir = Path(run_dir)
    folder = run_dir / MODEL
    path = folder / STATEMENT
    try:
        record = read_json(path, "")
    except DpgridError as e:
        return None, str(e).rstrip("; ")
    wrong = [k for k, kind in STATEMENT_KEYS.items() if not isinstance(record.get(k), kind)]
    entries = record.get("models") if isinstance(record.get("models"), list) else []
    if not wrong and not all(isinstance(e, dict) and isinstance(e.get("seed"), int) and isinstance(e.get("sha256"), str)
                             and isinstance(e.get("file"), str) and Path(e["file"]).name == e["file"]
                             and isinstance(e.get("test_value"), (int, float, type(None))) for e in entries):
        wrong = ["models"]
    if wrong:
        return None, f"{path} is not a model statement dpgrid wrote ({wrong[0]} is missing or of the wrong kind)"
    selection = run_dir / "selection.json"
    sealed_with = record["seal"].get("selection_json")
    if record["seal"].get("statement") != seal_of(record)["statement"]:
        return record, f"{path} was edited after the release (it does not match its seal)"
    if sealed_with is not None and plan is None:
        if not selection.exists():
            return record, f"{selection}, which the release in {folder} is sealed with, is missing"
        if seal_of(record, selection.read_bytes())["selection_json"] != sealed_with:
            return record, f"{selection} was edited after the release (it does not match the seal in {path})"
    if plan is None:
        try:
            plan = read_json(run_dir / "plan.json", "")
        except DpgridError:
            plan = {}
    plan, released = grid_plan(plan), without_fingerprint(record["plan"])
    # the keys the release was sealed with: a later dpgrid may record more in plan.json
    if {key: plan[key] for key in released if key in plan} != released:  # JSON's one NaN equals itself
        return record, (f"{folder} is not the release of the grid in {run_dir}: its statement was sealed with "
                        "another plan.json (a model/ from another grid, or plan.json was edited)")
    covered = record["covered_by"]
    planned = plan["release_covered_by"] if "release_covered_by" in plan else (
        {"epsilon": plan.get("epsilon_with_seeds"), "delta": plan.get("delta")} if plan.get("private", True) else None)
    if covered is not None and (planned is None or covered.get("epsilon") != planned.get("epsilon")
                                or covered.get("delta") != planned.get("delta")):
        return record, f"{path} states an epsilon or delta its plan does not"
    for entry in entries:
        file = folder / entry["file"]
        if not file.is_file():
            return record, f"{file} is missing"
        with environment(file):
            content = file.read_bytes()
        if hashlib.sha256(content).hexdigest() != entry["sha256"]:
            return record, f"{file} does not match the checksum model.json records (changed or damaged)"
    return record, ""


def repair_hint(record) -> str:
    """What to do about a release that is not sound: a seeded grid makes the same one again, a secure one cannot
    without spending epsilon again."""
    if record is not None and str(record.get("randomness", "")).startswith("secure"):
        return ("restore model/ (and selection.json) from a copy: this secure grid cannot release again without "
                "spending a new epsilon (overwrite=true starts such a new release)")
    return ("restore it from a copy, or run the grid's command with overwrite=true: a seeded grid trains the same runs "
            "again, on the same machine and software the same model (elsewhere, or where a per-sample form is timed "
            "afresh, within float rounding), under the same epsilon")
