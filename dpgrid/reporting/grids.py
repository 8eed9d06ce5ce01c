"""The grids under a results tree, each read and vouched for: every figure a table, figure or results.csv publishes
comes from the rows of runs.csv whose config hash matches plan.json (or is recomputed from them), or the grid is
skipped in one line naming the file and the field. No torch: CSVs and JSON only (an older runs.csv without its
epsilon_with_seeds column has it recomputed with the accountant, which loads it).

`collect(results_dir)` -> one row per grid (its best configuration, or a selection's released one) and the lines
of the grids skipped."""

import json
import math
from pathlib import Path

import pandas as pd

from dpgrid import DpgridError
from dpgrid.data import tasks
from dpgrid.config.grid import ID_PREFIX, edges
from dpgrid.privacy import NOT_DP_SAMPLING, recorded_method
from dpgrid.reporting.study import study_events
from dpgrid.results.procedure import procedure_of
from dpgrid.results.files import read_json
from dpgrid.results.runs import REPAIR, read_runs, same, summarize
from dpgrid.results.seal import check as check_sealed
from dpgrid.reporting.cells import SETTINGS
from dpgrid.reporting.releases import release_of

DIVERGED, NOT_DP = "all seeds diverged", "not DP (sampling=shuffle)"
NOTHING_SELECTED, SELECTION = "no candidate drawn or converged", "selection"  # random-stopping grids' budget
TWINS = "two grids for this cell, skipped (table them from separate results directories)"
PLAN_KEYS = ("dataset", "strategy", "k", "epsilon", "n_configs", "configurations")  # what a grid's table needs
# every column a table reads from runs.csv (config_hash too, wherever plan.json records one)
RUN_COLUMNS = ("dataset", "strategy", "metric", "epsilon", "k", "config_id", "seed", "noise_multiplier", "budget",
               "accountant", "epsilon_spent", "epsilon_grid", "sampling", "protocol", "steps", "best_value", "diverged")
PRIVACY_FIGURES = ("noise_multiplier", "epsilon_spent", "epsilon_grid", "budget", "sampling", "accountant")
COLUMNS = ["dataset", "strategy", "k", "epsilon", "delta", "weak_delta", "budget", "selection", "protocol", "epochs",
           "batch_size", "steps", "eval_every", "model", "start", "validation", "n_train", "epsilon_spent", "epsilon_grid",
           "epsilon_with_seeds", "released", "epsilon_released", "accountant", "sampling", "metric", "lr", "clip", "quantile",
           "config_id", "value", "std", "n_seeds", "status", "edge", "noise_multiplier", "n_configs", "configs_run",
           "runs_done", "runs_planned", "label", "private", "axes", "adapts", "dataset_epsilons", "config_hash",
           "study_events", "path"]


def grid_folders(results_dir: Path, out: Path = None) -> list:
    """Every folder under results_dir that holds a grid (plan.json or runs.csv), the tables' folder excepted."""
    found = {p.parent for name in ("plan.json", "runs.csv") for p in results_dir.rglob(name)}
    skip = [Path(out).absolute()] if out is not None else []
    return sorted(f for f in found if "tables" not in f.relative_to(results_dir).parts
                  and not any(f.absolute() == s or s in f.absolute().parents for s in skip))


def recorded(folder: Path, runs: pd.DataFrame, plan: dict, key: str, combine=None):
    """The one value runs.csv records for `key` (None where no row does; `combine` folds several into one),
    refused unless plan.json records the same."""
    values = set(runs[key].dropna()) if key in runs else set()
    if combine and values:
        values = {combine(values)}
    if len(values) > 1:
        raise DpgridError(f"{folder / 'runs.csv'} holds several {key} values ({sorted(values, key=str)}); one grid "
                          "has one")
    value = values.pop() if values else None
    if not same(value, plan.get(key)):
        raise DpgridError(f"plan.json says {key} = {plan.get(key)} but runs.csv says {value}; the results "
                          "were not made with this plan (remove the wrong file, or run the grid again)")
    return value


