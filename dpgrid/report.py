"""Tables and figures from a results tree: `dpgrid tables [RESULTS_DIR]` -> RESULTS_DIR/tables/.

- results.csv: every grid's best configuration (long form, raw numbers).
- <dataset>_k<k>.{csv,md,tex}: the paper's layout (Tables 2-4 for k = 7: best hyperparameters;
  Tables 8-13 otherwise: hyperparameters and mean ± std), rows = epsilon, a column block per strategy.
- <dataset>_k<k>_vs_paper.{csv,md}: each cell next to the paper's, the difference, and whether it lies
  within the combined std (sqrt(std_ours^2 + std_paper^2)).
- figures/<dataset>_k<k>.{png,pdf}: metric against epsilon per strategy (std error bars, best nodp as a
  line); figures/curves/<grid>.png: the best configuration's validation curve with C_t and rho_t.
Missing cells are "–" with the reason in a footnote, never zero.
"""

import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

PRIVATE = ["online", "fixed_threshold", "fixed_quantile", "adamwosm"]
LABEL = {"online": "Online", "fixed_threshold": "Fixed Threshold", "fixed_quantile": "Fixed Quantile",
         "adamwosm": "Adam WOSM", "nodp": "NoDP"}
AXES = {"online": ["lr"], "fixed_threshold": ["lr", "clip"], "fixed_quantile": ["lr", "quantile"],
        "adamwosm": ["clip"], "nodp": ["lr"]}
SYMBOL = {"lr": "ρ", "clip": "C", "quantile": "γ"}
EPSILONS = {"mnist": [3, 5, 7, 9], "ag_news": [3, 5, 7, 9], "fashion_mnist": [1, 2, 3, 4], "digits": [3, 5, 7, 9]}
MISSING = "–"
NOT_RUN, DIVERGED = "grid not run", "all seeds diverged"


def paper_results() -> pd.DataFrame:
    with resources.files("dpgrid.reference").joinpath("paper_results.csv").open() as f:
        return pd.read_csv(f, comment="#")


def collect(results_dir: Path) -> pd.DataFrame:
    """One row per grid found under results_dir: its best configuration and where it is."""
    rows = []
    for summary_path in sorted(Path(results_dir).rglob("summary.csv")):
        folder = summary_path.parent
        if "tables" in folder.relative_to(results_dir).parts or not (folder / "plan.json").exists():
            continue
        plan = json.loads((folder / "plan.json").read_text())
        summary = pd.read_csv(summary_path, dtype={"config_id": str})
        metric = pd.read_csv(folder / "runs.csv", nrows=1)["metric"].iloc[0]
        row = dict(dataset=plan["dataset"], strategy=plan["strategy"], k=plan["k"], epsilon=plan["epsilon"],
                   metric=metric, noise_multiplier=plan["noise_multiplier"], epsilon_spent=plan["epsilon_spent"],
                   n_configs=plan["n_configs"], configs_run=len(summary), path=str(folder))
        best = summary[summary.best]
        if len(best):
            b = best.iloc[0]
            row.update({a: b[a] for a in AXES.get(plan["strategy"], []) if a in b},
                       config_id=b.config_id, value=b["mean"], std=b["std"],
                       n_seeds=int(b.n_seeds - b.n_diverged), status="ok")
        else:
            row.update(status=DIVERGED, value=math.nan, std=math.nan)
        rows.append(row)
    columns = ["dataset", "strategy", "k", "epsilon", "metric", "lr", "clip", "quantile", "config_id", "value",
               "std", "n_seeds", "status", "noise_multiplier", "epsilon_spent", "n_configs", "configs_run", "path"]
    return pd.DataFrame(rows).reindex(columns=columns)


# --- formatting -------------------------------------------------------------------------------------

def fmt_hp(v) -> str:
    return MISSING if pd.isna(v) else f"{v:.4g}"


