"""Tables and figures from a results tree: `dpgrid tables [RESULTS_DIR] [--out DIR]` -> DIR (default
RESULTS_DIR/tables/). Every grid is read and vouched for first (dpgrid.reporting.grids).

- results.csv: every grid's best configuration (long form, raw numbers).
- <dataset>_k<k>.{csv,md,tex}: the paper's layout, a row per epsilon that was run, a column block per strategy:
  its best hyperparameters and, except where the paper's own table of that dataset and k shows hyperparameters only
  (its Tables 2-4), mean ± std over seeds, the best of each row marked. The CSV holds the raw numbers, the Markdown
  is for reading, the LaTeX (booktabs, caption, label, footnotes) for printing as it is.
- <dataset>_k<k>_vs_paper.{csv,md}: each cell next to the paper's, the difference, and whether it lies within the
  combined std (sqrt(std_ours^2 + std_paper^2)); the .md ends with the paper's main claim tested per epsilon (also
  <dataset>_k<k>_claim.csv).
- figures/: the metric against epsilon per strategy, and each best configuration's learning curve, each with a
  caption beside it (dpgrid.reporting.figures).
Missing cells are "–" with the reason in a footnote, never zero.
"""

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from dpgrid import DpgridError
from dpgrid.data import tasks
from dpgrid.config.grid import AXIS_SYMBOL
from dpgrid.reporting.cells import (ACCOUNTANT_NAMES, NOT_RUN, SETTING_NAMES, Column, Table, budget_note, fmt_hp,
                                    fmt_setting, fmt_value, grid_name, private_strategies, settings_note, to_csv_frame,
                                    to_latex, to_markdown, variant_words)
from dpgrid.reporting.grids import NOT_DP, SELECTION, SETTINGS, collect
from dpgrid.reporting.releases import covered_beyond, table_note, unreleased_words
from dpgrid.reporting.study import study_note
from dpgrid.reporting.comparison import claims, claims_markdown, comparison, comparison_markdown
from dpgrid.reproduction.paper import hyperparameters_only, paper_results
from dpgrid.results.files import check_writable, environment, write_atomic, write_csv

SEEDS_NOTE = ("ε seeds: each value is a mean over seeds, which costs more than ε: ε accounts one run per configuration, "
              "as the paper does, and the grid's K configurations × seeds runs with its noise spend ε seeds")


def paper_table(grids: pd.DataFrame, dataset: str, k: int, with_values: bool) -> Table:
    """One dataset and granularity in the paper's layout: a row per epsilon run (and per budget, and per training
    setting where the grids differ in one: never compared in one row), a column block per private strategy. Grids
    with no DP guarantee are left out and named. Its label names its grids (grids_name)."""
    label = f"tab:{dataset}_k{k}:{grids_name(grids)}"
    metric = grids.metric.dropna().iloc[0] if len(grids.metric.dropna()) else "accuracy"
    task = tasks.get(metric)
    blocks = private_strategies(grids)  # a strategy with only non-DP grids still gets its (empty) columns
    not_dp = grids[grids.status == NOT_DP]
    grids = grids[grids.status != NOT_DP]
    private = grids[grids.private.astype(bool)]
    varying = [c for c in ("budget",) + SETTINGS if private[c].astype(str).nunique() > 1]
    row_keys = sorted({(float(r.epsilon), *(str(getattr(r, c)) for c in varying)) for r in private.itertuples()},
                      key=lambda key: (key[0], *(natural(v) for v in key[1:])))
    costlier = private[private.epsilon_with_seeds.astype(float) > private.epsilon_grid.astype(float) * (1 + 1e-9)]
    per_run = (private.budget == "per_run").any()
    ok = private[private.status == "ok"]
    beyond = covered_beyond(ok, ok.epsilon_with_seeds if len(costlier) else ok.epsilon)  # more than the row shows
    caption = (f"{dataset}, k = {k}: each strategy's best configuration per privacy level ε"
               + (f", with its test {task.unit} ({over_seeds(private)}; the best of each row in bold)" if with_values
                  else "") + f". {budget_note(grids)}. {settings_note(private, varying)} "
               + table_note(private, bool(len(beyond)), bool(len(costlier)))).strip()
    table = Table(title=f"{dataset}, k = {k}", caption=caption, label=label, metric=metric,
                  keys=[Column("ε", "key", "ε")] + [Column(SETTING_NAMES.get(c, c), "key", c) for c in varying])
    table.rows = [{"ε": f"{key[0]:g}", **dict(zip(varying, key[1:]))} for key in row_keys]
    notes = {}
    for strategy, label, axes in blocks:
        columns = [Column(AXIS_SYMBOL.get(a, a), "hp", f"{label} {AXIS_SYMBOL.get(a, a)}") for a in axes]
        if with_values:
            columns.append(Column(task.table_name, "value", f"{label} {task.table_name}"))
        if per_run:
            columns.append(Column("ε grid", "epsilon", f"{label} ε grid"))
        if len(costlier):
            columns.append(Column("ε seeds", "epsilon", f"{label} ε seeds"))
        if len(beyond):
            columns.append(Column("ε model", "epsilon", f"{label} ε model"))
        table.blocks.append((label, columns))
        for index, key in enumerate(row_keys):
            match = (grids.strategy == strategy) & np.isclose(grids.epsilon.astype(float), key[0])
            for column, value in zip(varying, key[1:]):
                match &= grids[column].astype(str) == value
            cell = grids[match]
            reason = NOT_RUN if cell.empty else (None if cell.status.iloc[0] == "ok" else cell.status.iloc[0])
            if reason:
                notes.setdefault(reason, []).append(f"{label} at ε = {key[0]:g}" + "".join(
                    f", {SETTING_NAMES.get(c, c)} {v}" for c, v in zip(varying, key[1:])))
                continue
            c = cell.iloc[0]
            figures = {AXIS_SYMBOL.get(a, a): c[a] for a in axes}
            figures.update({task.table_name: (c.value, c["std"]), "ε grid": c.epsilon_grid, "ε seeds": c.epsilon_with_seeds,
                            "ε model": c.epsilon_released})
            table.rows[index].update({col.csv: figures[col.name] for col in columns})
    if with_values:
        mark_best(table, task)
    table.notes = footnotes(grids, private, not_dp, costlier, notes, metric)
    return table