def grid_row(folder: Path) -> dict:
    """One grid's best configuration, with the privacy figures its runs record (checked against plan.json)."""
    plan = read_json(folder / "plan.json", REPAIR)
    missing = [key for key in PLAN_KEYS if key not in plan]
    if missing:
        raise DpgridError(f"{folder / 'plan.json'} lacks {', '.join(missing)}; {REPAIR}")
    if not (folder / "runs.csv").exists():  # planned, its first run still training (or stopped before it ended)
        raise DpgridError(f"{folder} holds no finished run yet")
    check_sealed(folder)  # runs.csv, curves.csv and summary.csv as the grid wrote them (dpgrid.results.seal)
    runs = vouched_runs(folder, plan)
    private = bool(recorded(folder, runs, plan, "private")) if "private" in runs else bool(plan.get("private", True))
    for key in ("dataset", "strategy", "k", "config_hash") + (("epsilon",) if private else ()):
        if key in runs:  # the grid's identity (a non-private grid's runs depend on no epsilon)
            recorded(folder, runs, plan, key)
    procedure = procedure_of(recorded_method(plan))  # what the grid's procedure says of its rows and its release
    figures = procedure.table_runs(folder, runs, plan)
    noise_per_run = isinstance(plan.get("noise_multiplier"), float) and math.isnan(plan["noise_multiplier"])
    # noise schedules: each run spends its own epsilon, the grid the largest
    privacy = {key: recorded(folder, figures, plan, key, max if noise_per_run and key == "epsilon_spent" else None)
               for key in PRIVACY_FIGURES}
    axes = plan["axes"] if "axes" in plan else [a for a in plan.get("configurations", [{}])[0] if a != "config_id"]
    check_axes(folder, runs, plan, axes)
    metric = runs.metric.iloc[0]
    trained = {**training_settings(folder, runs, plan, private, noise_per_run), **variant(folder, plan),
               "validation": "test_half" if "report_value" in runs else "test"}  # test_half: scored on the report half
    summary = summarize(runs, axes, tasks.get(metric).name)
    planned = len(plan.get("grid_only") or plan["configurations"]) * int(plan.get("seeds", 1))
    protocols = set(runs.protocol.dropna().astype(str))
    row = dict(dataset=plan["dataset"], strategy=plan["strategy"], k=plan["k"], epsilon=plan["epsilon"],
               metric=metric, **privacy, n_configs=plan["n_configs"], configs_run=len(summary), path=str(folder),
               runs_done=len(runs), runs_planned=planned, protocol=",".join(sorted(protocols)),
               label=plan.get("label") or plan["strategy"], private=private, **trained,
               selection=plan.get("selection", "composition"), config_hash=plan.get("config_hash"),
               axes=",".join(axes), adapts=",".join(plan.get("adapts", [])),
               dataset_epsilons=",".join(f"{e:g}" for e in plan.get("dataset_epsilons", [])),
               epsilon_with_seeds=epsilon_with_seeds(folder, plan, runs, privacy, procedure, noise_per_run),
               study_events=study_events(plan, privacy, procedure, noise_per_run), **release_of(folder, plan))
    released = procedure.table_release(folder, runs, plan, axes, tasks.get(metric).name)
    if released is not None:  # a selection: only what it releases
        return released_row(row, released, plan, axes)
    best = summary[summary.best]
    # shuffled batches, or a private strategy whose runs claim no epsilon (a schedule that reads the data)
    if privacy["sampling"] == NOT_DP_SAMPLING or (row["private"] and privacy["epsilon_spent"] is None):
        row.update(status=NOT_DP, value=math.nan, std=math.nan)
    elif len(best):
        b = best.iloc[0]
        halves = "report_mean" in b  # the report half's score, which chose nothing
        row.update({a: b[a] for a in axes}, config_id=b.config_id, value=b["report_mean" if halves else "mean"],
                   std=b["report_std" if halves else "std"], n_seeds=int(b.n_seeds - b.n_diverged), status="ok",
                   edge="; ".join(edges({a: b[a] for a in axes}, plan["configurations"], axes)))
    else:
        row.update(status=DIVERGED, value=math.nan, std=math.nan)
    return row