def fmt_value(v, metric) -> str:
    """Accuracy in %, MSE x 10^2 (as the paper prints them)."""
    if pd.isna(v):
        return MISSING
    return f"{v * 100:.2f}" if metric == "mse" else f"{v:.2f}"


def paper_layout(grids: pd.DataFrame, dataset: str, k: int, with_values: bool):
    """The wide table (strings) and its footnotes for one dataset and granularity."""
    metric = grids.metric.dropna().iloc[0] if len(grids.metric.dropna()) else "accuracy"
    found = set(grids.epsilon)
    epsilons = sorted(set(EPSILONS.get(dataset, [])) | found)
    notes, table = {}, pd.DataFrame({"ε": [f"{e:g}" for e in epsilons]})
    for strategy in PRIVATE:
        for e_index, eps in enumerate(epsilons):
            cell = grids[(grids.strategy == strategy) & np.isclose(grids.epsilon, eps)]
            reason = NOT_RUN if cell.empty else (None if cell.status.iloc[0] == "ok" else DIVERGED)
            if reason:
                notes.setdefault(reason, []).append(f"{LABEL[strategy]} ε={eps:g}")
            for axis in AXES[strategy]:
                table.loc[e_index, f"{LABEL[strategy]} {SYMBOL[axis]}"] = MISSING if reason else fmt_hp(cell[axis].iloc[0])
            if with_values:
                name = "mse×10²" if metric == "mse" else "acc"
                table.loc[e_index, f"{LABEL[strategy]} {name}"] = MISSING if reason else fmt_value(cell.value.iloc[0], metric)
                table.loc[e_index, f"{LABEL[strategy]} std"] = MISSING if reason else fmt_value(cell["std"].iloc[0], metric)
    footnotes = [f"{MISSING}: {reason}: {', '.join(cells)}" for reason, cells in notes.items()]
    partial = grids[(grids.configs_run < grids.n_configs) & grids.strategy.isin(PRIVATE)]
    if len(partial):  # grid.only: the best of a subset, still with the whole grid's noise
        footnotes.append("partial grids (grid.only; best of the configurations run, whole grid's noise): " + ", ".join(
            f"{LABEL[r.strategy]} ε={r.epsilon:g} ({r.configs_run} of {r.n_configs})" for r in partial.itertuples()))
    nodp = grids[(grids.strategy == "nodp") & (grids.status == "ok")]
    if len(nodp):
        best = nodp.sort_values("value", ascending=metric == "mse").iloc[0]
        footnotes.append(f"best NoDP: ρ = {best.lr:.4g}, {fmt_value(best.value, metric)}")
    return table, footnotes


def to_markdown(table: pd.DataFrame, title: str, footnotes: list) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines + [""] + [f"- {n}" for n in footnotes]) + "\n"


