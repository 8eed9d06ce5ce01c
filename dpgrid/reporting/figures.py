"""Figures of `dpgrid tables`, each a paper can print as it is: a short title on the figure, and beside it (FIGURE.txt,
and the PDF's Subject) a caption that says what the points and bars are and what epsilon they cost.

- the metric against epsilon, one line per strategy (points at one epsilon shifted apart), error bars one std over
  seeds, the best non-private configuration as a dashed line labelled non-private;
- each grid's best configuration's learning curve: the mean over its seeds with a band of one std, and a panel per
  quantity the strategy adapts (C_t, rho_t), none for what it holds fixed.
Each is rendered in memory and written whole (write-then-rename)."""

import io
from pathlib import Path

from dpgrid import tasks
from dpgrid.reporting.cells import budget_note, fmt_epsilon, fmt_value, private_strategies
from dpgrid.results.files import read_frame, write_atomic

DODGE = 0.012  # the shift apart of points at one epsilon, as a fraction of the x axis's span


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path, dpi: int, title: str = "", caption: str = "") -> list:
    """The figure at `path` (its format from the suffix); a PDF carries its title and caption as metadata."""
    buffer = io.BytesIO()
    metadata = {"Title": title, "Subject": caption} if path.suffix == ".pdf" else None
    fig.savefig(buffer, format=path.suffix[1:], dpi=dpi, metadata=metadata)
    write_atomic(path, buffer.getvalue())
    return [path]


def caption_file(base: Path, caption: str) -> Path:
    path = base.with_suffix(".txt")
    write_atomic(path, caption + "\n")
    return path


def seeds_phrase(counts) -> str:
    counts = sorted({int(n) for n in counts if n == n})
    if not counts:
        return "their seeds"
    return f"{counts[0]} seeds" if len(counts) == 1 else f"{counts[0]}–{counts[-1]} seeds"


def plot_metric_vs_epsilon(grids, dataset, k, metric, out_base: Path) -> list:
    plt = pyplot()
    task = tasks.get(metric)
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    strategies = private_strategies(grids)
    levels = sorted(grids[grids.private.astype(bool)].epsilon.dropna().astype(float).unique())
    span = (levels[-1] - levels[0]) if len(levels) > 1 else (levels[0] if levels else 1.0)
    shown = grids[grids.private.astype(bool) & (grids.status == "ok")]
    for i, (strategy, label, _) in enumerate(strategies):
        g = shown[shown.strategy == strategy].sort_values("epsilon")
        if len(g):
            shift = (i - (len(strategies) - 1) / 2) * DODGE * span
            ax.errorbar(g["epsilon"].astype(float) + shift, g["value"] * task.table_scale,
                        yerr=g["std"].fillna(0) * task.table_scale, marker="o", capsize=3, label=label)
    baseline = grids[~grids.private.astype(bool) & (grids.status == "ok")]
    if len(baseline):
        best = baseline.sort_values("value", ascending=not task.higher_is_better).iloc[0]
        ax.axhline(best.value * task.table_scale, color="gray", linestyle="--",
                   label=f"{best.label} (non-private)")
    ax.margins(y=0.12)  # keep the baseline's line off the frame
    ax.set_xticks(levels)
    if len(levels) == 1:  # one level: the axis around it, not around the points' small shifts
        ax.set_xlim(levels[0] * 0.8, levels[0] * 1.2)
    ax.set_xlabel("ε (the grid's target)")
    unit = task.unit + (" × 10²" if task.table_scale == 100 and "%" not in task.unit else "")
    ax.set_ylabel(f"{unit} ({'higher' if task.higher_is_better else 'lower'} is better)")
    title = f"{dataset}, k = {k}"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    caption = metric_caption(grids, shown, baseline, dataset, k, task)
    paths = []
    for ext in ("png", "pdf"):
        paths += save(fig, out_base.with_suffix(f".{ext}"), 150, title, caption)
    plt.close(fig)
    return paths + [caption_file(out_base, caption)]


