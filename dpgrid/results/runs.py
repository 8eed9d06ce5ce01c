"""A grid's run directory: who may write it, what is already done, and each finished run's commit.

runs.csv is the commit record (one row per finished run, rewritten whole by write-then-rename);
curves.csv is appended and fsynced before its run's commit, so on resume its rows of unfinished runs
are dropped. Damage is named in one line, with whether the same command repairs it.
"""

import csv
import io
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from dpgrid import DpgridError
from dpgrid.data import tasks
from dpgrid.results.curves import read_curves, whole_curve
from dpgrid.results.files import environment, read_frame, read_rows, write_atomic, write_csv, write_json

RERUN = "fix or delete that line; the same command then trains that run again"
# columns that must hold numbers (may be empty where a run has none, e.g. best_value of a diverged run)
NUMERIC = ("epsilon", "delta", "k", "candidate", "seed", "steps", "best_value", "best_step", "lr", "clip", "quantile",
           "final_clip", "final_lr", "epsilon_spent", "epsilon_grid", "epsilon_with_seeds", "momentum", "seconds",
           "eval_seconds", "count_noise_std", "epochs", "batch_size", "n_train", "eval_every")
OPTIONAL = ("best_value", "final_clip", "final_lr", "epsilon_spent", "epsilon_grid", "noise_multiplier", "epsilon_zcdp",
            "epsilon_rdp", "epsilon_with_seeds", "epsilon", "delta")  # the last three: none for a non-private grid


class Lost(DpgridError):
    """A secure grid's committed runs are not all there (dpgrid.results.ledger)."""


def runs_disagree(runs_path: Path, plan, seeds_beyond_plan: bool = False) -> str:
    """Why runs.csv cannot come from `plan` ('' when it can): its noise, steps or configurations differ
    (`seeds_beyond_plan`: its procedure's runs have seeds past train.seeds)."""
    try:
        runs = read_runs(runs_path, [c["config_id"] for c in plan.configurations])
    except DpgridError as e:
        return str(e)
    if len(runs) == 0:
        return ""
    checked = [("epsilon", plan.epsilon)] * plan.private + [("strategy", plan.strategy), ("dataset", plan.dataset)] + (
        [] if plan.noise_per_run else [("noise_multiplier", plan.noise_multiplier), ("steps", plan.steps)])
    for column, value in checked:
        found = set(runs[column]) if column in runs else {None}
        if found != {value}:
            return f"its {column} is {', '.join(map(str, sorted(found, key=str)))}, this plan's {value}"
    if not seeds_beyond_plan and runs.seed.max() >= plan.seeds:
        return f"it holds seed {runs.seed.max()}, this plan's train.seeds is {plan.seeds}"
    return ""


def read_runs(path: Path, config_ids, digest: str = None, repair: str = RERUN) -> pd.DataFrame:
    """runs.csv, checked row by row: whole lines, numbers where numbers belong, finite values, configurations
    of this grid made by this config (`digest`, where rows record it), no (configuration, seed) twice.
    DpgridError naming the file, the line and the field otherwise."""
    header, rows, frame = read_rows(path, repair)
    ids = set(config_ids)
    seen = {}
    for line, row in enumerate(rows, start=2):
        record = dict(zip(header, row))
        if record.get("config_id") not in ids:
            raise DpgridError(f"{path}, line {line}: configuration {record.get('config_id')!r} is not in this grid; {repair}")
        if digest and record.get("config_hash", digest) != digest:
            raise DpgridError(f"{path}, line {line}: config_hash {record['config_hash']} is not this grid's {digest} (a "
                              f"row of another config); {repair}")
        if record.get("diverged") == "False" and record.get("best_value") in ("", "inf", "-inf", "nan"):
            raise DpgridError(f"{path}, line {line}: best_value = {record['best_value']!r} for a run that did not "
                              f"diverge; {repair}")
        for column in [c for c in header if c in NUMERIC or c.startswith("noise_multiplier")]:
            value = record[column]
            if value == "" and column in OPTIONAL:
                continue
            try:
                number = float(value)
            except ValueError:
                raise DpgridError(f"{path}, line {line}: {column} = {value!r} is not a number; {repair}") from None
            if not math.isfinite(number) and column != "noise_multiplier":  # nan: a schedule's varying sigma
                raise DpgridError(f"{path}, line {line}: {column} = {value!r} is not a finite number; {repair}")
            if column == "seed" and not (number.is_integer() and number >= 0):
                raise DpgridError(f"{path}, line {line}: seed = {value!r} is not a whole number; {repair}")
        for column in ("diverged", "seeds_accounted", "private"):
            if column in record and record[column] not in ("True", "False"):
                raise DpgridError(f"{path}, line {line}: {column} = {record[column]!r} is not True or False; {repair}")
        key = (record["config_id"], int(float(record["seed"])))
        if key in seen:
            raise DpgridError(f"{path}, lines {seen[key]} and {line}: configuration {key[0]} seed {key[1]} twice; "
                              f"delete one of them (the same command keeps the other)")
        seen[key] = line
    return frame


