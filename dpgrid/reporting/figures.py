"""Figures of `dpgrid tables`: the metric against epsilon per strategy, and the best configuration's
learning curve with C_t and rho_t. Each is rendered in memory and written whole (write-then-rename)."""

import io
from pathlib import Path

import pandas as pd

from dpgrid import tasks
from dpgrid.results.files import read_frame, write_atomic
from dpgrid.reporting.cells import budget_note, fmt_value, private_strategies


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path, dpi: int) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix[1:], dpi=dpi)
    write_atomic(path, buffer.getvalue())


def plot_metric_vs_epsilon(grids, dataset, k, metric, out_base: Path) -> list:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.3))
    for strategy, label, _ in private_strategies(grids):
        g = grids[(grids.strategy == strategy) & (grids.status == "ok")].sort_values("epsilon")
        if len(g):
            ax.errorbar(g["epsilon"], g["value"], yerr=g["std"].fillna(0), marker="o", capsize=3, label=label)
    baseline = grids[~grids.private.astype(bool) & (grids.status == "ok")]
    if len(baseline):
        best = baseline.value.max() if tasks.get(metric).higher_is_better else baseline.value.min()
        ax.axhline(best, color="gray", linestyle="--", label=f"{baseline.label.iloc[0]} (best): {fmt_value(best, metric)}")
    ax.margins(y=0.12)  # keep the baseline's line off the frame
    ax.set_xticks(sorted(grids[grids.private.astype(bool)].epsilon.unique()))
    ax.set_xlabel("ε")
    task = tasks.get(metric)
    ax.set_ylabel(f"{task.unit} ({'higher' if task.higher_is_better else 'lower'} is better)")
    ax.set_title(f"{dataset}, k = {k}\n{budget_note(grids)}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [out_base.with_suffix(f".{ext}") for ext in ("png", "pdf")]
    for path in paths:
        save(fig, path, 150)
    plt.close(fig)
    return paths


def plot_learning_curve(grid_row, out_path: Path) -> None:
    plt = pyplot()
    from dpgrid import DpgridError
    from dpgrid.results.curves import read_curves

    path = Path(grid_row.path) / "curves.csv"
    curves, _ = read_curves(path)
    runs = curves.config_id == grid_row.config_id
    if not runs.any():
        raise DpgridError(f"{path} holds no curve of configuration {grid_row.config_id} (missing or damaged; the "
                          "grid's command repairs it): its learning-curve figure is not drawn")
    selection = grid_row.budget == "selection"
    if selection:  # the selected candidate's own runs: never pooled with other candidates of its configuration
        runs &= curves.seed.isin(selected_seeds(grid_row))
    best = curves[runs].groupby("step")[["value", "clip", "lr"]].mean()
    adaptive = "clip" in str(grid_row.adapts).split(",")  # C_t (and rho_t) change during the run
    fig, axes = plt.subplots(1, 3 if adaptive else 1, figsize=(12 if adaptive else 5, 3.5), squeeze=False)
    axes = axes[0]
    axes[0].plot(best.index, best["value"], marker=".")
    axes[0].set_ylabel(grid_row.metric)
    if adaptive:
        for ax, column, label, color in ((axes[1], "clip", "C_t", "C1"), (axes[2], "lr", "ρ_t", "C2")):
            ax.plot(best.index, best[column], color=color, marker=".")
            ax.set_ylabel(label)
            ax.ticklabel_format(axis="y", useOffset=False, style="plain") if ax.get_yscale() == "linear" else None
            if best[column].max() > 10 * best[column].min() > 0:  # log scale only for wide ranges
                ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    scope = {"per_run": "ε per run", "selection": "ε per selection"}.get(grid_row.budget, "ε per grid")
    which = "selected configuration" if selection else "best configuration"
    # two lines: one panel is 5 inches wide, too narrow for the whole title on one
    fig.suptitle(f"{grid_row.dataset} {grid_row.label} ε={grid_row.epsilon:g} ({scope}) k={grid_row.k}\n"
                 f"{which} {grid_row.config_id} (mean over seeds)", fontsize=10 if adaptive else 9)
    fig.tight_layout()
    save(fig, out_path, 120)
    plt.close(fig)


def selected_seeds(grid_row) -> list:
    """The seeds of the candidate a selection released (recomputed from its private runs.csv)."""
    from dpgrid.results.selection import candidate_summary

    runs = read_frame(Path(grid_row.path) / "runs.csv")
    summary = candidate_summary(runs, [a for a in str(grid_row.axes).split(",") if a], tasks.get(grid_row.metric).name)
    chosen = int(summary[summary.best].candidate.iloc[0])
    return list(runs.seed[runs.candidate == chosen])
