"""Tables and figures from a results tree: `dpgrid tables [RESULTS_DIR]` -> RESULTS_DIR/tables/.

- results.csv: every grid's best configuration (long form, raw numbers).
- <dataset>_k<k>.{csv,md,tex}: the paper's layout (best hyperparameters only where the paper's own table of that dataset and k is, its Tables 2-4;
  Tables 8-13 otherwise: hyperparameters and mean ± std), rows = epsilon, a column block per strategy.
- <dataset>_k<k>_vs_paper.{csv,md}: each cell next to the paper's, the difference, and whether it lies
  within the combined std (sqrt(std_ours^2 + std_paper^2)); the .md ends with the paper's main claim tested
  per epsilon (also <dataset>_k<k>_claim.csv): online at least as good as each rival, ours and the paper's.
- figures/<dataset>_k<k>.{png,pdf}: metric against epsilon per strategy (std error bars, best non-private baseline as a
  line); figures/curves/<grid>.png: the best configuration's validation curve with C_t and rho_t.
Missing cells are "–" with the reason in a footnote, never zero.
"""

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dpgrid import DpgridError, tasks
from dpgrid.results.files import check_writable, environment, read_json, write_atomic, write_csv
from dpgrid.reporting.cells import MISSING, NOT_RUN, budget_note, fmt_hp, fmt_value, private_strategies, to_latex
from dpgrid.config.grid import AXIS_SYMBOL
from dpgrid.reproduction.paper import (claims, claims_markdown, comparison, comparison_markdown, hyperparameters_only,
                                       paper_results)
from dpgrid.privacy import NOT_DP_SAMPLING
from dpgrid.results.runs import read_runs, summarize

# Everything about a strategy (label, axes, private or not, what adapts) comes from the plan.json its
# grid wrote, which asked the strategy class and its config: nothing here lists strategies.
DIVERGED, NOT_DP = "all seeds diverged", "not DP (sampling=shuffle)"
NOTHING_SELECTED, SELECTION = "no candidate drawn or converged", "selection"  # random-stopping grids' budget
SEEDS_NOTE = ("ε seeds: what this table publishes costs more than ε, which accounts one run per configuration "
              "(privacy.account_seeds=false, as the paper); each value is the mean over seeds, and K x seeds runs with "
              "the grid's noise spend: ")
PLAN_KEYS = ("dataset", "strategy", "k", "epsilon", "n_configs", "configurations")  # what a grid's table needs
PRIVACY_FIGURES = ("noise_multiplier", "epsilon_spent", "epsilon_grid", "budget", "sampling")


def grid_folders(results_dir: Path) -> list:
    """Every folder under results_dir that holds a grid (plan.json or runs.csv), tables/ excepted."""
    found = {p.parent for name in ("plan.json", "runs.csv") for p in results_dir.rglob(name)}
    return sorted(f for f in found if "tables" not in f.relative_to(results_dir).parts)