def metric_caption(grids, shown, baseline, dataset, k, task) -> str:
    text = (f"{dataset}, k = {k}: test {task.unit} of each strategy's best configuration against the target ε of its "
            f"grid ({budget_note(grids)}). Points are means over {seeds_phrase(shown.n_seeds)}, bars one standard "
            "deviation over those seeds (ddof 0); points at one ε are shifted apart to stay visible.")
    costlier = shown[shown.epsilon_with_seeds.astype(float) > shown.epsilon_grid.astype(float) * (1 + 1e-9)]
    if len(costlier):
        text += (" Each point is a mean over seeds, which costs more than the target ε: " + ", ".join(
            f"{r.label} at ε = {r.epsilon:g}: {fmt_epsilon(r.epsilon_with_seeds)}" for r in costlier.itertuples())
            + f" ({', '.join(sorted(set(costlier.accountant.astype(str))))} accountant).")
    if len(baseline):
        best = baseline.sort_values("value", ascending=not task.higher_is_better).iloc[0]
        text += (f" Dashed: the best non-private configuration ({best.label}, {fmt_value(best.value, task.name)}), "
                 "which no ε covers.")
    return text


def plot_learning_curve(grid_row, out_path: Path) -> list:
    """The learning curve of a grid's best (or a selection's chosen) configuration: its runs' mean and one std."""
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
    mine = curves[runs]
    stats = mine.groupby("step")[["value", "clip", "lr"]].agg(["mean", "std"])
    adapts = [a for a in str(grid_row.adapts).split(",") if a in ("clip", "lr")]  # a panel per adapted quantity
    panels = [("value", tasks.get(grid_row.metric).unit)] + [(a, {"clip": "$C_t$", "lr": r"$\rho_t$"}[a]) for a in adapts]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 0.6, 3.4), squeeze=False)
    n_seeds = mine.seed.nunique()
    for ax, (column, label), color in zip(axes[0], panels, ("C0", "C1", "C2")):
        mean, std = stats[column]["mean"], stats[column]["std"].fillna(0)
        if len(mean) > 1:
            ax.plot(mean.index, mean, color=color, marker=".")
            if n_seeds > 1:
                ax.fill_between(mean.index, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
        else:  # one validation (T < train.eval_every): a point with its spread
            ax.errorbar(mean.index, mean, yerr=std if n_seeds > 1 else None, color=color, marker="o", capsize=3)
        ax.set_ylabel(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if column != "value":
            ax.ticklabel_format(axis="y", useOffset=False, style="plain")
            if (mean - std).min() > 0 and mean.max() > 10 * mean.min():  # log scale only for wide ranges
                ax.set_yscale("log")
    if grid_row.private:
        scope = {"per_run": "ε per run", "selection": "ε per selection"}.get(grid_row.budget, "ε per grid")
        title = f"{grid_row.label}, ε = {grid_row.epsilon:g} ({scope})"
    else:
        title = f"{grid_row.label} (non-private)"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    caption = curve_caption(grid_row, n_seeds, adapts, selection)
    written = save(fig, out_path, 120, title, caption)
    plt.close(fig)
    return written + [caption_file(out_path, caption)]


def curve_caption(grid_row, n_seeds: int, adapts: list, selection: bool) -> str:
    which = "the configuration a random-stopping selection released" if selection else "the best configuration"
    hps = ", ".join(f"{a} = {getattr(grid_row, a):.3g}" for a in str(grid_row.axes).split(",") if a)
    budget = (f"the grid's target ε = {grid_row.epsilon:g}, {grid_row.budget}" if grid_row.private else "non-private")
    text = (f"{grid_row.dataset}, {grid_row.label} ({budget}, k = {grid_row.k}): test {grid_row.metric} of {which}, "
            f"{grid_row.config_id} ({hps}), at each validation; the line is the mean over its {n_seeds} seed(s)"
            + (", the band one standard deviation over them." if n_seeds > 1 else "."))
    names = {"clip": "the clipping threshold C_t", "lr": "the learning rate ρ_t"}
    if adapts:
        text += " The other panels show " + " and ".join(names[a] for a in adapts) + ", which the strategy adapts."
    return text


def selected_seeds(grid_row) -> list:
    """The seeds of the candidate a selection released (recomputed from its private runs.csv)."""
    from dpgrid.results.selection import candidate_summary

    runs = read_frame(Path(grid_row.path) / "runs.csv")
    summary = candidate_summary(runs, [a for a in str(grid_row.axes).split(",") if a], tasks.get(grid_row.metric).name)
    chosen = int(summary[summary.best].candidate.iloc[0])
    return list(runs.seed[runs.candidate == chosen])

