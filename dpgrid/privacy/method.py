"""What an accounting method decides beyond the noise: which runs a grid trains, what its rows add, what it
releases. The runner and the results ask these of the grid's method (`plan.accounting()`, the class that planned
it) and hold no branch on a method's name.

A new method subclasses AccountingMethod and overrides what differs: `plan` (the noise and what it spends) always,
the rest where it trains or releases something other than every configuration's seeds composed. A method a user
chooses is one config of conf/privacy/selection (its `_target_` this class, its `name`, its own keys, typed by
`Options` and checked by `check_options`); a method a strategy declares (`Strategy.accounting`) has no keys.
"""


from dataclasses import dataclass, field


@dataclass(frozen=True)
class Phase:
    """Runs a grid trains together before its method decides what comes next: each run trains on `train_rows` of
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


class AccountingMethod:
    @dataclass
    class Options:
        """Its own keys (privacy.selection.*), with their types: a misspelt key or a wrong type is refused."""

    Record = None  # a frozen dataclass: what plan.json records of it beside the common figures (`plan` returns one
                   # as `record`); plan.record holds it

    name = ""
    accountants = ()           # the privacy.accountant values it takes
    releases_best_only = False  # True: only the chosen candidate leaves the grid; console and logs say nothing of
                                # the others (not even how many were trained)
    seeds_beyond_plan = False  # True: its runs' seeds go past train.seeds (fresh runs per candidate)
    noise_per_run = False      # True: each run has its own noise and T (a schedule), not the plan's
    announcement = ""          # what a grid that releases its best only says when it starts ('': a selection's line)
    # what its epsilon covers and what it does not, in the one wording model.json, selection.json, `dpgrid plan`,
    # `dpgrid model`, the tables' captions and the README use
    covers = ""
    adjacency = "add or remove one training example"  # the neighbouring datasets its analysis is for

    @classmethod
    def check_options(cls, read) -> None:
        """Its keys' ranges and the settings it cannot run with; `read`: a dpgrid.config.checks.Reader of the whole
        config (its keys are privacy.selection.*). DpgridError, one line naming the key, for a bad one."""

    def plan(self, plan, strategy_cls, options: dict, privacy: dict, problem: dict) -> dict:
        """The plan's fields this method fills in: the noise, its split among the strategy's queries, what it spends."""
        raise NotImplementedError

    def unclaimed(self, record):
        """Its record for a grid whose batches no analysis covers (train.sampling=shuffle): nothing claimed."""
        return record

    def runs(self, out, spec, selected: list) -> tuple:
        """((configuration, seed) of every run the grid trains, a draw's digest or None): each selected
        configuration's seeds."""
        return [(c, s) for c in selected for s in range(spec.plan.seeds)], None

    def phases(self, out, spec, selected: list, data):
        """The grid's phases in order (Phase); the runner trains each before asking for the next, so a later phase
        may read the rows of an earlier one. One phase: the runs of `runs`."""
        work, draw = self.runs(out, spec, selected)
        yield Phase(work, draw)

    def every_run(self, plan, work: list) -> set:
        """(config_id, seed) of every run of the whole grid, whatever grid.only trains: what must have finished
        before its model is released."""
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

    def release_reason(self, plan, summary_row, runs):
        """(the released runs' (seed, starting seed) pairs, why the epsilon covers them) for the best row."""
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

    describes_configurations = False  # True: its `describe` lists the configurations (with what it planned for each)

    def describe(self, plan) -> list:
        """The lines `dpgrid plan` prints for the budget and the noise ([]: the composition's own lines)."""
        return []

    def expected_runs(self, plan, runs: int) -> float:
        """How many runs the grid trains, in full runs' compute, for the time estimate (`runs`: every selected
        configuration's seeds)."""
        return runs

    def table_runs(self, folder, runs, plan: dict):
        """Its rows as a table reads the grid's privacy figures from them (`plan`: plan.json, as recorded)."""
        return runs

    def table_release(self, folder, runs, plan: dict, axes: list, task: str):
        """What a table shows of a grid that releases its best only: {"chosen": configuration or None, "value",
        "std", "n_seeds"} recomputed from its rows and checked against the file it released; None: the table shows
        the best configuration over its seeds, as every run is covered."""
        return None

    def unreleased_draw(self, out, committed: int) -> str:
        """Why a secure grid that committed runs cannot go on ('' when it can): files its method needs."""
        return ""

