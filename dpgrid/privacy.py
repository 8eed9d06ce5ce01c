"""Privacy plan of one grid (docs/protocol.md §3): one noise multiplier for K configurations x T steps.

Poisson sampling with rate q = B / N; the grid composes K * T subsampled Gaussian mechanisms and
the noise multiplier nu is the smallest one whose epsilon at delta is at most the target.

- privacy.accountant: rdp (Opacus's RDP analysis, the paper's moments accountant; default), pld
  (dp-accounting's privacy loss distributions) or prv (Opacus's PRV accountant): the last two are
  tighter, so they calibrate less noise for the same (epsilon, delta). This module only searches them.
- privacy.budget: per_grid (default, honest: the K runs share epsilon) or per_run (each configuration
  gets epsilon on its own, as most papers report); the grid's true cost is then recorded beside it.
- The Liu-Talwar random-stopping selection (Mohapatra et al. 2022, Theorem 1) is costed for comparison.
"""

import functools
import math
from dataclasses import asdict, dataclass, field

from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from . import DpgridError
from .plugins import arguments
from .selection import liu_talwar_parameters  # noqa: F401  (dpgrid.privacy.liu_talwar_parameters as before)

MAX_NOISE_MULTIPLIER = 1e4  # beyond this the target epsilon is treated as unreachable


def rdp_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, orders=None) -> float:
    """epsilon of `steps` compositions of the Poisson-subsampled Gaussian mechanism (Opacus RDP)."""
    # Opacus's default orders, plus large ones that matter for small epsilon or many steps.
    orders = orders or RDPAccountant.DEFAULT_ALPHAS + [80, 96, 128, 256, 512]
    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=orders)
    return float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])


def pld_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)), steps)
    return float(accountant.get_epsilon(delta))


def prv_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta=delta))


ACCOUNTANTS = {"rdp": rdp_epsilon, "pld": pld_epsilon, "prv": prv_epsilon}  # keys: checks.ACCOUNTANTS
NOT_DP_SAMPLING = "shuffle (not DP)"  # how plans, rows and tables mark runs no epsilon covers


def epsilon_of(accountant: str, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    return ACCOUNTANTS[accountant](sample_rate, noise_multiplier, steps, delta)


@functools.lru_cache(maxsize=1024)  # a pure function that takes seconds: a plan, its checks and tables ask again
def calibrate(epsilon: float, sample_rate: float, steps: int, delta: float, rtol: float = 1e-4,
              accountant: str = "rdp") -> float:
    """Smallest noise multiplier (to relative precision rtol) whose epsilon is at most the target."""
    return smallest_noise(lambda nu: epsilon_of(accountant, sample_rate, nu, steps, delta), epsilon, rtol,
                          f"for {steps} steps at sampling rate {sample_rate:.4g} and delta={delta}")


def smallest_noise(spent, epsilon: float, rtol: float, what: str) -> float:
    """Smallest nu (to relative precision rtol) with spent(nu) <= epsilon; spent falls as nu grows."""
    low, high = 0.0, 1.0
    while spent(high) > epsilon:
        low, high = high, 2 * high
        if high > MAX_NOISE_MULTIPLIER:
            floor = spent(MAX_NOISE_MULTIPLIER)
            raise DpgridError(f"privacy.epsilon={epsilon} is unreachable {what}: even noise multiplier "
                              f"{MAX_NOISE_MULTIPLIER:g} spends epsilon = {floor:.3g}; raise epsilon above that "
                              f"or shrink the grid")
    while high - low > rtol * high:
        mid = (low + high) / 2
        low, high = (low, mid) if spent(mid) <= epsilon else (mid, high)
    return high


@dataclass
class Plan:
    dataset: str
    strategy: str
    k: int
    n_configs: int
    n_train: int
    batch_size: int
    epochs: int
    steps: int                # T, per run
    sample_rate: float        # q = B / N
    epsilon: float            # the grid's target
    delta: float
    seeds: int
    account_seeds: bool
    composed_runs: int        # K, or K * seeds when seeds are accounted
    noise_multiplier: float   # nu of one step's (joint) Gaussian mechanism; 0 for nodp
    budget: str = "per_grid"  # per_grid: epsilon covers the K runs; per_run: each run on its own
    sampling: str = "poisson"  # or NOT_DP_SAMPLING: fixed-size batches, no epsilon claimed
    accountant: str = "rdp"
    per_query: dict = field(default_factory=dict)  # the strategy's split of nu (online, fixed_quantile)
    epsilon_spent: float = None  # what the budget covers, recomputed with the final nu (<= epsilon); None for nodp
    epsilon_grid: float = None   # the whole grid's true cost with this nu (= epsilon_spent when per_grid)
    epsilon_per_run: float = None  # one configuration's cost (its seeds too when they are accounted)
    epsilon_with_seeds: float = None  # what tables publish (means over seeds): K x seeds runs with this nu
    liu_talwar: dict = field(default_factory=dict)  # the cost of Liu-Talwar selection, for comparison
    selection: str = "composition"  # or random_stopping: only the best candidate is released (dpgrid.selection)
    stopping: dict = field(default_factory=dict)    # random stopping's rule and parameters
    schedule: dict = field(default_factory=dict)    # noise schedules: per configuration, its steps and epsilons
    model_parameters: int = 0
    label: str = ""           # the strategy's name in tables and figures
    private: bool = True      # False for a non-private baseline
    adapts: list = field(default_factory=list)  # quantities the strategy adapts (final_* columns)
    axes: list = field(default_factory=list)    # the grid's axes, e.g. ["lr", "clip"]
    dataset_epsilons: list = field(default_factory=list)  # the dataset's privacy levels (table rows)
    configurations: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("per_query"))
        return d