def same(a, b) -> bool:
    missing = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
    if missing(a) or missing(b):
        return missing(a) and missing(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12)
    return str(a) == str(b)


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
    repair = "run the grid's command again to rewrite it (its results are kept)"
    plan = read_json(folder / "plan.json", repair)
    missing = [key for key in PLAN_KEYS if key not in plan]
    if missing:
        raise DpgridError(f"{folder / 'plan.json'} lacks {', '.join(missing)}; {repair}")
    if not (folder / "runs.csv").exists():  # planned, its first run still training (or stopped before it ended)
        raise DpgridError(f"{folder} holds no finished run yet")
    ids = [c.get("config_id") for c in plan["configurations"]] if isinstance(plan["configurations"], list) else []
    runs = read_runs(folder / "runs.csv", ids, plan.get("config_hash"),
                     repair="fix or delete that line, then run the grid's command again")
    if not len(runs):
        raise DpgridError(f"{folder / 'runs.csv'} holds no finished run yet")
    for key in ("dataset", "strategy", "k", "config_hash") + (("epsilon",) if plan.get("private", True) else ()):
        if key in runs:  # the grid's identity (a non-private grid's runs do not depend on epsilon)
            recorded(folder, runs, plan, key)
    schedule = plan.get("schedule")  # noise schedules: each run spends its own epsilon, the grid the largest
    privacy = {key: recorded(folder, runs, plan, key, max if schedule and key == "epsilon_spent" else None)
               for key in PRIVACY_FIGURES}
    axes = plan.get("axes") or [a for a in plan.get("configurations", [{}])[0] if a != "config_id"]
    metric = runs.metric.iloc[0]
    summary = summarize(runs, axes, tasks.get(metric).name)
    planned = len(plan.get("grid_only") or plan["configurations"]) * int(plan.get("seeds", 1))
    row = dict(dataset=plan["dataset"], strategy=plan["strategy"], k=plan["k"], epsilon=plan["epsilon"],
               metric=metric, **privacy, n_configs=plan["n_configs"], configs_run=len(summary), path=str(folder),
               runs_done=len(runs), runs_planned=planned,
               label=plan.get("label") or plan["strategy"], private=bool(plan.get("private", privacy["noise_multiplier"])),
               axes=",".join(axes), adapts=",".join(plan.get("adapts", [])),
               dataset_epsilons=",".join(f"{e:g}" for e in plan.get("dataset_epsilons", [])))
    row.update(accountant=plan.get("accountant"), epsilon_with_seeds=epsilon_with_seeds(folder, plan, runs, privacy))
    if plan.get("selection") == "random_stopping":
        return selected_row(folder, row, axes, repair)
    best = summary[summary.best]
    # shuffled batches, or a private strategy whose runs claim no epsilon (a schedule that reads the data)
    if privacy["sampling"] == NOT_DP_SAMPLING or (row["private"] and privacy["epsilon_spent"] is None):
        row.update(status=NOT_DP, value=math.nan, std=math.nan)
    elif len(best):
        b = best.iloc[0]
        row.update({a: b[a] for a in axes}, config_id=b.config_id, value=b["mean"], std=b["std"],
                   n_seeds=int(b.n_seeds - b.n_diverged), status="ok")
    else:
        row.update(status=DIVERGED, value=math.nan, std=math.nan)
    return row


def epsilon_with_seeds(folder: Path, plan: dict, runs: pd.DataFrame, privacy: dict):
    """The epsilon of what a table of this grid publishes (means over seeds): K x seeds runs with its nu, as
    plan.json records it for its seeds. None where no epsilon is claimed."""
    if privacy["epsilon_spent"] is None:
        return None
    if "epsilon_with_seeds" not in plan:
        raise DpgridError(f"{folder / 'plan.json'} does not record epsilon_with_seeds (made by an older dpgrid); run the "
                          "grid's command again to rewrite it (its results are kept)")
    most = int(runs.groupby(["candidate", "config_id"] if "candidate" in runs else "config_id").size().max())
    if most > int(plan["seeds"]):
        raise DpgridError(f"{folder / 'runs.csv'} holds {most} seeds of a configuration but plan.json was written for "
                          f"{plan['seeds']}, so its epsilon_with_seeds would understate what a table publishes; run the "
                          f"grid's command with train.seeds={most} to rewrite plan.json")
    return plan["epsilon_with_seeds"]


def selected_row(folder: Path, row: dict, axes: list, repair: str) -> dict:
    """A random-stopping selection's cell: only what selection.json releases (configuration and score);
    nothing that depends on how many candidates were drawn (configs_run) or on another candidate."""
    chosen = read_json(folder / "selection.json", repair).get("chosen")
    row.update(budget=SELECTION, std=math.nan, configs_run=math.nan, runs_done=math.nan, runs_planned=math.nan)
    if not chosen:
        return {**row, "status": NOTHING_SELECTED, "value": math.nan}
    return {**row, **{a: chosen[a] for a in axes}, "config_id": chosen["config_id"], "value": chosen["score"],
            "status": "ok"}


def collect(results_dir: Path) -> tuple:
    """(one row per readable grid under results_dir, [one line per grid skipped and why])."""
    rows, skipped = [], []
    for folder in grid_folders(Path(results_dir)):
        try:
            rows.append(grid_row(folder))
        except DpgridError as e:
            skipped.append(f"skipped the grid in {folder}: {e}")
    columns = ["dataset", "strategy", "k", "epsilon", "budget", "epsilon_spent", "epsilon_grid", "epsilon_with_seeds",
               "accountant", "sampling", "metric",
               "lr", "clip", "quantile", "config_id", "value", "std", "n_seeds", "status", "noise_multiplier",
               "n_configs", "configs_run", "runs_done", "runs_planned", "label", "private", "axes", "adapts",
               "dataset_epsilons", "path"]
    axes = sorted({a for r in rows for a in str(r.get("axes", "")).split(",") if a and a not in columns})
    return pd.DataFrame(rows).reindex(columns=columns + axes), skipped  # a strategy's own axes (e.g. sigma) too