def finished_runs(out: Path, plan, eval_every: int, digest: str = None, selected: set = None,
                  repair: bool = True) -> set:
    """(config_id, seed) of the runs already committed. Curves of unfinished runs (a killed grid) are
    dropped; a committed run whose curves are missing or damaged is taken out of runs.csv and trained again
    when its configuration is among `selected` (this command's grid.only; None: all). repair=False (a secure
    grid, whose runs trained again would be new releases): such damage is refused instead, in one line."""
    runs_path, curves_path = out / "runs.csv", out / "curves.csv"
    broken = unreadable_header(runs_path)
    if broken:
        warnings.warn(f"{runs_path} {broken} (damaged): the runs it held cannot be vouched for and are trained again")
        with environment(runs_path):
            runs_path.unlink()
    if not runs_path.exists():
        with environment(curves_path):
            curves_path.unlink(missing_ok=True)
        return set()
    runs = read_runs(runs_path, [c["config_id"] for c in plan.configurations], digest)
    run_keys = run_ids(runs)
    done = set(run_keys)
    curves, damage = read_curves(curves_path)
    curve_keys = run_ids(curves)
    recorded = curves.loc[np.array([k in done for k in curve_keys], dtype=bool)].groupby(["config_id", "seed"]).step
    every = {k: list(v) for k, v in recorded}
    complete = {k for k, diverged, steps in zip(run_keys, runs.diverged.astype(str), runs.steps.astype(int))
                if k in every and whole_curve(every[k], steps if diverged != "True" else None, eval_every)}
    lost = done - complete
    if lost and not repair:
        raise Lost(f"{curves_path} lost the curves of {len(lost)} committed run(s) of this secure grid")
    outside = {k for k in lost if selected is not None and k[0] not in selected}
    fate = (f"{len(lost)} committed run(s) lost curves and are taken out of runs.csv" +
            (f": {len(lost) - len(outside)} are trained again now, {len(outside)} lie outside grid.only and are not "
             "retrained by this command" if outside else ": they are trained again"))
    if damage:
        warnings.warn(f"{curves_path} {damage}: {fate if lost else 'no committed run lost its curves'}")
    elif lost:
        warnings.warn(f"{curves_path} lacks some curves: {fate}")
    if lost:
        write_csv(runs_path, runs.loc[np.array([k in complete for k in run_keys], dtype=bool)])
    keep = curves.loc[np.array([k in complete for k in curve_keys], dtype=bool)]
    if not len(keep):  # appended to from scratch, header first
        with environment(curves_path):
            curves_path.unlink(missing_ok=True)
    elif damage or len(keep) != len(curves) or not curves_path.exists():
        write_csv(curves_path, keep)
    return complete


def unreadable_header(path: Path) -> str:
    """What makes a runs.csv unreadable as a whole ('' when it is not): empty, not text, or a header that is
    not runs.csv's (torn or overwritten). Damage within its lines is named line by line (read_runs)."""
    if not path.exists():
        return ""
    with environment(path):
        data = path.read_bytes()
    if not data.strip():
        return "was empty"
    try:
        header = data.decode("utf-8").splitlines()[0].split(",")
    except UnicodeDecodeError:
        return "is not text"
    missing = [c for c in ("config_id", "seed", "best_value", "diverged", "steps") if c not in header]
    return f"has a damaged header (no {', '.join(missing)} column)" if missing else ""


