"""What a grid trains and releases under its accounting method: its procedure.

An accounting method (dpgrid.privacy.method) is the privacy maths alone: its keys, their checks, the noise for
(epsilon, delta) and what it spends. What a grid then trains (its phases, which runs, on which rows, from which seed),
what its rows add, what it releases and how the console and the tables say it are its procedure's, named by the
method's `procedure` (a dotted path, as a config's _target_) and asked through `procedure_of(plan.method)`. The
runner, the results and the reporting hold no branch on a method's name.

`Procedure` below is composition's and every procedure's default: every configuration's seeds trained, each run
committed and covered, the best configuration released. A method that only changes the maths (a stated noise
multiplier, another accountant) keeps it; one that trains or releases otherwise subclasses it and overrides what
differs, as random stopping (dpgrid.results.selection), tuning on a subsample (dpgrid.results.tuning) and noise
schedules (dpgrid.results.schedule) do.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Phase:
    """Runs a grid trains together before its procedure decides what comes next: each run trains on `train_rows` of
    the training set (indices; None: all of it) with the phase's noise, expected batch size and N as a strategy is
    told (None: the plan's); its rows add `fields` and record the phase's noise."""
    runs: list                       # (configuration, seed) pairs
    draw: str = None                 # a draw's digest the rows record, or None
    train_rows: object = None        # a tensor of training-set indices, or None
    noise_multiplier: float = None
    per_query: dict = None
    batch_size: float = None         # the expected batch size, the divisor of noisy sums
    n_train: float = None            # N as the strategy's Progress tells it (public: an expectation)
    fields: dict = field(default_factory=dict)
    streams: tuple = None            # (name, first seed): its runs' seeded batches and noise are named by the name and
                                     # their index in the phase, not their seed (None: their seed), so that they do
                                     # not depend on how many runs came before (a selection's candidates)


class Procedure:
    """Composition's procedure, every procedure's defaults. A procedure answers for one grid at a time and keeps no
    state: each member is asked with the plan (and the run directory, the spec, the rows) it needs."""

    releases_best_only = False  # True: only the chosen candidate leaves the grid; console and logs say nothing of
                                # the others (not even how many were trained)
    seeds_beyond_plan = False   # True: its runs' seeds go past train.seeds (fresh runs per candidate), seeded from
                                # names of their own (seed_names)

    def phases(self, out, spec, to_train: list, data):
        """The grid's phases in order (Phase); the runner trains each before asking for the next, so a later phase
        may read the rows of an earlier one. Here one phase: every configuration's seeds that this command trains."""
        yield Phase([(c, s) for c in to_train for s in range(spec.plan.seeds)])

    def batch_sizes(self, plan) -> tuple:
        """The expected batch size of each phase's steps, the divisor of its noisy sums (Phase.batch_size): the
        train-mode checks and the proof run at every size these reach (dpgrid.training.apart.check_sizes)."""
        return (plan.batch_size,)

    def every_run(self, plan, work: list) -> set:
        """(config_id, seed) of every run of the whole grid, whatever grid.only trains: what must have finished
        before its model is released (`work`: the runs of this command's phases)."""
        return {(c["config_id"], s) for c in plan.configurations for s in range(plan.seeds)}

    def start_seed(self, seed: int, seeds: int) -> int:
        """The seed whose initial weights run `seed` starts from."""
        return seed

    def run_steps(self, plan, config_id: str) -> int:
        """T of one configuration's runs."""
        return plan.steps

    def run_fields(self, plan, seed: int, draw) -> dict:
        """Columns a row holds before its seed, after the configuration (a candidate's index and draw)."""
        return {}

    def spent_fields(self, plan, config_id: str, result) -> dict:
        """Columns of a row that replace or follow the plan's (its steps, its own epsilon)."""
        return {}

    def group_limit(self, seeds: int, size: int) -> int:
        """How many runs may train stacked in one group, given `size` would fit."""
        return size

    def summarize(self, out, runs, plan, task: str):
        """(summary.csv's frame, what is released beyond it or None): per configuration, the best marked."""
        from dpgrid.results.runs import summarize

        return summarize(runs, plan.axes, task), None

    def release_reason(self, plan, summary_row, runs) -> tuple:
        """(the released runs' (seed, index among the configuration's seeds) pairs, why the epsilon covers them) for
        the best row of the summary."""
        ok = ~runs.diverged.astype(bool)
        mine = runs[(runs.config_id == summary_row.config_id) & ok]
        seeds = [(int(s), int(s)) for s in sorted(mine.seed)]
        if plan.epsilon_spent is None:
            return seeds, "the best configuration of the grid"
        costlier = plan.epsilon_with_seeds > plan.epsilon_spent * (1 + 1e-9)
        why = ("the best configuration of a composition grid, chosen from every seed's score of every configuration: "
               + (f"all {plan.n_configs} x {plan.seeds} runs with the grid's noise are what covers it, epsilon = "
                  f"{plan.epsilon_with_seeds:.4g} (the epsilon with seeds), more than the budget's epsilon "
                  f"{plan.epsilon_spent:.4g}, which accounts "
                  + ("one seed per configuration" if plan.budget == "per_grid" else "one configuration") if costlier else
                  "every run it read is accounted, so the grid's epsilon covers it"))
        return seeds, why

    def describe(self, plan) -> list:
        """The lines `dpgrid plan` prints for the budget, the noise and the configurations."""
        if plan.epsilon_spent is None:
            lines = ["  non-private: no clipping, no noise"]
        else:
            runs = f"{plan.composed_runs} runs ({'seeds accounted' if plan.account_seeds else 'seeds not accounted'})"
            scope = "the whole grid" if plan.budget == "per_grid" else "EACH RUN (per_run)"
            lines = [f"  budget (eps, delta) = ({plan.epsilon:g}, {plan.delta:g}) for {scope}: {runs} x {plan.steps} "
                     "steps; it covers " + plan.method.covers,
                     f"  noise multiplier nu = {plan.noise_multiplier:.5g}  ({plan.accountant}); eps spent = "
                     f"{plan.epsilon_spent:.5g}; the whole grid's eps = {plan.epsilon_grid:.5g}"]
            if plan.epsilon_with_seeds is not None and plan.epsilon_with_seeds > plan.epsilon_grid * (1 + 1e-9):
                lines.append(f"  tables publish means over {plan.seeds} seeds: {plan.n_configs} x {plan.seeds} runs with "
                             f"this noise spend eps = {plan.epsilon_with_seeds:.5g} ({plan.accountant}; "
                             "epsilon_with_seeds)")
        return lines + configuration_lines(plan)

    def expected_runs(self, plan, runs: int) -> float:
        """How many runs the grid trains, in full runs' compute, for the time estimate (`runs`: every
        configuration's seeds)."""
        return runs

    def table_runs(self, folder, runs, plan: dict):
        """Its rows as a table reads the grid's privacy figures from them (`plan`: plan.json, as recorded)."""
        return runs

    def table_release(self, folder, runs, plan: dict, axes: list, task: str):
        """What a table shows of a grid that releases its best only: {"chosen": configuration or None, "value",
        "std", "n_seeds", "seeds": the released runs' seeds (private: for its learning curve, never published)}
        recomputed from its rows and checked against the file it released; None: the table shows the best
        configuration over its seeds, as every run is covered."""
        return None

    def unreleased_draw(self, out, committed: int) -> str:
        """Why a secure grid that committed runs cannot go on ('' when it can): files its procedure needs."""
        return ""


def other_analyses(plan) -> str:
    """What the plan's noise spends under each selection analysis but the one it was calibrated with, for its
    description ("" where there is no other)."""
    return ", ".join(f"{eps:.5g} by {name}" for name, eps in plan.record.epsilon_by_analysis.items()
                     if name != plan.record.selection_accountant)


def configuration_lines(plan, notes: dict = None) -> list:
    """`dpgrid plan`'s line per configuration, with what a procedure notes of each (`notes`: by config_id)."""
    return [f"    {c['config_id']} " + " ".join(f"{k}={v:.4g}" for k, v in c.items() if k != "config_id")
            + ((notes or {}).get(c["config_id"], "")) for c in plan.configurations]


def procedure_of(method) -> Procedure:
    """The procedure of an accounting method (its class): the one its `procedure` names."""
    from dpgrid.plugins import Target, check_hooks, resolve

    cls = resolve(Target(method.procedure, {}), f"privacy.selection={method.name}", "class")
    check_hooks(cls, Procedure, f"privacy.selection={method.name}: its procedure")
    return cls()


def seed_names(spec) -> tuple:
    """The names a grid's seeded randomness derives from (a procedure whose seeds go past the plan's adds its
    repetition, privacy.selection.stopping_seed)."""
    p = spec.plan
    key = (p.dataset, p.strategy, p.epsilon if p.private else "non-private", p.k)
    return (*key, "selection", spec.stopping_seed) if procedure_of(p.method).seeds_beyond_plan else key
