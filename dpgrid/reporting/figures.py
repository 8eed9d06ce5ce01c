"""Figures of `dpgrid tables`, each a paper can print as it is: a short title on the figure, and beside it (FIGURE.txt,
and the PDF's Subject) a caption that says what the points and bars are and what epsilon they cost.

- the metric against epsilon, one line per strategy (points at one epsilon shifted apart), error bars one std over
  seeds, the best non-private configuration as a dashed line labelled non-private;
- each grid's best configuration's learning curve: the mean over its seeds with a band of one std, and a panel per
  quantity the strategy adapts (C_t, rho_t), none for what it holds fixed.
Each is rendered in memory and written whole (write-then-rename)."""

import io
import re
from pathlib import Path

import pandas as pd

from dpgrid.data import tasks
from dpgrid.config.grid import AXIS_SYMBOL
from dpgrid.reporting.cells import (adjacency_note, budget_note, fmt_epsilon, fmt_value, grid_name, private_strategies,
                                    variant_words)
from dpgrid.reporting.layout import fitted_title, legend_below
from dpgrid.reporting.releases import curve_sentence, figure_sentence
from dpgrid.results.files import read_frame, write_atomic

DODGE = 0.012  # the shift apart of points at one epsilon, as a fraction of the x axis's span
WIDTH = 3.4     # inches: one column of a two-column paper, so that its 8-point text prints at 8 points
DPI = 300       # the PNGs' resolution (the PDFs are vector)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")  # one per series: told apart in grayscale too
LINES = ("-", "--", "-.", ":")
SCOPE = {"per_grid": "ε per grid", "per_run": "ε per run", "selection": "ε per selection"}


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 8, "axes.titlesize": 8, "legend.fontsize": 7, "pdf.fonttype": 42})
    return plt


def save(fig, path: Path, dpi: int, title: str = "", caption: str = "") -> list:
    """The figure at `path` (its format from the suffix); a PDF carries its title and caption as metadata."""
    buffer = io.BytesIO()
    metadata = {"Title": title, "Subject": caption} if path.suffix == ".pdf" else None
    fig.savefig(buffer, format=path.suffix[1:], dpi=dpi, metadata=metadata)
    write_atomic(path, buffer.getvalue())
    return [path]


def save_both(fig, base: Path, title: str, caption: str) -> list:
    """PNG (DPI) and PDF (vector) of one figure, and its caption beside them."""
    paths = []
    for ext in ("png", "pdf"):
        paths += save(fig, base.with_suffix(f".{ext}"), DPI, title, caption)
    return paths + [caption_file(base, caption)]


def caption_file(base: Path, caption: str) -> Path:
    path = base.with_suffix(".txt")
    write_atomic(path, caption + "\n")
    return path


def seeds_phrase(counts) -> str:
    counts = sorted({int(n) for n in counts if n == n})
    if not counts:
        return "their seeds"
    if len(counts) == 1:
        return f"{counts[0]} seed{'s' if counts[0] != 1 else ''}"
    return f"{counts[0]}–{counts[-1]} seeds"


def delta_phrase(grids) -> str:
    """The delta of the grids' (epsilon, delta), and whether it is weak (not below 1/N)."""
    deltas = sorted(set(grids.delta.dropna().astype(float))) if "delta" in grids else []
    if not deltas:
        return ""
    text = "δ = " + ", ".join(re.sub(r"e-0*(\d)", r"e-\1", f"{d:g}") for d in deltas)
    if "weak_delta" in grids and grids.weak_delta.fillna(False).astype(bool).any():
        text += " (not below 1/N: a weak guarantee)"
    return text