def run_ids(frame: pd.DataFrame) -> list:
    """(config_id, seed) of every row."""
    return list(zip(frame.config_id, frame.seed.astype(int)))


def commit_run(path: Path, row: dict) -> int:
    """Add a finished run to runs.csv by write-then-rename: the file is always whole, never torn. Returns the
    number of runs it holds. A row with the file's columns is appended as its line (the rows before it are not read
    as a table: committing stays as cheap for the hundredth run as for the first); a row that brings a new column
    rewrites the table with it."""
    from dpgrid.results.seal import expect

    new = pd.DataFrame([row])
    header, _, line = new.to_csv(index=False).partition("\n")
    text = path.read_text() if path.exists() else ""
    if text.endswith("\n") and text.partition("\n")[0] == header:
        expect(path.parent, path.name, (text + line).encode())
        write_atomic(path, text + line)
        return sum(1 for _ in csv.reader(io.StringIO(text + line))) - 1
    old = read_frame(path) if text else None
    frame = new if old is None or not len(old) else pd.concat([old, new], ignore_index=True)
    content = frame.to_csv(index=False)
    expect(path.parent, path.name, content.encode())
    write_atomic(path, content)
    return len(frame)


def summarize(runs: pd.DataFrame, axes: list, task: str) -> pd.DataFrame:
    """Per configuration: mean and std (ddof=0) of the run values over converged seeds.

    The best configuration is the best mean among those with no diverged seed (falling back to
    those with some converged seed when every configuration has a diverged one)."""
    rows = []
    for config_id, g in runs.groupby("config_id", sort=False):
        converged = ~g.diverged.astype(bool)
        values = g.best_value[converged]
        report = {}
        if "report_value" in g:  # data.validation=test_half: what the report half measured, the reported score
            reported = g.report_value[converged].astype(float)
            report = dict(report_mean=reported.mean() if len(reported) else math.nan,
                          report_std=reported.std(ddof=0) if len(reported) else math.nan)
        rows.append(dict(config_id=config_id, **{a: g[a].iloc[0] for a in axes},
                         mean=values.mean() if len(values) else math.nan,
                         std=values.std(ddof=0) if len(values) else math.nan, **report,
                         n_seeds=len(g), n_diverged=int(g.diverged.astype(bool).sum())))
    summary = pd.DataFrame(rows)
    sign = -1.0 if tasks.get(task).higher_is_better else 1.0
    candidates = summary[summary["mean"].notna()]
    summary["best"] = False
    if len(candidates):
        key = candidates.assign(_any_div=candidates.n_diverged > 0, _score=sign * candidates["mean"])
        best = key.sort_values(["_any_div", "_score"], kind="stable").index[0]
        summary.loc[best, "best"] = True
    return summary


def plan_record(spec, data_files: dict) -> dict:
    """plan.json's content: the plan, the config's hash, the data's fingerprint (private: it refuses other data on a
    resume, and no release carries it) and this command's settings; a grid fine-tuned from a private checkpoint also
    what covers its release (`release_covered_by`: both composed, unless declared disjoint)."""
    from dpgrid.privacy.provenance import release_cover

    only = list(spec.only) if spec.only is not None else None  # the configurations this command trains
    start = spec.start.to_dict()  # a fine-tuning grid's start: its checkpoint (path, checksum), adapters, what trains
    cover = release_cover(spec).covered if spec.start.init else None
    return {**spec.plan.to_dict(), "config_hash": spec.config_hash, "data_files": data_files, "grid_only": only,
            "parallel_runs": spec.train.parallel_runs, "device": spec.train.device, "eval_every": spec.train.eval_every,
            **({"start": start} if start else {}), **({"release_covered_by": cover} if spec.start.init else {})}


def write_header(out: Path, spec, record: dict) -> None:
    """config.yaml and plan.json (`record`: plan_record's)."""
    write_atomic(out / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(dict(spec.settings))))
    write_json(out / "plan.json", record)


REPAIR = "run the grid's command again to rewrite it (its results are kept)"  # a table's answer to a damaged file


def same(a, b) -> bool:
    missing = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
    if missing(a) or missing(b):
        return missing(a) and missing(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-12)
    return str(a) == str(b)