def make_plan(cfg, n_train: int, strategy_cls, configs: list, model_parameters: int) -> Plan:
    p, t = cfg.privacy, cfg.train
    batch_size, epochs = int(t.batch_size), int(t.epochs)
    steps = math.ceil(epochs * n_train / batch_size)
    sample_rate = batch_size / n_train
    per_config = int(t.seeds) if p.account_seeds else 1  # runs of one configuration that are accounted
    composed = len(configs) * per_config
    budget, accountant = str(p.get("budget", "per_grid")), str(p.get("accountant", "rdp"))
    plan = Plan(dataset=cfg.dataset.name, strategy=cfg.strategy.name, k=int(cfg.grid.k), n_configs=len(configs),
                label=str(cfg.strategy.get("label") or strategy_cls.label or cfg.strategy.name),
                private=bool(strategy_cls.private), adapts=list(strategy_cls.adapts), axes=list(cfg.strategy.grid),
                dataset_epsilons=[float(e) for e in cfg.dataset.get("epsilons", [p.epsilon])],
                n_train=n_train, batch_size=batch_size, epochs=epochs, steps=steps, sample_rate=sample_rate,
                epsilon=float(p.epsilon), delta=float(p.delta), seeds=int(t.seeds),
                account_seeds=bool(p.account_seeds), composed_runs=composed, noise_multiplier=0.0,
                budget=budget, accountant=accountant, sampling=str(t.get("sampling", "poisson")),
                model_parameters=model_parameters, configurations=configs)
    if hasattr(strategy_cls, "plan_privacy"):  # a strategy with its own accounting (noise schedules)
        strategy_cls.plan_privacy(plan, strategy_cls.problem(cfg, n_train), accountant)
    elif strategy_cls.private and p.get("selection", "composition") == "random_stopping":
        plan_selection(plan, p, strategy_cls, arguments(cfg.strategy))
    elif strategy_cls.private:
        budget_runs = composed if budget == "per_grid" else per_config
        nu = calibrate(plan.epsilon, sample_rate, budget_runs * steps, plan.delta, accountant=accountant)
        plan.noise_multiplier = nu
        plan.per_query = strategy_cls.split_noise(nu, arguments(cfg.strategy), batch_size)
        plan.epsilon_spent = epsilon_of(accountant, sample_rate, nu, budget_runs * steps, plan.delta)
        check_spent(plan)
        plan.epsilon_grid = (plan.epsilon_spent if budget == "per_grid"
                             else epsilon_of(accountant, sample_rate, nu, composed * steps, plan.delta))
        plan.epsilon_per_run = (plan.epsilon_spent if budget == "per_run"
                                else epsilon_of(accountant, sample_rate, nu, per_config * steps, plan.delta))
        plan.liu_talwar = liu_talwar_cost(plan.epsilon, plan.delta, len(configs), sample_rate, per_config * steps, nu)
        plan.epsilon_with_seeds = (plan.epsilon_grid if plan.account_seeds or plan.seeds == 1 else
                                   epsilon_of(accountant, sample_rate, nu, len(configs) * plan.seeds * steps, plan.delta))
    if plan.sampling == "shuffle":  # the noise is the Poisson plan's, but no analysis covers shuffled batches
        plan.epsilon_spent = plan.epsilon_grid = plan.epsilon_per_run = plan.epsilon_with_seeds = None
        plan.liu_talwar = {}
        plan.sampling = NOT_DP_SAMPLING
    return plan