def plot_metric_vs_epsilon(grids, dataset, k, metric, out_base: Path) -> list:
    """The metric against epsilon: one series per strategy (and per budget, where budgets are mixed), each with its
    own marker and line style, shifted apart at one epsilon; the best non-private configuration dashed."""
    plt = pyplot()
    task = tasks.get(metric)
    levels = sorted(grids[grids.private.astype(bool)].epsilon.dropna().astype(float).unique())
    span = (levels[-1] - levels[0]) if len(levels) > 1 else (levels[0] if levels else 1.0)
    shown = grids[grids.private.astype(bool) & (grids.status == "ok")]
    budgets = sorted(set(shown.budget.dropna()))
    # grids that trained something else (a model, a start: a checkpoint, a part, LoRA) are series of their own
    shown = shown.assign(variant=[variant_words(r, shown) for r in shown.itertuples()])  # every setting that differs
    series = [(strategy, label + (f", {variant}" if variant else ""), budget, variant)
              for strategy, label, _ in private_strategies(grids) for budget in budgets
              for variant in sorted(set(shown.variant))
              if ((shown.strategy == strategy) & (shown.budget == budget) & (shown.variant == variant)).any()]
    baseline = grids[~grids.private.astype(bool) & (grids.status == "ok")]
    fig, ax = plt.subplots(figsize=(WIDTH, 2.5), layout="constrained")
    for i, (strategy, label, budget, variant) in enumerate(series):
        g = shown[(shown.strategy == strategy) & (shown.budget == budget) & (shown.variant == variant)].sort_values(
            "epsilon")
        shift = (i - (len(series) - 1) / 2) * DODGE * span
        ax.errorbar(g["epsilon"].astype(float) + shift, g["value"] * task.table_scale,
                    yerr=g["std"].fillna(0) * task.table_scale, marker=MARKERS[i % len(MARKERS)],
                    linestyle=LINES[i % len(LINES)], markersize=4, capsize=2, linewidth=1,
                    label=label if len(budgets) == 1 else f"{label} ({SCOPE.get(budget, budget)})")
    if len(baseline):
        best = baseline.sort_values("value", ascending=not task.higher_is_better).iloc[0]
        ax.axhline(best.value * task.table_scale, color="gray", linestyle=(0, (4, 2)), linewidth=1,
                   label=f"{best.label} (non-private)")
    ax.margins(y=0.12)  # keep the baseline's line off the frame
    ax.set_xticks(levels)
    ax.set_xticklabels([f"{e:g}" for e in levels])
    if len(levels) == 1:  # one level: the axis around it, not around the points' small shifts
        ax.set_xlim(levels[0] * 0.8, levels[0] * 1.2)
    delta = delta_phrase(shown)
    ax.set_xlabel("ε, the grid's target" + (f" ({delta.split(' (')[0]})" if delta else ""))  # delta in the figure too
    unit = task.unit + (" × 10²" if task.table_scale == 100 and "%" not in task.unit else "")
    ax.set_ylabel(f"test {unit} ({'higher' if task.higher_is_better else 'lower'} is better)")
    title = f"{dataset}, k = {k}"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if series or len(baseline):  # below the axes (the figure grows by it): never over a point, never cut
        legend_below(fig, ax)
    caption = metric_caption(grids, shown, baseline, dataset, k, task, series, budgets)
    paths = save_both(fig, out_base, title, caption)
    plt.close(fig)
    return paths


def metric_caption(grids, shown, baseline, dataset, k, task, series, budgets) -> str:
    delta = delta_phrase(shown)
    text = (f"{dataset}, k = {k}: test {task.unit} of each strategy's best configuration against the target ε of its "
            f"grid{f', {delta}' if delta else ''} ({budget_note(grids)}). Points are means over "
            f"{seeds_phrase(shown.n_seeds)}, bars one standard deviation over those seeds (ddof 0); each strategy has "
            "its own marker and line style"
            + (", one series per budget" if len(budgets) > 1 else "")
            + ("; points at one ε are shifted apart to stay visible." if len(series) > 1 else "."))
    costlier = shown[shown.epsilon_with_seeds.astype(float) > shown.epsilon_grid.astype(float) * (1 + 1e-9)]
    if len(costlier):
        text += (" Each point is a mean over seeds, which costs more than the target ε: " + "; ".join(
            f"{grid_name(r, shown)} at ε = {r.epsilon:g}: {fmt_epsilon(r.epsilon_with_seeds)}" for r in costlier.itertuples())
            + f" ({', '.join(sorted(set(costlier.accountant.astype(str))))} accountant).")
    text += figure_sentence(shown)
    if len(baseline):
        best = baseline.sort_values("value", ascending=not task.higher_is_better).iloc[0]
        text += (f" Dashed: the best non-private configuration ({best.label}, {fmt_value(best.value, task.name)}), "
                 "which no ε covers.")
    return text