def training_settings(folder: Path, runs: pd.DataFrame, plan: dict, private: bool, noise_per_run: bool) -> dict:
    """What a table says of how the grid was trained (SETTINGS) and its delta, each checked against the rows where they
    record it (rows of an older dpgrid lack epochs, batch_size and eval_every: plan.json's, then config.yaml's), and
    whether delta is weak (not below 1/N)."""
    def checked(key, fallback=None):
        if key in runs:
            return recorded(folder, runs, plan, key)
        return plan.get(key, fallback)

    eval_every = plan.get("eval_every")
    if eval_every is None and (folder / "config.yaml").exists():  # plan.json before it recorded it
        from omegaconf import OmegaConf

        eval_every = OmegaConf.select(OmegaConf.load(folder / "config.yaml"), "train.eval_every")
    settings = dict(delta=checked("delta") if private else None, n_train=checked("n_train"), epochs=checked("epochs"),
                    batch_size=checked("batch_size"), eval_every=checked("eval_every", eval_every),
                    # a noise schedule's runs each stop where their own budget ends
                    steps=plan.get("steps") if noise_per_run else checked("steps"))
    n = settings["n_train"]
    settings["weak_delta"] = bool(settings["delta"] is not None and n and settings["delta"] >= 1 / float(n))
    return settings


def variant(folder: Path, plan: dict) -> dict:
    """What the grid trained beyond its cell: its model (config.yaml's, by its callable's name and arguments where
    they differ from the callable's own) and its start (plan.json's: a checkpoint by its checksum and privacy, the
    part that trains, LoRA), each in words a table's key column and caption show."""
    model = "?"
    if (folder / "config.yaml").exists():
        from omegaconf import OmegaConf

        from dpgrid.specs import MODEL_KEYS

        node = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml")).get("model") or {}
        own = {k: v for k, v in node.items() if k not in MODEL_KEYS and k != "_target_"}
        model = str(node.get("_target_", "?")).rsplit(".", 1)[-1] + (
            "(" + ", ".join(f"{k}={v}" for k, v in sorted(own.items())) + ")" if own else "")
    start = plan.get("start") or {}
    parts = []
    if start.get("init"):
        init = start["init"]
        provenance = init.get("provenance") or {}
        parts.append(f"from {str(init.get('sha256'))[:8]}" + (f" (private, {provenance.get('dataset')})"
                                                              if provenance.get("private") else ""))
    if start.get("lora"):
        parts.append(f"LoRA r={start['lora'].get('rank')} on {','.join(start['lora'].get('targets', []))}")
    if start.get("trainable"):
        parts.append(f"trains {','.join(start['trainable'])}")
    return {"model": model, "start": "; ".join(parts) or "from scratch"}


def vouched_runs(folder: Path, plan: dict) -> pd.DataFrame:
    """runs.csv, checked as `dpgrid run` checks it (whole lines, numbers, this grid's configurations and hash), with
    every column a table reads and every value in its metric's range."""
    path = folder / "runs.csv"
    text = path.read_text(errors="replace")
    if not text.strip():
        raise DpgridError(f"damaged file {path} (empty); fix or delete it, then run the grid's command again")
    header = text.partition("\n")[0].split(",")
    needed = RUN_COLUMNS + (("config_hash",) if plan.get("config_hash") else ())
    absent = [c for c in needed if c not in header]
    if absent:
        raise DpgridError(f"{path} has no {', '.join(absent)} column (damaged or edited): its rows cannot be vouched "
                          "for; restore it, or run the grid again in another directory")
    ids = [c.get("config_id") for c in plan["configurations"]] if isinstance(plan["configurations"], list) else []
    runs = read_runs(path, ids, plan.get("config_hash"), repair="fix or delete that line, then run the grid's command again")
    if not len(runs):
        raise DpgridError(f"{path} holds no finished run yet")
    task = tasks.get(str(runs.metric.iloc[0]))
    low, high = task.valid
    values = runs.best_value[~runs.diverged.astype(bool)].astype(float)
    outside = values[(values < low) | (values > high)]
    if len(outside):
        raise DpgridError(f"{path}, line {int(outside.index[0]) + 2}: best_value = {outside.iloc[0]:g} is outside "
                          f"{task.metric}'s range {low:g}..{high:g} (edited or damaged); fix or delete that line")
    return runs