def check_spent(plan: Plan) -> None:
    if not plan.epsilon_spent <= plan.epsilon:  # explicit: must hold under python -O too
        raise DpgridError(f"the calibrated noise spends epsilon = {plan.epsilon_spent:.6g} > the target "
                          f"{plan.epsilon:g}; refusing to run (please report this)")


def plan_selection(plan: Plan, p, strategy_cls, options: dict) -> None:
    """nu at which the whole random-stopping selection spends (epsilon, delta) (dpgrid.selection)."""
    from . import selection

    mean = float(p.stopping_mean) if p.get("stopping_mean") is not None else float(plan.n_configs)
    plan.selection, plan.account_seeds, plan.composed_runs = "random_stopping", True, plan.seeds
    plan.stopping = selection.parameters(str(p.stopping), float(p.stopping_eta), mean, plan.delta)
    steps = plan.seeds * plan.steps  # one candidate: its seeds' runs composed
    spent = lambda nu: selection.selection_epsilon(plan.sample_rate, nu, steps, plan.delta, plan.stopping)  # noqa: E731
    plan.noise_multiplier = smallest_noise(spent, plan.epsilon, 1e-4, f"by {plan.stopping['rule']} selection among "
                                           f"{mean:g} candidates (expected) of {steps} steps each")
    plan.per_query = strategy_cls.split_noise(plan.noise_multiplier, options, plan.batch_size)
    plan.epsilon_spent = plan.epsilon_grid = plan.epsilon_with_seeds = spent(plan.noise_multiplier)  # seeds accounted
    plan.epsilon_per_run = rdp_epsilon(plan.sample_rate, plan.noise_multiplier, steps, plan.delta)
    check_spent(plan)


def liu_talwar_cost(epsilon: float, delta: float, n_candidates: int, sample_rate: float, run_steps: int,
                    noise_multiplier: float) -> dict:
    """Both directions of the comparison: the nu LT needs for this (epsilon, delta), and the epsilon
    LT would spend with the composition's nu (RDP for the candidate, as Mohapatra et al.)."""
    eps1, delta1, upsilon = liu_talwar_parameters(epsilon, delta, n_candidates)
    nu = (calibrate(eps1, sample_rate, run_steps, delta1, rtol=1e-3) if eps1 > 0 else None)
    eps_candidate = rdp_epsilon(sample_rate, noise_multiplier, run_steps, delta1)
    return {"noise_multiplier": nu, "candidate_epsilon": eps1, "candidate_delta": delta1, "max_iterations": upsilon,
            "epsilon_with_composition_nu": 3 * eps_candidate + 3 * math.sqrt(2 * delta1)}


def alternatives(plan, eta: float, mean: float) -> dict:
    """nu for this plan's (epsilon, delta) under composition and under each stopping rule, side by side
    (None where unreachable): `dpgrid plan` prints them."""
    from .selection import RULES, parameters, selection_epsilon

    q, steps, seeds, k = plan.sample_rate, plan.steps, plan.seeds, plan.n_configs
    found = {}
    for name, runs in ((f"composition, {k} runs (seeds not accounted)", k),
                       (f"composition, {k * seeds} runs (seeds accounted)", k * seeds)):
        try:
            found[name] = calibrate(plan.epsilon, q, runs * steps, plan.delta)  # the plan's own precision
        except DpgridError:
            found[name] = None
    for rule in RULES:
        stopping = parameters(rule, eta, mean, plan.delta)
        spent = lambda nu: selection_epsilon(q, nu, seeds * steps, plan.delta, stopping)  # noqa: E731
        try:
            found[f"{rule}, mean {mean:g} candidates of {seeds} runs"] = smallest_noise(spent, plan.epsilon, 1e-4, "")
        except DpgridError:
            found[f"{rule}, mean {mean:g} candidates of {seeds} runs"] = None
    return found
