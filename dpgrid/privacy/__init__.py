"""A grid's privacy: its plan (how much noise, what it spends) and the accounting methods behind it.

An accounting method is one module here with one class in ACCOUNTING, an AccountingMethod (method.py): `name`,
the `accountants` it takes (privacy.accountant), what its epsilon `covers`, and `calibrate(plan, strategy_cls,
options, privacy, problem) -> dict`, which is told the plan's public figures (N, B, q, T, K, seeds, the target
(epsilon, delta), privacy.accountant) and returns what it records: the noise, its split among the strategy's queries,
and what it spends. What a grid trains, what its rows add and what it releases are its `procedure`'s
(dpgrid.results.procedure); the runner holds no branch on either. A strategy declares the method it needs
(`Strategy.accounting`); a composition grid becomes a random-stopping selection with privacy.selection=random_stopping.

- composition (composition.py): the K runs compose (privacy.accountant: rdp, pld or prv, accountants.py);
- random_stopping (random_stopping.py): only the best of a random number of candidates is released, accounted
  by the Renyi theorems or (privacy.selection.selection_accountant=profile) by the profile bound (selection_profiles.py),
  one entry each in random_stopping.ANALYSES;
- noise_schedule (noise_schedule.py): each run's sigma_t schedule is fitted into a zCDP budget;
- subsample_tuning (subsample_tuning.py, its bounds in subsample_bounds.py): the candidates train on a Poisson
  subsample of the data, the chosen configuration's final model on the full data (privacy.selection=subsample_tuning).
"""

import copy
import math
from dataclasses import asdict, dataclass, field, replace

from dpgrid import DpgridError
from dpgrid.privacy.accountants import ACCOUNTANTS, calibrate, epsilon_of, pld_epsilon, prv_epsilon, rdp_epsilon, smallest_noise
from dpgrid.privacy.composition import Composition, liu_talwar_parameters
from dpgrid.privacy.method import AccountingMethod
from dpgrid.privacy.noise_schedule import NoiseSchedule
from dpgrid.privacy.random_stopping import RandomStopping
from dpgrid.privacy.subsample_tuning import SubsampleTuning

__all__ = ["Plan", "make_plan", "ACCOUNTING", "accounting_for", "recorded_method", "alternatives", "NOT_DP_SAMPLING", "ACCOUNTANTS",
           "calibrate", "epsilon_of", "pld_epsilon", "prv_epsilon", "rdp_epsilon", "smallest_noise", "liu_talwar_parameters"]

# the built-in methods by name: what a strategy's `accounting` and a recorded plan name
ACCOUNTING = {method.name: method for method in (Composition, RandomStopping, NoiseSchedule, SubsampleTuning)}
NOT_DP_SAMPLING = "shuffle (not DP)"  # how plans, rows and tables mark runs no epsilon covers


def accounting_for(strategy_cls, selection=Composition):
    """The accounting method of a strategy's grid: the one it declares, or the grid's privacy.selection (its class,
    or a built-in's name) in place of composition. DpgridError when the two cannot go together."""
    declared = ACCOUNTING.get(strategy_cls.accounting)
    if declared is None:
        raise DpgridError(f"{strategy_cls.__name__}.accounting = {strategy_cls.accounting!r} is no accounting "
                          f"method; valid: {', '.join(ACCOUNTING)}")
    selection = ACCOUNTING[selection] if isinstance(selection, str) else selection
    if selection is not Composition:
        if declared is not Composition:
            raise DpgridError(f"privacy.selection={selection.name} selects among grids accounted by composition; "
                              f"this strategy's grid is accounted by {declared.name}")
        return selection
    return declared