def paper_layout(grids: pd.DataFrame, dataset: str, k: int, with_values: bool):
    """The wide table (strings) and its footnotes for one dataset and granularity. Rows are epsilon (and
    the budget mode, which a `budget` column states); per-run grids get an `ε grid` column per strategy,
    the whole grid's true cost. Grids with no DP guarantee (shuffled batches) are left out and named."""
    metric = grids.metric.dropna().iloc[0] if len(grids.metric.dropna()) else "accuracy"
    levels = [float(e) for e in str(grids.dataset_epsilons.dropna().iloc[0] if len(grids) else "").split(",") if e]
    columns = private_strategies(grids)  # a strategy with only non-DP grids still gets its (empty) columns
    not_dp = grids[grids.status == NOT_DP]
    grids = grids[grids.status != NOT_DP]
    private = grids[grids.private.astype(bool)]
    budgets = sorted(set(private.budget.dropna())) or ["per_grid"]
    rows = sorted({(e, b) for e in levels for b in budgets} | set(zip(private.epsilon.astype(float), private.budget)))
    costlier = private[private.epsilon_with_seeds.astype(float) > private.epsilon_grid.astype(float) * (1 + 1e-9)]
    notes, table = {}, pd.DataFrame({"ε": [f"{e:g}" for e, _ in rows], "budget": [b for _, b in rows]})
    for strategy, label, axes in columns:
        for index, (eps, budget) in enumerate(rows):
            cell = grids[(grids.strategy == strategy) & np.isclose(grids.epsilon, eps) & (grids.budget == budget)]
            reason = NOT_RUN if cell.empty else (None if cell.status.iloc[0] == "ok" else cell.status.iloc[0])
            if reason:
                notes.setdefault(reason, []).append(f"{label} ε={eps:g}")
            for axis in axes:
                table.loc[index, f"{label} {AXIS_SYMBOL.get(axis, axis)}"] = MISSING if reason else fmt_hp(cell[axis].iloc[0])
            if with_values:
                name = tasks.get(metric).table_name
                table.loc[index, f"{label} {name}"] = MISSING if reason else fmt_value(cell.value.iloc[0], metric)
                table.loc[index, f"{label} std"] = MISSING if reason else fmt_value(cell["std"].iloc[0], metric)
            if "per_run" in budgets:
                grid_eps = cell.epsilon_grid.iloc[0] if not cell.empty else math.nan
                table.loc[index, f"{label} ε grid"] = MISSING if pd.isna(grid_eps) else f"{grid_eps:.3g}"
            if len(costlier):
                seeds_eps = cell.epsilon_with_seeds.iloc[0] if not cell.empty else math.nan
                table.loc[index, f"{label} ε seeds"] = MISSING if pd.isna(seeds_eps) else f"{seeds_eps:.3g}"
    footnotes = [f"{MISSING}: {reason}: {', '.join(cells)}" for reason, cells in notes.items()]
    if len(costlier):
        footnotes.append(SEEDS_NOTE + ", ".join(f"{r.label} ε={r.epsilon:g}: {r.epsilon_with_seeds:.3g} ({r.accountant})"
                                                for r in costlier.itertuples()))
    incomplete = private[(private.runs_done < private.runs_planned) & (private.budget != SELECTION)]
    if len(incomplete):
        footnotes.append("incomplete grids (still training, or stopped: the same command resumes them): " + ", ".join(
            f"{r.label} ε={r.epsilon:g} ({r.runs_done:g} of {r.runs_planned:g} runs)" for r in incomplete.itertuples()))
    partial = private[(private.configs_run < private.n_configs) & (private.budget != SELECTION)
                      & ~private.index.isin(incomplete.index)]
    if len(partial):  # grid.only: the best of a subset, still with the whole grid's noise
        footnotes.append("partial grids (grid.only; best of the configurations run, whole grid's noise): " + ", ".join(
            f"{r.label} ε={r.epsilon:g} ({r.configs_run} of {r.n_configs})" for r in partial.itertuples()))
    if len(not_dp):
        footnotes.append("not shown, no DP guarantee (shuffled batches, or a schedule that reads the data): " + ", ".join(
            f"{r.label} ε={r.epsilon:g} ({r.sampling})" for r in not_dp.itertuples()))
    baseline = grids[~grids.private.astype(bool) & (grids.status == "ok")]
    if len(baseline):
        best = baseline.sort_values("value", ascending=not tasks.get(metric).higher_is_better).iloc[0]
        footnotes.append(f"best {best.label}: ρ = {best.lr:.4g}, {fmt_value(best.value, metric)}")
    if tasks.get(metric).disclosure:
        footnotes.append(tasks.get(metric).disclosure)
    return table, footnotes


