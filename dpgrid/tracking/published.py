"""What a tracker may log: what dpgrid publishes, and only that. Every value a tracker receives is made here, from the
compiled plan, a committed run's row and curve, the released statement and an audit's record, each read through a
list of the fields it may show; a tracker never sees a row, a file of the run directory or the data.

Published means covered by the grid's epsilon or public by construction (docs/usage.md, "Published and private"):
the configuration and the privacy plan (public constants, and N); each run's validations, measured on the public
test set, and its noisy adaptive threshold and rate; its best and final values; its time; the released model and
its statement; an audit's bound and verdict. Never a value computed from the private training data without noise:
no training loss, no count, no digest or size of a data file (plan.json's and model.json's `data_files`), whatever
the files hold. A selection (random stopping, tuning on a subsample) publishes its release only: its runs, their
number included, stay private, so its grid logs no run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

# the plan's figures a grid logs: its configuration and its privacy plan (dpgrid.privacy.Plan.to_dict's keys)
PLAN_FIELDS = ("dataset", "strategy", "k", "n_configs", "n_train", "batch_size", "epochs", "steps", "sample_rate",
               "epsilon", "delta", "seeds", "account_seeds", "composed_runs", "noise_multiplier", "budget", "sampling",
               "accountant", "epsilon_spent", "epsilon_grid", "epsilon_per_run", "epsilon_with_seeds", "selection",
               "selection_accountant", "private", "model_parameters")
# a committed run's row (dpgrid.runner.run_row): what it ended with (on the test set, or privatised), and its time
RUN_FIELDS = ("best_value", "report_value", "best_step", "final_clip", "final_lr", "steps", "seconds", "eval_seconds")
CURVE_KEYS = ("config_id", "seed", "step")  # a validation's identity; every other column of curves.csv is a value
# what names a data file's content: never logged, whichever record carries it
DATA_FINGERPRINT = "data_files"


@dataclass(frozen=True)
class Grid:
    """A grid as a tracker shows it: its directory and config hash (what finds its run again on a resume), its name
    under the outputs, and its configuration and privacy plan."""
    folder: str                 # the run directory, absolute
    name: str                   # e.g. digits/online/eps3/k7
    config_hash: str
    params: dict                # name -> number, string or bool
    covers: str                 # what its epsilon covers, in words ('' for a non-private grid)
    runs_published: bool        # a composition grid's runs are published; a selection's are not
    metric: str                 # accuracy or mse


@dataclass(frozen=True)
class Run:
    """One committed run (configuration x seed): its configuration, every validation and what it ended with."""
    config_id: str
    seed: int
    params: dict                # config_id, its hyperparameters, seed
    curve: tuple                # (step, {name: value}) per validation: value, test_loss, clip, lr, a strategy's own
    values: dict                # RUN_FIELDS that are numbers
    diverged: bool


@dataclass(frozen=True)
class Release:
    """What the grid released: its statement's figures, and model/ where it carries nothing of the data."""
    values: dict                # epsilon, delta, score, each seed's test value
    params: dict                # the released configuration, default seed, metric
    covers: str                 # why the epsilon covers it
    folder: Path = None         # model/ (None: withheld, `withheld` says why)
    withheld: str = ""


@dataclass(frozen=True)
class Audit:
    """`dpgrid audit`'s measured lower bound beside the claim, and the mechanism test's verdict."""
    values: dict
    params: dict
    verdict: str = ""           # the mechanism test's (white box), '' where it did not run


@dataclass(frozen=True)
class Sweep:
    folder: str                 # hydra.sweep.dir, absolute
    overrides: str              # the sweep's command-line overrides, as typed
    grids: int = 0


@dataclass
class Logged:
    """What a backend holds of a grid already (a resumed grid's): the runs logged whole."""
    runs: set = field(default_factory=set)  # (config_id, seed)


def grid_of(spec, folder: Path, root: Path, runs_published: bool) -> Grid:
    """The grid of `spec` in `folder`; `runs_published`: its procedure publishes its runs (a composition's)."""
    plan = spec.plan
    found = plan.to_dict()
    params = {key: found[key] for key in PLAN_FIELDS if plain(found.get(key))}
    params.update({key: value for key, value in plan.per_query.items() if plain(value)})
    params.update({f"stopping.{key}": value for key, value in (found.get("stopping") or {}).items() if plain(value)})
    params.update(model=spec.model.target, protocol=spec.protocol, eval_every=spec.train.eval_every,
                  momentum=spec.train.momentum, secure_rng=spec.train.secure_rng, config_hash=spec.config_hash,
                  axes=",".join(plan.axes))
    from dpgrid.data import tasks

    private = plan.private and plan.epsilon_spent is not None
    return Grid(folder=str(folder), name=name_under(folder, root), config_hash=spec.config_hash, params=params,
                covers=plan.method.covers if private else "", metric=tasks.get(spec.dataset.task).metric,
                runs_published=runs_published)