def check_axes(folder: Path, runs: pd.DataFrame, plan: dict, axes: list) -> None:
    """The axes plan.json names are its configurations' keys and the rows' hyperparameter columns, with the values of
    their configurations; what it says the strategy adapts is what the rows record (final_clip, final_lr); its count
    of configurations is theirs."""
    by_id = {c.get("config_id"): c for c in plan["configurations"]}
    keys = {k for c in plan["configurations"] for k in c if k != "config_id"}
    columns = {k for k in ID_PREFIX if k in runs} | (keys & set(runs.columns))
    if set(axes) != keys or not columns <= set(axes):
        raise DpgridError(f"plan.json names the axes {', '.join(axes) or 'none'} but its configurations and "
                          f"{folder / 'runs.csv'} have {', '.join(sorted(keys | columns)) or 'none'} (edited); the results "
                          "were not made with this plan")
    if "adapts" in plan and set(plan["adapts"]) != {a for a in ("clip", "lr") if f"final_{a}" in runs}:
        raise DpgridError(f"plan.json says the strategy adapts {', '.join(plan['adapts']) or 'nothing'} but "
                          f"{folder / 'runs.csv'} records otherwise (edited); the results were not made with this plan")
    if plan.get("n_configs") != len(plan["configurations"]):
        raise DpgridError(f"plan.json says n_configs = {plan.get('n_configs')} but lists {len(plan['configurations'])} "
                          "configurations (edited); the results were not made with this plan")
    for axis in axes:
        if axis not in runs:
            raise DpgridError(f"plan.json names the axis {axis} but {folder / 'runs.csv'} has no {axis} column; the "
                              "results were not made with this plan")
        for config_id, value in zip(runs.config_id, runs[axis].astype(float)):
            if not math.isclose(value, float(by_id[config_id].get(axis, math.nan)), rel_tol=1e-9):
                raise DpgridError(f"{folder / 'runs.csv'}: configuration {config_id} has {axis} = {value:g}, plan.json "
                                  f"{by_id[config_id].get(axis)}; the results were not made with this plan")


def epsilon_with_seeds(folder: Path, plan: dict, runs: pd.DataFrame, privacy: dict, procedure, noise_per_run: bool):
    """The epsilon of what a table of this grid publishes (means over seeds): K x seeds runs with its nu. From the
    rows (checked against plan.json); rows of an older dpgrid that lack it: recomputed from the figures they vouch
    for. None where no epsilon is claimed."""
    if privacy["epsilon_spent"] is None:
        return None
    keys = [key for key in ("phase", "candidate") if key in runs] + ["config_id"]
    most = int(runs.groupby(keys).size().max())
    if most > int(plan.get("seeds", 1)):
        raise DpgridError(f"{folder / 'runs.csv'} holds {most} seeds of a configuration but plan.json was written for "
                          f"{plan.get('seeds')}, so its epsilon_with_seeds would understate what a table publishes")
    if "epsilon_with_seeds" in runs:
        return recorded(folder, runs, plan, "epsilon_with_seeds")
    if procedure.releases_best_only:  # the selection's epsilon covers its candidates' seeds
        return privacy["epsilon_spent"]
    if noise_per_run or "epsilon_with_seeds" not in plan:
        raise DpgridError(f"{folder / 'runs.csv'} does not record epsilon_with_seeds (made by an older dpgrid); run the "
                          "grid again in another directory to table it")
    from dpgrid.privacy.accountants import epsilon_of

    steps = int(recorded(folder, runs, plan, "steps"))
    value = epsilon_of(privacy["accountant"], plan["batch_size"] / plan["n_train"], privacy["noise_multiplier"],
                       int(plan["n_configs"]) * int(plan["seeds"]) * steps, float(recorded(folder, runs, plan, "delta")))
    if not math.isclose(value, float(plan["epsilon_with_seeds"]), rel_tol=1e-6):
        raise DpgridError(f"plan.json says epsilon_with_seeds = {plan['epsilon_with_seeds']} but its runs spend {value:.6g}; "
                          "the results were not made with this plan")
    return value