def to_markdown(table: pd.DataFrame, title: str, footnotes: list) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines + [""] + [f"- {n}" for n in footnotes]) + "\n"


# --- the command -----------------------------------------------------------------------------------

def write_tables(results_dir, figures: bool = True, mix_budgets: bool = False, report=print) -> list:
    """Everything above into results_dir/tables; returns the paths written. Grids whose files cannot be
    read are skipped, one line each through `report`; no readable grid at all is a DpgridError."""
    results_dir = Path(results_dir)
    grids, skipped = collect(results_dir)
    for line in skipped:
        report(line)
    if not len(grids):
        raise DpgridError(f"no readable grid under {results_dir} (a grid is a folder with plan.json and runs.csv); "
                          "run one first (dpgrid run) or name the results directory")
    mixed = [f"{d} k={k}" for (d, k), g in grids[grids.private.astype(bool)].groupby(["dataset", "k"])
             if g.budget.nunique() > 1]
    if mixed and not mix_budgets:
        raise DpgridError(f"{', '.join(mixed)}: grids of different budgets (per_grid, per_run, selection) would share a "
                          "table, whose ε then means two things; tabulate them apart (one results directory each) "
                          "or pass --mix-budgets")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        figures = False
        report("matplotlib is not installed (pip install 'dpgrid[plots]'): tables only, no figures")
    out = results_dir / "tables"
    check_writable(out)
    with environment(out):  # no figures folder without figures
        (out / "figures" / "curves").mkdir(parents=True, exist_ok=True) if figures else out.mkdir(exist_ok=True)
    written = [out / "results.csv"]
    write_csv(written[0], grids)
    paper = paper_results()
    for (dataset, k), g in grids.groupby(["dataset", "k"]):
        written += write_one_table(g, dataset, k, out, paper, figures, report)
    return written


def write_one_table(g, dataset, k, out: Path, paper, figures: bool, report=print) -> list:
    metric, with_values = g.metric.iloc[0], not hyperparameters_only(paper, dataset, k)
    title = (f"{dataset}, k = {k}" + ("" if with_values else " (best hyperparameters, as the paper's table)")
             + f"; {budget_note(g)}")
    table, notes = paper_layout(g, dataset, k, with_values)
    if not with_values:
        notes.append(f"k = {k} shows the best hyperparameters only, as the paper's table of {dataset} (Tables 2–4); "
                     "each cell's score (mean and std over seeds) is in results.csv (value, std)")
    base = out / f"{dataset}_k{k}"
    write_csv(base.with_suffix(".csv"), table)
    write_atomic(base.with_suffix(".md"), to_markdown(table, title, notes))
    write_atomic(base.with_suffix(".tex"), to_latex(table, title, notes))
    written = [base.with_suffix(s) for s in (".csv", ".md", ".tex")]
    comp = comparison(g[g.budget.isin(["per_grid"]) | ~g.private.astype(bool)], paper, dataset, k)
    if len(comp) and with_values:  # the paper's grids are per grid: per-run grids are not compared with it
        claim = claims(comp, metric)
        write_csv(out / f"{dataset}_k{k}_vs_paper.csv", comp)
        write_atomic(out / f"{dataset}_k{k}_vs_paper.md",
                     comparison_markdown(comp, metric, f"{dataset}, k = {k}: dpgrid vs the paper, ε per grid in the paper's "
                                         "convention: one run per configuration accounted, seeds not (what the means "
                                         "over seeds cost: epsilon_with_seeds in results.csv)")
                     + (claims_markdown(claim, metric) if len(claim) else ""))
        written += [out / f"{dataset}_k{k}_vs_paper.csv", out / f"{dataset}_k{k}_vs_paper.md"]
        if len(claim):  # online and a rival were both run
            write_csv(out / f"{dataset}_k{k}_claim.csv", claim)
            written.append(out / f"{dataset}_k{k}_claim.csv")
    if figures:
        from dpgrid.reporting.figures import plot_learning_curve, plot_metric_vs_epsilon

        written += plot_metric_vs_epsilon(g[g.status != NOT_DP], dataset, k, metric, out / "figures" / f"{dataset}_k{k}")
        for row in g[g.status == "ok"].itertuples():
            path = out / "figures" / "curves" / f"{dataset}_{row.strategy}_eps{row.epsilon:g}_{row.budget}_k{k}.png"
            try:
                plot_learning_curve(row, path)
                written.append(path)
            except DpgridError as e:
                report(str(e))
    return written