def run_of(row: dict, curve: list, axes, metric: str) -> Run:
    """A committed run from its row (runs.csv's) and its validations (curves.csv's rows, or the run's result), named
    as a tracker shows them: test_<metric> (the value), test_loss, clip, lr and a strategy's own; best_test_<metric>."""
    params = {"config_id": row["config_id"], **{a: row[a] for a in axes if plain(row.get(a))}, "seed": int(row["seed"])}
    # report_value (data.validation=test_half): the report half's score at the step the selection half chose
    names = {"value": f"test_{metric}", "best_value": f"best_test_{metric}", "report_value": f"report_test_{metric}"}
    values = {names.get(key, key): float(row[key]) for key in RUN_FIELDS if number(row.get(key))}
    points = tuple((int(point["step"]), {names.get(key, key): float(value) for key, value in point.items()
                                          if key not in CURVE_KEYS and number(value)}) for point in curve)
    return Run(str(row["config_id"]), int(row["seed"]), params, points, values, truthy(row.get("diverged")))


def best_of(summary) -> dict:
    """The best configuration's id, and its mean and std over seeds (summary.csv's best row, which a composition
    publishes: the report half's under data.validation=test_half); {} where none is best."""
    if summary is None or not len(summary) or "best" not in summary or not summary.best.astype(bool).any():
        return {}
    row = summary[summary.best.astype(bool)].iloc[0]
    halves = "report_mean" in row  # data.validation=test_half: the report half's score, which chose nothing
    return {"config_id": str(row.config_id), **{f"best.{key}": float(row[f"report_{key}" if halves else key])
                                                for key in ("mean", "std")
                                                if number(row.get(f"report_{key}" if halves else key))}}


def release_of(statement: Path) -> Release | None:
    """The release whose statement is `statement` (a run directory's model/model.json), or None where the grid
    released nothing."""
    if not Path(statement).is_file():
        return None
    folder, record = Path(statement).parent, json.loads(Path(statement).read_text())
    covered = record.get("covered_by") or {}
    values = {f"release.{key}": float(covered[key]) for key in ("epsilon", "delta") if number(covered.get(key))}
    score = (record.get("score") or {}).get("value")
    if number(score):
        values["release.score"] = float(score)
    for model in record.get("models") or []:
        if number(model.get("test_value")):
            values[f"release.test_value.seed{int(model['seed'])}"] = float(model["test_value"])
    configuration = record.get("configuration") or {}
    params = {f"release.{key}": value for key, value in configuration.items() if plain(value)}
    params.update({"release.default_seed": record.get("default_seed"), "release.metric": record.get("metric"),
                   "release.seeds": len(record.get("models") or [])})
    carried = fingerprints(record) + [path.name for path in weight_files(record, folder)
                                      if fingerprints(metadata(path))]
    withheld = (f"model/ not logged: {', '.join(carried)} carr{'ies' if len(carried) == 1 else 'y'} the data files' "
                "fingerprint (data_files), which is not published" if carried else "")
    return Release(values=values, params={k: v for k, v in params.items() if plain(v)},
                   covers=str(record.get("why") or ""), folder=None if carried else Path(folder), withheld=withheld)


def audit_of(record: dict) -> Audit:
    """An audit's published figures (audit.json): the bound, the claim, the f-DP estimate, the verdict."""
    values = {key: float(record[key]) for key in ("epsilon_lower_bound", "epsilon_claimed", "delta", "confidence")
              if number(record.get(key))}
    fdp = (record.get("epsilon_fdp") or {}).get("epsilon_lower_bound")
    if number(fdp):
        values["epsilon_fdp"] = float(fdp)
    params = {"canaries": record.get("canaries"), "threat_model": record.get("threat_model")}
    verdict = str((record.get("mechanism") or {}).get("verdict") or "")
    return Audit({f"audit.{k}": v for k, v in values.items()},
                 {f"audit.{k}": v for k, v in params.items() if plain(v)}, verdict)


def fingerprints(record, where: str = "model.json") -> list:
    """Where a statement (or a weights file's metadata) carries a data fingerprint: a non-empty `data_files`."""
    found = []
    if isinstance(record, dict):
        for key, value in record.items():
            if key == DATA_FINGERPRINT and value:
                found.append(where)
            else:
                found += fingerprints(value, where)
    elif isinstance(record, list):
        for value in record:
            found += fingerprints(value, where)
    return sorted(set(found))


def weight_files(record: dict, folder: Path) -> list:
    return [Path(folder) / model["file"] for model in record.get("models") or [] if model.get("file")]


def metadata(path: Path) -> dict:
    """A released weights file's dpgrid metadata (what a fine-tuned grid reads of it)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return json.loads((f.metadata() or {}).get("dpgrid") or "{}")
    except (OSError, ValueError):
        return {}


def name_under(folder: Path, root: Path) -> str:
    """The grid's name: its path under the outputs' root, else under the current directory, else its whole path."""
    folder = Path(folder).absolute()
    for base in (Path(root).absolute(), Path.cwd()):
        if folder.is_relative_to(base) and folder != base:
            return folder.relative_to(base).as_posix()
    return folder.as_posix().lstrip("/")


def plain(value) -> bool:
    """A value a tracker shows as a parameter: a finite number, a bool or a non-empty string."""
    if isinstance(value, bool) or (isinstance(value, str) and value):
        return True
    return number(value)


def number(value) -> bool:
    try:
        return not isinstance(value, (bool, str)) and value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def truthy(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0")