def recorded_method(plan: dict, trust=()):
    """The accounting method a plan.json records (its `selection`, or a noise schedule's `schedule`), for what reads
    a grid back from its files (the tables): a built-in by its name; a plugin's by the class plan.json names
    (`method`), only where that class is already loaded in this process (the config that planned the grid imported
    it) or named in `trust`. Nothing read from a file names a module dpgrid imports: any other method reads under its
    recorded name, as text, with composition's procedure (its figures as its rows record them)."""
    if plan.get("schedule"):
        return NoiseSchedule
    name = plan.get("selection", "composition")
    if name in ACCOUNTING:
        return ACCOUNTING[name]
    named = str(plan.get("method"))
    for method in loaded_methods():
        if f"{method.__module__}.{method.__qualname__}" == named:
            return method
    if named in set(trust or ()):  # the user's word for it, by name
        from dpgrid.plugins import Target, resolve

        try:
            return resolve(Target(named, {}), f"the grid's accounting method {name}", "class")
        except DpgridError:
            pass
    return type(f"Recorded_{name}", (AccountingMethod,), {"name": str(name)})


def loaded_methods() -> list:
    """Every AccountingMethod class this process has imported (a plugin's, through the config that named it)."""
    found, stack = [], list(AccountingMethod.__subclasses__())
    while stack:
        method = stack.pop()
        found.append(method)
        stack.extend(method.__subclasses__())
    return found


def all_accountants() -> tuple:
    """Every privacy.accountant value some accounting method takes."""
    return tuple(dict.fromkeys(a for method in ACCOUNTING.values() for a in method.accountants))


@dataclass(frozen=True)
class Plan:
    """A grid's privacy plan, as plan.json records it: frozen once its accounting method has filled it in."""
    dataset: str
    strategy: str
    k: int
    n_configs: int
    n_train: int
    batch_size: int
    epochs: int
    steps: int                # T, per run
    sample_rate: float        # q = B / N
    epsilon: float            # the grid's target (None for a non-private baseline, which spends none)
    delta: float
    seeds: int
    account_seeds: bool
    composed_runs: int        # K, or K * seeds when seeds are accounted
    noise_multiplier: float   # nu of one step's (joint) Gaussian mechanism; 0 for nodp
    budget: str = "per_grid"  # per_grid: epsilon covers the K runs; per_run: each run on its own
    sampling: str = "poisson"  # or NOT_DP_SAMPLING: fixed-size batches, no epsilon claimed
    accountant: str = "rdp"
    per_query: dict = field(default_factory=dict)  # the strategy's split of nu (online, fixed_quantile)
    problem: dict = field(default_factory=dict)    # public problem constants its steps use (a noise schedule's L, M, ...)
    epsilon_spent: float = None  # what the budget covers, recomputed with the final nu (<= epsilon); None for nodp
    epsilon_grid: float = None   # the whole grid's true cost with this nu (= epsilon_spent when per_grid)
    epsilon_per_run: float = None  # one configuration's cost (its seeds too when they are accounted)
    epsilon_with_seeds: float = None  # what tables publish (means over seeds): K x seeds runs with this nu
    selection: str = "composition"  # or the selection that released the best candidate only (privacy.selection)
    record: object = None     # what its accounting method records beside these (its Record: frozen), or None
    # [[q, nu, count], ...]: the Gaussian mechanisms the model runs once on the private data before training (its
    # private statistics, dpgrid.models.stages), composed into every epsilon above; [] for most models
    statistics: list = field(default_factory=list)
    model_parameters: int = 0
    label: str = ""           # the strategy's name in tables and figures
    private: bool = True      # False for a non-private baseline
    adapts: list = field(default_factory=list)  # quantities the strategy adapts (final_* columns)
    axes: list = field(default_factory=list)    # the grid's axes, e.g. ["lr", "clip"]
    dataset_epsilons: list = field(default_factory=list)  # the dataset's privacy levels (table rows)
    configurations: list = field(default_factory=list)
    method: type = Composition  # its accounting method (an AccountingMethod class), whose procedure the runner asks

    def to_dict(self) -> dict:
        """plan.json: the common figures and its method's record among them, in the order plan.json has always had
        (the built-in methods' records filled in with their defaults where another method planned the grid)."""
        fields = asdict(self)
        record = fields.pop("record") or {}
        d = {key: record.get(key, copy.deepcopy(RECORDED[key])) if key in RECORDED else fields[key] for key in PLAN_JSON}
        d |= {key: value for key, value in record.items() if key not in RECORDED}  # a plugin method's own
        if not d["tuning"]:  # only a tuning on a subsample records it (the plans of other grids stay as they were)
            del d["tuning"]
        if not d["statistics"]:  # only a model with private statistics has them (other plans stay as they were)
            del d["statistics"]
        d.update(d.pop("per_query"))
        d.update(d.pop("problem"))  # plan.json has always held both among its top-level keys
        if self.selection not in ACCOUNTING:  # a plugin method: the class that planned it, for what reads it back
            d["method"] = f"{self.method.__module__}.{self.method.__qualname__}"
        return d

    @property
    def noise_per_run(self) -> bool:
        """Each run has its own noise and T (a noise schedule's sigma_t): no one multiplier for the grid."""
        return self.private and math.isnan(self.noise_multiplier)