def plot_learning_curve(grid_row, out_path: Path, variant: str = "") -> list:
    """The learning curve of a grid's best (or a selection's chosen) configuration: its runs' mean and one std, a
    panel below it for each quantity the strategy adapts (on a log axis, as their grids are: the same in every
    figure), whole steps on the shared x axis from 0 to the last validation. PNG and PDF. `variant`: what tells this
    grid from others of its cell (a fine-tuned grid from one from scratch), said in its title and caption. A run
    validated once (T at most train.eval_every) has no curve: nothing is drawn, [] returned."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    from dpgrid import DpgridError
    from dpgrid.results.curves import read_curves

    path = Path(grid_row.path) / "curves.csv"
    curves, _ = read_curves(path)
    runs = curves.config_id == grid_row.config_id
    if not runs.any():
        raise DpgridError(f"{path} holds no curve of configuration {grid_row.config_id} (missing or damaged; the "
                          "grid's command repairs it): its learning-curve figure is not drawn")
    seeds = released_seeds(grid_row)
    selection = seeds is not None
    if selection:  # the released runs' own: never pooled with other candidates of its configuration
        runs &= curves.seed.isin(seeds)
    mine = curves[runs]
    stats = mine.groupby("step")[["value", "clip", "lr"]].agg(["mean", "std"])
    if len(stats) < 2:  # one point is no curve: its value is the table's
        return []
    adapts = [a for a in str(grid_row.adapts).split(",") if a in ("clip", "lr")]  # a panel per adapted quantity
    panels = [("value", tasks.get(grid_row.metric).unit)] + [(a, {"clip": "$C_t$", "lr": r"$\rho_t$"}[a]) for a in adapts]
    fig, axes = plt.subplots(len(panels), 1, figsize=(WIDTH, 1.45 * len(panels) + 0.55), sharex=True, squeeze=False)
    n_seeds = mine.seed.nunique()
    last = int(stats.index.max())
    for ax, (column, label), color in zip(axes[:, 0], panels, ("C0", "C1", "C2")):
        mean, std = stats[column]["mean"], stats[column]["std"].fillna(0)
        ax.plot(mean.index, mean, color=color, marker=".", markersize=3, linewidth=1)
        if n_seeds > 1:
            ax.fill_between(mean.index, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if column != "value":
            log_axis(ax)
    axes[-1, 0].set_xlabel("step")
    axes[-1, 0].set_xlim(0, last * 1.04 + 0.5)
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    scope = SCOPE.get(grid_row.budget, "ε per grid")
    title = (f"{grid_row.dataset}: {grid_row.label}, ε = {grid_row.epsilon:g} ({scope})" if grid_row.private
             else f"{grid_row.dataset}: {grid_row.label} (non-private)") + (f"\n{variant}" if variant else "")
    title = fitted_title(fig, axes[0, 0], title)
    fig.align_ylabels(axes[:, 0])
    caption = curve_caption(grid_row, n_seeds, adapts, selection, variant)
    written = save_both(fig, out_path.with_suffix(""), title, caption)
    plt.close(fig)
    return written


def log_axis(ax) -> None:
    """A log y axis (C and rho live on log-spaced grids and adapt multiplicatively: the same scale in every figure),
    its ticks plain numbers: powers of ten over a decade or more, a few round values within less."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter, NullLocator, ScalarFormatter

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    if high / low < 10:  # as many digits as tell the ticks apart
        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))
    else:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def curve_caption(grid_row, n_seeds: int, adapts: list, selection: bool, variant: str = "") -> str:
    which = "the configuration a random-stopping selection released" if selection else "the best configuration"
    hps = ", ".join(f"{AXIS_SYMBOL.get(a, a)} = {getattr(grid_row, a):.3g}" for a in str(grid_row.axes).split(",") if a)
    if grid_row.private:
        delta = delta_phrase(pd.DataFrame([{"delta": getattr(grid_row, "delta", None),
                                            "weak_delta": getattr(grid_row, "weak_delta", False)}]))
        budget = f"the grid's target ε = {grid_row.epsilon:g}{f', {delta}' if delta else ''}, {SCOPE.get(grid_row.budget, grid_row.budget)}"
    else:
        budget = "non-private"
    seeds = f"{n_seeds} seed{'s' if n_seeds != 1 else ''}"
    text = (f"{grid_row.dataset}, {grid_row.label}{f', {variant}' if variant else ''} ({budget}, k = {grid_row.k}): "
            f"test {grid_row.metric} of {which}, {grid_row.config_id} ({hps}), at each validation; the line is the "
            f"mean over its {seeds}" + (", the band one standard deviation over them." if n_seeds > 1 else "."))
    names = {"clip": "the clipping threshold C_t", "lr": "the learning rate ρ_t"}
    if adapts:
        text += (" The panels below show " + " and ".join(names[a] for a in adapts)
                 + ", which the strategy adapts (log axes).")
    with_seeds = getattr(grid_row, "epsilon_with_seeds", None)
    if grid_row.private and with_seeds == with_seeds and with_seeds is not None:
        text += f" What this figure shows (a mean over seeds) is covered by ε = {fmt_epsilon(with_seeds)}."
    if grid_row.private:
        text += adjacency_note(pd.DataFrame([{"selection": getattr(grid_row, "selection", None)}])).replace(
            "; neighbouring", " Neighbouring", 1) + "."
    return text + (curve_sentence(grid_row) if grid_row.private else "")


def released_seeds(grid_row):
    """The seeds of the runs a grid that releases its best only released (its procedure recomputes them from the
    private runs.csv), or None: every seed of the best configuration is covered."""
    from dpgrid.privacy import recorded_method
    from dpgrid.results.files import read_json
    from dpgrid.results.procedure import procedure_of

    folder = Path(grid_row.path)
    if not (folder / "plan.json").exists():  # curves without a grid around them: every seed's
        return None
    plan = read_json(folder / "plan.json", "")
    released = procedure_of(recorded_method(plan)).table_release(
        folder, read_frame(folder / "runs.csv"), plan, [a for a in str(grid_row.axes).split(",") if a],
        tasks.get(grid_row.metric).name)
    return None if released is None else released["seeds"]
