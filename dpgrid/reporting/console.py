"""What a grid says on the console and in cli.log: a line per finished run, its result, and for a selection only
what it releases."""

import logging
import sys

from dpgrid import tasks
from dpgrid.config import grid


SELECTION_QUIET = ("random-stopping selection: training the drawn candidates; how many there are and their scores "
                   "stay in the private files (candidates.json, runs.csv, curves.csv, summary.csv)")


def report_run(plan, config_id: str, seed: int, result, done: int, total: int) -> None:
    """One line per finished run: into cli.log (under Hydra), and to stderr when it is not a terminal
    (nohup, a cluster job, CI), where the progress bar is not shown."""
    value = "diverged" if result.diverged else f"{result.best_value:.4g}"
    budget = f"eps={plan.epsilon:g}" if plan.private else "non-private"
    line = (f"{plan.strategy} {plan.dataset} {budget} k={plan.k}: run {done}/{total} {config_id} "
            f"seed {seed}: {value} ({result.seconds:.1f} s)")
    logging.getLogger("dpgrid").info(line)
    if not sys.stderr.isatty():
        print(line, file=sys.stderr, flush=True)


def describe_best(summary, task: str) -> str:
    """The grid's result in one line; a selection's says only what selection.json releases (nothing of how many
    candidates there were, nor whether none was drawn or none converged)."""
    selection = "candidate" in summary or summary.attrs.get("selection")
    if not len(summary) or not summary.best.any():
        return ("the selection released no configuration (no candidate drawn, or none converged): selection.json"
                if selection else "no configuration converged: every run diverged")
    b = summary[summary.best].iloc[0]
    hps = ", ".join(f"{a}={b[a]:.4g}" for a in summary.columns if a in grid.ID_PREFIX)
    unit = tasks.get(task).unit
    if selection:  # a random-stopping selection: what selection.json releases, nothing more
        return f"selected configuration {b.config_id} ({hps}): {unit} {b['mean']:.4g} (selection.json)"
    return (f"best configuration {b.config_id} ({hps}): {unit} {b['mean']:.4g} ± {b['std']:.2g} "
            f"over {b.n_seeds - b.n_diverged} seed(s)")