def to_latex(table: pd.DataFrame, title: str, footnotes: list) -> str:
    """booktabs tabular; the paper's symbols as math."""
    def tex(s):
        s = str(s).replace("×10²", r"$\times 10^2$").replace("–", "--").replace("±", r"$\pm$")
        for greek, cmd in (("ρ", r"$\rho$"), ("γ", r"$\gamma$"), ("ε", r"$\varepsilon$")):
            s = s.replace(greek, cmd)
        return s.replace("_", r"\_")
    lines = [f"% {title}", r"\begin{tabular}{" + "l" * len(table.columns) + "}", r"\toprule",
             " & ".join(tex(c) for c in table.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(tex(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"] + [f"% {tex(n)}" for n in footnotes]
    return "\n".join(lines) + "\n"


def comparison(grids: pd.DataFrame, paper: pd.DataFrame, dataset: str, k: int) -> pd.DataFrame:
    """Ours next to the paper's, per (epsilon, strategy) the paper reports."""
    rows = []
    for p in paper[(paper.dataset == dataset) & (paper.k == k) & paper.strategy.isin(PRIVATE)].itertuples():
        cell = grids[(grids.strategy == p.strategy) & np.isclose(grids.epsilon, p.epsilon)]
        status = NOT_RUN if cell.empty else cell.status.iloc[0]
        ours = cell.iloc[0] if len(cell) else None
        row = dict(epsilon=p.epsilon, strategy=p.strategy, paper_value=p.value, paper_std=p.std,
                   configs_run=ours.configs_run if ours is not None else 0,
                   n_configs=ours.n_configs if ours is not None else math.nan,
                   value=ours.value if ours is not None else math.nan,
                   std=ours["std"] if ours is not None else math.nan, status=status)
        for axis in AXES[p.strategy]:
            row[f"paper_{axis}"] = getattr(p, axis)
            row[axis] = ours[axis] if ours is not None else math.nan
        row["same_hyperparameters"] = (status == "ok" and all(
            np.isclose(row[a], row[f"paper_{a}"], rtol=2e-3) for a in AXES[p.strategy]))
        row["difference"] = row["value"] - row["paper_value"]
        combined = math.sqrt(np.nan_to_num(row["std"]) ** 2 + np.nan_to_num(row["paper_std"]) ** 2)
        row["within_std"] = bool(abs(row["difference"]) <= combined) if not math.isnan(row["difference"]) else None
        rows.append(row)
    return pd.DataFrame(rows)


def comparison_markdown(comp: pd.DataFrame, metric: str, title: str) -> str:
    lines = [f"### {title}", "", "| ε | strategy | paper hyperparameters | paper | ours: hyperparameters | ours | "
             "difference | within combined std |", "|---|---|---|---|---|---|---|---|"]
    for r in comp.itertuples():
        axes = AXES[r.strategy]
        paper_hp = ", ".join(f"{SYMBOL[a]}={fmt_hp(getattr(r, 'paper_' + a))}" for a in axes)
        ours_hp = ", ".join(f"{SYMBOL[a]}={fmt_hp(getattr(r, a))}" for a in axes) if r.status == "ok" else MISSING
        paper_v = (f"{fmt_value(r.paper_value, metric)} ± {fmt_value(r.paper_std, metric)}"
                   if not pd.isna(r.paper_value) else f"{MISSING} (diverged)")
        ours_v = (f"{fmt_value(r.value, metric)} ± {fmt_value(r.std, metric)}" if r.status == "ok"
                  else f"{MISSING} ({r.status})")
        diff = fmt_value(r.difference, metric) if not pd.isna(r.difference) else MISSING
        within = MISSING if r.within_std is None or pd.isna(r.within_std) else ("yes" if r.within_std else "no")
        if r.status == "ok" and r.configs_run < r.n_configs:
            ours_hp += f" ({r.configs_run:.0f} of {r.n_configs:.0f} configurations run)"
        lines.append(f"| {r.epsilon:g} | {LABEL[r.strategy]} | {paper_hp} | {paper_v} | {ours_hp} | {ours_v} | "
                     f"{diff} | {within} |")
    return "\n".join(lines) + "\n"


# --- figures ---------------------------------------------------------------------------------------

def plot_metric_vs_epsilon(grids, dataset, k, metric, out_base: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for strategy in PRIVATE:
        g = grids[(grids.strategy == strategy) & (grids.status == "ok")].sort_values("epsilon")
        if len(g):
            ax.errorbar(g["epsilon"], g["value"], yerr=g["std"].fillna(0), marker="o", capsize=3, label=LABEL[strategy])
    nodp = grids[(grids.strategy == "nodp") & (grids.status == "ok")]
    if len(nodp):
        best = nodp.value.min() if metric == "mse" else nodp.value.max()
        ax.axhline(best, color="gray", linestyle="--", label=f"NoDP (best): {fmt_value(best, metric)}")
    ax.margins(y=0.12)  # keep the NoDP line off the frame
    ax.set_xticks(sorted(grids[grids.strategy != "nodp"].epsilon.unique()))
    ax.set_xlabel("ε (whole grid)")
    ax.set_ylabel("MSE (lower is better)" if metric == "mse" else "accuracy % (higher is better)")
    ax.set_title(f"{dataset}, k = {k}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    for ext in ("png", "pdf"):
        fig.savefig(out_base.with_suffix(f".{ext}"), dpi=150)
    plt.close(fig)


def plot_learning_curve(grid_row, out_path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = pd.read_csv(Path(grid_row.path) / "curves.csv", dtype={"config_id": str})
    best = curves[curves.config_id == grid_row.config_id].groupby("step")[["value", "clip", "lr"]].mean()
    adaptive = grid_row.strategy in ("online", "fixed_quantile")
    fig, axes = plt.subplots(1, 3 if adaptive else 1, figsize=(12 if adaptive else 5, 3.5), squeeze=False)
    axes = axes[0]
    axes[0].plot(best.index, best["value"], marker=".")
    axes[0].set_ylabel(grid_row.metric)
    if adaptive:
        for ax, column, label, color in ((axes[1], "clip", "C_t", "C1"), (axes[2], "lr", "ρ_t", "C2")):
            ax.plot(best.index, best[column], color=color, marker=".")
            ax.set_ylabel(label)
            if best[column].max() > 10 * best[column].min() > 0:  # log scale only for wide ranges
                ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{grid_row.dataset} {LABEL.get(grid_row.strategy, grid_row.strategy)} ε={grid_row.epsilon:g} "
                 f"k={grid_row.k}: best configuration {grid_row.config_id} (mean over seeds)")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


# --- the command -----------------------------------------------------------------------------------

def write_tables(results_dir, figures: bool = True) -> list:
    """Everything above into results_dir/tables; returns the paths written."""
    results_dir = Path(results_dir)
    out = results_dir / "tables"
    out.mkdir(parents=True, exist_ok=True)
    grids = collect(results_dir)
    written = [out / "results.csv"]
    grids.to_csv(written[0], index=False)
    paper = paper_results()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        figures = False
        print("matplotlib is not installed (pip install 'dpgrid[plots]'): tables only, no figures")
    for (dataset, k), g in grids.groupby(["dataset", "k"]):
        metric = g.metric.iloc[0]
        with_values = k != 7
        title = f"{dataset}, k = {k}" + ("" if with_values else " (best hyperparameters, as Tables 2–4)")
        table, notes = paper_layout(g, dataset, k, with_values)
        base = out / f"{dataset}_k{k}"
        table.to_csv(base.with_suffix(".csv"), index=False)
        base.with_suffix(".md").write_text(to_markdown(table, title, notes))
        base.with_suffix(".tex").write_text(to_latex(table, title, notes))
        written += [base.with_suffix(s) for s in (".csv", ".md", ".tex")]
        comp = comparison(g, paper, dataset, k)
        if len(comp) and k != 7:
            comp.to_csv(out / f"{dataset}_k{k}_vs_paper.csv", index=False)
            (out / f"{dataset}_k{k}_vs_paper.md").write_text(
                comparison_markdown(comp, metric, f"{dataset}, k = {k}: dpgrid vs the paper"))
            written += [out / f"{dataset}_k{k}_vs_paper.csv", out / f"{dataset}_k{k}_vs_paper.md"]
        if figures:
            (out / "figures" / "curves").mkdir(parents=True, exist_ok=True)
            plot_metric_vs_epsilon(g, dataset, k, metric, out / "figures" / f"{dataset}_k{k}")
            written += [out / "figures" / f"{dataset}_k{k}.png", out / "figures" / f"{dataset}_k{k}.pdf"]
            for row in g[g.status == "ok"].itertuples():
                path = out / "figures" / "curves" / f"{dataset}_{row.strategy}_eps{row.epsilon:g}_k{k}.png"
                plot_learning_curve(row, path)
                written.append(path)
    return written