def grids_name(grids: pd.DataFrame) -> str:
    """The name a table's label gives its grids: a digest of their config hashes (and folders, where a hash is not
    recorded), so that two trees tabled for one paper never share a label and the same grids always get the same."""
    import hashlib

    names = sorted(str(h) if isinstance(h, str) else str(p) for h, p in zip(grids.config_hash, grids.path))
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:6]


def natural(value: str):
    """A key's sort order: numbers by value, words as words."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def over_seeds(private: pd.DataFrame) -> str:
    seeds = sorted(set(private[private.status == "ok"].n_seeds.dropna().astype(int)))
    if len(seeds) == 1:
        return f"mean ± std over {seeds[0]} seed{'s' if seeds[0] != 1 else ''}"
    return "mean ± std over its converged seeds"


def mark_best(table: Table, task) -> None:
    """The best value of each row (two strategies or more in it): bold in Markdown and LaTeX."""
    value_columns = [c.csv for _, columns in table.blocks for c in columns if c.kind == "value"]
    for index, row in enumerate(table.rows):
        scored = {c: row[c][0] for c in value_columns if row.get(c) is not None and not pd.isna(row[c][0])}
        if len(scored) > 1:
            best = max(scored.values()) if task.higher_is_better else min(scored.values())
            table.best.update((index, c) for c, v in scored.items() if v == best)


def footnotes(grids, private, not_dp, costlier, missing: dict, metric: str) -> list:
    notes = [f"–: {reason}: {'; '.join(cells)}" for reason, cells in missing.items()]
    notes.extend(filter(None, [unreleased_words(private[private.status == "ok"], private)]))  # '' where all released
    if len(costlier):
        notes.append(SEEDS_NOTE + " (" + ", ".join(sorted({ACCOUNTANT_NAMES.get(r.accountant, r.accountant)
                                                           for r in costlier.itertuples()})) + ").")
    edge = private[(private.status == "ok") & private.edge.fillna("").astype(bool)]
    if len(edge):
        notes.append("Best configuration on the edge of its grid (a wider range of that hyperparameter may hold a better "
                     "one): " + "; ".join(f"{grid_name(r, private)} at ε = {r.epsilon:g} ({r.edge})" for r in edge.itertuples())
                     + ".")
    incomplete = private[(private.runs_done < private.runs_planned) & (private.budget != SELECTION)]
    if len(incomplete):
        notes.append("Incomplete grids (still training, or stopped; the same command resumes them): " + "; ".join(
            f"{grid_name(r, private)} at ε = {r.epsilon:g} ({r.runs_done:g} of {r.runs_planned:g} runs)"
            for r in incomplete.itertuples())
            + ".")
    partial = private[(private.configs_run < private.n_configs) & (private.budget != SELECTION)
                      & ~private.index.isin(incomplete.index)]
    if len(partial):  # grid.only: the best of a subset, still with the whole grid's noise
        notes.append("Partial grids (the best of the configurations run, with the whole grid's noise): " + "; ".join(
            f"{grid_name(r, private)} at ε = {r.epsilon:g} ({r.configs_run} of {r.n_configs} configurations)"
            for r in partial.itertuples()) + ".")
    if len(not_dp):
        notes.append("Not shown, no DP guarantee (shuffled batches, or a schedule that reads the data): " + "; ".join(
            f"{r.label} at ε = {r.epsilon:g} ({r.sampling})" for r in not_dp.itertuples()) + ".")
    baseline = grids[~grids.private.astype(bool) & (grids.status == "ok")]
    if len(baseline):
        best = baseline.sort_values("value", ascending=not tasks.get(metric).higher_is_better).iloc[0]
        differs = [f"{SETTING_NAMES[key]} {fmt_setting(best[key])}" for key in ("epochs", "batch_size", "eval_every")
                   if key in best and not pd.isna(best[key]) and private[key].dropna().astype(str).nunique() == 1
                   and str(best[key]) != str(private[key].dropna().iloc[0])]
        notes.append(f"Best {best.label} (non-private, no ε): ρ = {fmt_hp(best.lr)}, {fmt_value(best.value, metric)}"
                     + (f" (trained with {', '.join(differs)}, unlike the private grids)" if differs else "") + ".")
    if tasks.get(metric).disclosure:
        notes.append(tasks.get(metric).disclosure)
    return notes


def write_tables(results_dir, figures: bool = True, mix_budgets: bool = False, report=print, out=None) -> list:
    """Everything above into `out` (default results_dir/tables); returns the paths written. Grids whose files
    cannot be vouched for are skipped, one line each through `report`; no readable grid at all is a DpgridError."""
    results_dir = Path(results_dir)
    out = Path(out) if out is not None else results_dir / "tables"
    grids, skipped = collect(results_dir, out)
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
    check_writable(out)
    with environment(out):  # no figures folder without figures
        (out / "figures" / "curves").mkdir(parents=True, exist_ok=True) if figures else out.mkdir(parents=True,
                                                                                                  exist_ok=True)
    written = [out / "results.csv"]
    write_csv(written[0], grids)
    paper = paper_results()
    studies = {dataset: study_note(g) for dataset, g in grids.groupby("dataset")}
    for (dataset, k), g in grids.groupby(["dataset", "k"]):
        written += write_one_table(g, dataset, k, out, paper, figures, report, studies[dataset])
    return written


def write_one_table(g, dataset, k, out: Path, paper, figures: bool, report=print, study: str = "") -> list:
    metric, with_values = g.metric.iloc[0], not hyperparameters_only(paper, dataset, k)
    if not g.private.astype(bool).any():  # a table's rows are privacy levels: a baseline alone has none
        report(f"{dataset} k={k}: no private grid, so no table of privacy levels; the non-private grid's result is in "
               "results.csv" + (" and its learning curve in figures/curves/" if figures else ""))
        return write_curves(g, dataset, k, out, report) if figures else []
    table = paper_table(g, dataset, k, with_values)
    if study:
        table.notes.append(study)
    if not table.shows_a_result():
        report(f"{dataset} k={k}: no grid of this table has a result to show (each row's footnote says why, in "
               "results.csv's status): no table written")
        return []
    if not with_values:
        table.title += " (best hyperparameters, as the paper's table)"
        table.notes.append(f"k = {k} shows the best hyperparameters only, as the paper's table of {dataset} (Tables "
                           "2–4); each cell's score (mean and std over seeds) is in results.csv (value, std)")
    base = out / f"{dataset}_k{k}"
    write_csv(base.with_suffix(".csv"), to_csv_frame(table))
    write_atomic(base.with_suffix(".md"), to_markdown(table))
    write_atomic(base.with_suffix(".tex"), to_latex(table))
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
        from dpgrid.reporting.figures import plot_metric_vs_epsilon

        if ((g.status == "ok") & g.private.astype(bool)).any():  # never a figure of an empty axis
            written += plot_metric_vs_epsilon(g[g.status != NOT_DP], dataset, k, metric,
                                              out / "figures" / f"{dataset}_k{k}")
        written += write_curves(g, dataset, k, out, report)
    return written


def write_curves(g, dataset, k, out: Path, report=print) -> list:
    """Each grid's learning-curve figure (its own where grids of one cell were trained differently, its title and
    caption saying how); grids whose runs were validated once have none, and are named in one line."""
    from dpgrid.reporting.figures import plot_learning_curve

    written, single = [], []
    ok = g[g.status == "ok"]
    names = [f"{dataset}_{r.strategy}_" + (f"eps{r.epsilon:g}_{r.budget}" if r.private else "nonprivate") + f"_k{k}"
             for r in ok.itertuples()]
    for row, name in zip(ok.itertuples(), names):
        variant = ""
        if names.count(name) > 1:  # grids of one cell trained differently (their own rows): one figure each
            variant = variant_words(row, ok[[n == name for n in names]])
            name += "_" + hashlib.sha256(str(row.path).encode()).hexdigest()[:6]
        path = out / "figures" / "curves" / f"{name}.png"
        try:
            drawn = plot_learning_curve(row, path, variant)
        except DpgridError as e:
            report(str(e))
            continue
        written += drawn
        if not drawn:
            single.append(f"{grid_name(row, ok)} at ε = {row.epsilon:g}" if row.private else f"{row.label} (non-private)")
    if single:
        report(f"{dataset} k={k}: no learning-curve figure of {'; '.join(single)}: each run was validated once "
               "(T at most train.eval_every), a point, not a curve; its value is in the tables")
    return written