# plan.json's keys in their order (the method is named through its fields: selection, schedule, budget), and the
# built-in methods' records' keys with what a plan that does not have them records (every plan.json holds them:
# they were once fields of every plan)
PLAN_JSON = ("dataset", "strategy", "k", "n_configs", "n_train", "batch_size", "epochs", "steps", "sample_rate", "epsilon",
             "delta", "seeds", "account_seeds", "composed_runs", "noise_multiplier", "budget", "sampling", "accountant",
             "per_query", "problem", "epsilon_spent", "epsilon_grid", "epsilon_per_run", "epsilon_with_seeds", "liu_talwar",
             "selection", "stopping", "selection_accountant", "epsilon_by_analysis", "schedule", "tuning", "statistics",
             "model_parameters", "label", "private", "adapts", "axes", "dataset_epsilons", "configurations")
RECORDED = {"liu_talwar": {}, "stopping": {}, "selection_accountant": None, "epsilon_by_analysis": {}, "schedule": {},
            "tuning": {}}


def make_plan(*, strategy_cls, options: dict, privacy: dict, problem: dict, n_train: int, batch_size: int,
              epochs: int, seeds: int, sampling: str, selection=None, steps: int = None, statistics=(),
              **public) -> Plan:
    """The grid's plan: its public figures, then the noise and what it spends from its accounting method.
    `privacy`: the privacy settings (epsilon, delta, accountant, budget, selection and its stopping rule);
    `selection`: the class of privacy.selection (None: the built-in that privacy["selection"] names);
    `statistics`: the Gaussian mechanisms [(q, nu, count)] of the model's private statistics (Plan.statistics);
    `public`: the names and figures the plan records as given (dataset, strategy, label, k, axes, ...)."""
    if steps is None:
        steps = math.ceil(epochs * n_train / batch_size)
    else:  # train.steps: T as given, its epochs what they are (a fraction where T is short of one pass)
        epochs = round(steps * batch_size / n_train, 4)
    per_config = seeds if privacy["account_seeds"] else 1  # runs of one configuration that are accounted
    configs = public["configurations"]
    plan = Plan(**public, n_configs=len(configs), private=bool(strategy_cls.private), adapts=list(strategy_cls.adapts),
                n_train=n_train, batch_size=batch_size, epochs=epochs, steps=steps, sample_rate=batch_size / n_train,
                epsilon=float(privacy["epsilon"]), delta=float(privacy["delta"]), seeds=seeds,
                account_seeds=bool(privacy["account_seeds"]), composed_runs=len(configs) * per_config,
                noise_multiplier=0.0, budget=str(privacy["budget"]), accountant=str(privacy["accountant"]),
                sampling=sampling, statistics=[[float(q), float(nu), int(c)] for q, nu, c in statistics])
    if strategy_cls.private:
        chosen = ACCOUNTING[str(privacy["selection"])] if selection is None else selection  # privacy.selection's
        method = accounting_for(strategy_cls, chosen)
        if plan.statistics and not method.composes_statistics:
            raise DpgridError(f"the model estimates statistics of the private data before training (its data "
                              f"normalisation), which {method.name} does not account; use privacy.selection=composition "
                              "or random_stopping, or a normalisation without them (model.norm=group)")
        plan = replace(plan, method=method, selection=chosen.name,
                       **method().calibrate(plan, strategy_cls, options, privacy, problem))
        if plan.epsilon_spent is not None:
            check_spent(plan)
    else:  # a non-private baseline: no budget, no epsilon (its runs do not depend on them)
        if plan.statistics:
            raise DpgridError(f"strategy={public.get('strategy')} is not private, but the model estimates statistics of "
                              "the private data with noise (its data normalisation); use model.norm=group or none")
        plan = replace(plan, epsilon=None, delta=None, budget="non-private", accountant=None)
    if plan.sampling == "shuffle":  # the noise is the Poisson plan's, but no analysis covers shuffled batches
        plan = replace(plan, epsilon_spent=None, epsilon_grid=None, epsilon_per_run=None, epsilon_with_seeds=None,
                       sampling=NOT_DP_SAMPLING)
    return plan