def released_row(row: dict, released: dict, plan: dict, axes: list) -> dict:
    """A selection's cell: only what it releases (`released`: the chosen configuration, its score, std and seeds, as
    its accounting method recomputed them from the rows); nothing that depends on how many candidates there were."""
    row.update(budget=SELECTION, std=math.nan, configs_run=math.nan, runs_done=math.nan, runs_planned=math.nan)
    chosen = released["chosen"]
    if not chosen or released["value"] is None:
        return {**row, "status": NOTHING_SELECTED if not chosen else DIVERGED, "value": math.nan}
    std = released["std"] if released["std"] is not None else math.nan
    return {**row, **{a: chosen[a] for a in axes}, "config_id": chosen["config_id"], "value": released["value"],
            "std": std, "n_seeds": released["n_seeds"], "status": "ok",
            "edge": "; ".join(edges({a: chosen[a] for a in axes}, plan["configurations"], axes))}


CELL = ["dataset", "k", "strategy", "epsilon", "budget"]  # what places a grid in a table (with its SETTINGS)


def collect(results_dir: Path, out: Path = None) -> tuple:
    """(one row per readable grid under results_dir, [one line per grid skipped and why]). Two private grids for one
    cell (dataset, k, strategy, epsilon, budget) stand on separate rows when they were trained differently (SETTINGS:
    the tables then show a column for what differs) and are both skipped, naming both, when nothing a table shows
    tells them apart."""
    rows, skipped = [], []
    for folder in grid_folders(Path(results_dir), out):
        try:
            rows.append(grid_row(folder))
        except DpgridError as e:
            skipped.append(f"skipped the grid in {folder}: {e}")
    grids = pd.DataFrame(rows)
    if len(grids):
        private = grids[grids.private.astype(bool)]
        keys = CELL + list(SETTINGS)
        twins = private[private.assign(epsilon=private.epsilon.astype(float)).astype({s: str for s in SETTINGS})
                        .duplicated(keys, keep=False)]
        for _, pair in twins.astype({s: str for s in SETTINGS}).groupby(keys, dropna=False):
            differ = [c for c in ("accountant", "sampling", "epsilon_spent", "noise_multiplier", "n_configs", "metric")
                      if pair[c].astype(str).nunique() > 1]
            skipped.append(f"skipped the grids in {' and '.join(pair.path)}: two grids for one cell ({pair.strategy.iloc[0]} "
                           f"ε={pair.epsilon.iloc[0]:g}, k={pair.k.iloc[0]}) that differ in "
                           f"{', '.join(differ) or 'nothing a table shows'}; table them from separate results directories")
        # each pair stays in one row that says why its cell is empty (a footnote of the table, a row of results.csv)
        first = twins.groupby(keys, dropna=False, sort=False).head(1).index
        grids.loc[first, ["status", "value", "std"]] = [TWINS, math.nan, math.nan]
        grids = grids.drop(index=twins.index.difference(first))
    axes = sorted({a for r in rows for a in str(r.get("axes", "")).split(",") if a and a not in COLUMNS})
    return grids.reindex(columns=COLUMNS + axes), skipped  # a strategy's own axes (e.g. sigma) too
