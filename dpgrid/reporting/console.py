"""What a grid says on the console and in cli.log: a line per finished run, its result, and for a selection only
what it releases."""

import logging
import sys

from dpgrid.data import tasks
from dpgrid.config import grid


def plan_header(spec) -> str:
    """The line a grid says before it trains: what it trains and under which noise and budget. Nothing in it depends on
    the data or on a draw: a selection says how many runs it expects, never how many it drew."""
    from dpgrid.results.procedure import procedure_of

    plan, procedure = spec.plan, procedure_of(spec.plan.method)
    shape = (f"T = {plan.steps:,} steps per run (B = {plan.batch_size:g} expected, {plural(plan.epochs, 'epoch')}, "
             f"N = {plan.n_train:,}), validation every {spec.train.eval_every} steps")
    if procedure.releases_best_only:
        runs = (f"{plan.selection.replace('_', ' ')} over {plan.n_configs} configurations, about "
                f"{procedure.expected_runs(plan, plan.n_configs * plan.seeds):,.4g} runs' training expected")
    else:
        runs = f"{plural(len(spec.to_train), 'configuration')} x {plural(plan.seeds, 'seed')}"
    if not plan.private or plan.epsilon_spent is None:
        budget = "non-private: no noise, no epsilon" if not plan.private else f"no epsilon claimed ({plan.sampling})"
    else:
        scope = {"per_grid": "for the whole grid", "per_run": "for each run"}.get(plan.budget, "")
        if procedure.releases_best_only:
            scope = "for the whole selection"
        noise = "each run's own schedule" if plan.noise_per_run else f"nu = {plan.noise_multiplier:.4g}"
        budget = f"{noise} ({plan.accountant}); epsilon = {plan.epsilon:g}, delta = {plan.delta:g} {scope}"
        if plan.epsilon_with_seeds is not None and plan.epsilon_with_seeds > plan.epsilon_spent * (1 + 1e-9):
            budget += f"; the means over seeds cost epsilon = {plan.epsilon_with_seeds:.4g}"
    if not spec.start.is_default:
        from dpgrid.reporting.describe import start_line

        budget += f"; {start_line(spec.start)}"
    return f"plan: {plan.strategy} on {plan.dataset}: {runs}; {shape}; {budget}"


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def say(line: str) -> None:
    """A line for the console (stderr) and cli.log."""
    logging.getLogger("dpgrid").info(line)
    print(line, file=sys.stderr, flush=True)


def report_run(plan, config_id: str, seed: int, result, done: int, total: int) -> None:
    """One line per finished run: into cli.log (under Hydra), and to stderr when it is not a terminal
    (nohup, a cluster job, CI), where the progress bar is not shown."""
    value = "diverged" if result.diverged else f"{result.best_value:.4g}"
    if not result.diverged and result.report_value == result.report_value:  # data.validation=test_half
        value = f"{result.report_value:.4g} on the report half (selection half {result.best_value:.4g})"
    budget = f"eps={plan.epsilon:g}" if plan.private else "non-private"
    line = (f"{plan.strategy} {plan.dataset} {budget} k={plan.k}: run {done}/{total} {config_id} "
            f"seed {seed}: {value} ({result.seconds:.1f} s)")
    logging.getLogger("dpgrid").info(line)
    if not sys.stderr.isatty():
        print(line, file=sys.stderr, flush=True)