def statistics_words(events) -> str:
    """A model's private statistics (Plan.statistics) in words: "2 x the Gaussian mechanism of multiplier 8 on the
    whole training set"."""
    return ", ".join(f"{count} x the Gaussian mechanism of multiplier {nu:g} on " +
                     ("the whole training set" if q == 1 else f"a Poisson sample of rate {q:g}") for q, nu, count in events)


def check_spent(plan: Plan) -> None:
    if not plan.epsilon_spent <= plan.epsilon:  # explicit: must hold under python -O too
        raise DpgridError(f"the calibrated noise spends epsilon = {plan.epsilon_spent:.6g} > the target "
                          f"{plan.epsilon:g}; refusing to run (please report this)")


def alternatives(plan, eta: float, mean: float) -> dict:
    """nu for this plan's (epsilon, delta) under composition and under each stopping rule, side by side
    (None where unreachable): `dpgrid plan` prints them."""
    from dpgrid.privacy.random_stopping import COVERS, parameters, selection_epsilon

    q, steps, seeds, k, prior = plan.sample_rate, plan.steps, plan.seeds, plan.n_configs, plan.statistics
    extra = {"prior": prior} if prior else {}  # a model's private statistics compose with every alternative
    found = {}
    for name, runs in ((f"composition, {k} runs (seeds not accounted)", k),
                       (f"composition, {k * seeds} runs (seeds accounted)", k * seeds)):
        try:
            found[name] = calibrate(plan.epsilon, q, runs * steps, plan.delta,  # the plan's own precision and
                                    accountant=plan.accountant if plan.accountant in ACCOUNTANTS else "rdp", **extra)
        except DpgridError:
            found[name] = None
    for rule in COVERS["rdp"]:  # the Renyi analysis (the default); plan --compare adds the profile bound's
        if prior and rule == "liu_talwar":  # its (epsilon, delta) theorem does not compose with the statistics here
            continue
        stopping = parameters(rule, eta, mean, plan.delta)
        spent = lambda nu: selection_epsilon(q, nu, seeds * steps, plan.delta, stopping, **extra)  # noqa: E731
        try:
            found[f"{rule}, mean {mean:g} candidates of {seeds} runs"] = smallest_noise(
                spent, plan.epsilon, 1e-4, "", key=["random_stopping", q, seeds * steps, plan.delta, stopping]
                + ([[list(e) for e in prior]] if prior else []))
        except DpgridError:
            found[f"{rule}, mean {mean:g} candidates of {seeds} runs"] = None
    return found