def describe_best(summary, task: str, selection: bool = False, final: dict = None) -> str:
    """The grid's result in one line; a selection's (`selection`) says only what selection.json releases (nothing of
    how many candidates there were, nor whether none was drawn or none converged; `final`: a tuning on a subsample's
    final runs' score)."""
    if not len(summary) or not summary.best.any():
        return ("the selection released no configuration (no candidate drawn, or none converged): selection.json"
                if selection else "no configuration converged: every run diverged")
    b = summary[summary.best].iloc[0]
    hps = ", ".join(f"{a}={b[a]:.4g}" for a in summary.columns if a in grid.ID_PREFIX)
    unit = tasks.get(task).unit
    if selection and final is not None:  # tuning on a subsample: the final model's score beside the tuning set's
        score = (f"{unit} {final['score']:.4g} ± {final['std']:.2g} over {final['seeds']} seed(s)"
                 if final["score"] is not None else "every run diverged")
        return (f"selected configuration {b.config_id} ({hps}) on the tuning set: {unit} {b['mean']:.4g}; final model: "
                f"{score} (selection.json)")
    if selection and "report_mean" in b:  # data.validation=test_half: reported on the half that chose nothing
        return (f"selected configuration {b.config_id} ({hps}): {unit} {b['report_mean']:.4g} on the report half of "
                f"the test set (chosen on the selection half: {b['mean']:.4g}; selection.json)")
    if selection:  # a random-stopping selection: what selection.json releases, nothing more
        return f"selected configuration {b.config_id} ({hps}): {unit} {b['mean']:.4g} (selection.json)"
    if "report_mean" in b:  # data.validation=test_half: the report half's score, chosen on the other half
        return (f"best configuration {b.config_id} ({hps}): {unit} {b['report_mean']:.4g} ± {b['report_std']:.2g} "
                f"over {b.n_seeds - b.n_diverged} seed(s) on the report half of the test set (chosen on the selection "
                f"half: {b['mean']:.4g})")
    return (f"best configuration {b.config_id} ({hps}): {unit} {b['mean']:.4g} ± {b['std']:.2g} "
            f"over {b.n_seeds - b.n_diverged} seed(s)")


def edge_warning(summary, plan) -> str:
    """Where a grid's best (or a selection's released) configuration lies on the edge of its grid, a line saying
    so ('' where it does not): a wider range may hold a better configuration."""
    from dpgrid.config.grid import edges

    best = summary[summary.best] if len(summary) and "best" in summary else summary.iloc[0:0]
    if not len(best):
        return ""
    found = edges({a: best.iloc[0][a] for a in plan.axes if a in best}, plan.configurations, plan.axes)
    return (f"the best configuration lies on the edge of its grid ({', '.join(found)}): a wider grid.lr_range or "
            "grid.clip_range may hold a better one") if found else ""


def chance_warning(summary, task: str, classes) -> str:
    """Where a classification grid's best configuration scores no better than guessing (within 2 points of 100 /
    classes %), a line saying so, for a private and a non-private grid alike ('' otherwise)."""
    best = summary[summary.best] if len(summary) and "best" in summary else summary.iloc[0:0]
    if task != "classification" or not classes or not len(best):
        return ""
    chance = 100.0 / int(classes)
    value = float(best.iloc[0]["mean"])
    if value > chance + 2:
        return ""
    return (f"the best configuration scores {value:.3g} %, chance level for {int(classes)} classes ({chance:.3g} %): "
            "the grid did not learn; more epochs (train.epochs), another grid.lr_range, or a larger epsilon may")


def previous_edge(out, plan) -> str:
    """edge_warning of the summary a run directory holds ('' where it holds none, or another grid's)."""
    from dpgrid.results.files import read_frame

    try:
        summary = read_frame(out / "summary.csv")
    except (OSError, ValueError):
        return ""
    if not set(plan.axes) <= set(summary.columns) or "best" not in summary:
        return ""
    return edge_warning(summary, plan)


def log(line: str) -> None:
    """A line for cli.log only: the engine's internals (what it proved, which forms it measured), which a user reads
    when they want them, not on the console."""
    logging.getLogger("dpgrid").info(line)


def say_methods(methods, said: int) -> int:
    """Log (cli.log) each layer shape's per-sample method newly chosen; returns how many are said."""
    lines = methods.describe()
    for line in lines[said:]:
        log(f"per-sample method: {line}")
    return len(lines)
