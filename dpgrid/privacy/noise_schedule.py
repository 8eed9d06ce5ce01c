"""Accounting of a noise schedule: full-batch noisy gradient descent (the PUR paper, Section 3.2 and
Proposition 4): each step releases the mean gradient, of sensitivity 2L/N under replacement, plus N(0, sigma_t^2 I),
a rho_t-zCDP Gaussian mechanism with rho_t = (2L/N)^2 / (2 sigma_t^2) = 2 L^2 / (N^2 sigma_t^2); zCDP composes
by addition, rho = sum_t rho_t (Bun & Steinke 2016).

Two conversions to (epsilon, delta):
- `zcdp`, the paper's:   epsilon = rho + 2 sqrt(rho log(1/delta))   (Bun & Steinke, Proposition 1.3);
- `rdp`, tighter: rho-zCDP is (alpha, alpha rho)-RDP at every order, converted as every dpgrid plan is (Opacus).
A run stops at the last step whose epsilon is within the target: epsilon_T <= target < epsilon_{T+1}.
"""

import math
from dataclasses import dataclass

from dpgrid import DpgridError
from dpgrid.privacy.method import ZERO_OUT_PUBLIC, ZERO_OUT_WORDS, AccountingMethod, Adjacency

ORACLE = "full batch; not private (oracle)"  # how plans, rows and tables mark the data-dependent schedule
CONVERSIONS = ("zcdp", "rdp")
ORDERS = [1 + x / 100 for x in range(1, 100)] + [2 + x / 10 for x in range(0, 80)] + list(range(10, 257)) + \
         [384, 512, 768, 1024, 2048, 4096]


def step_rho(sigma: float, lipschitz: float, n: int) -> float:
    return 2 * lipschitz ** 2 / (n ** 2 * sigma ** 2)


def epsilon(rho: float, delta: float, conversion: str = "zcdp") -> float:
    if rho <= 0:
        return 0.0
    if conversion == "zcdp":
        return rho + 2 * math.sqrt(rho * math.log(1 / delta))
    from opacus.accountants.analysis.rdp import get_privacy_spent

    return float(get_privacy_spent(orders=ORDERS, rdp=[a * rho for a in ORDERS], delta=delta)[0])


def rho_budget(target: float, delta: float, conversion: str = "zcdp") -> float:
    """The largest rho whose epsilon is at most the target (epsilon grows with rho)."""
    if conversion == "zcdp":  # invert epsilon = rho + 2 sqrt(rho log 1/delta): sqrt(rho) = -a + sqrt(a^2 + target)
        a = math.sqrt(math.log(1 / delta))
        return (math.sqrt(a * a + target) - a) ** 2
    low, high = 0.0, 1.0
    while epsilon(high, delta, conversion) <= target:
        low, high = high, 2 * high
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon(mid, delta, conversion) <= target else (low, mid)
    return low


def steps_within(sigmas, lipschitz: float, n: int, budget_rho: float, max_steps: int) -> tuple:
    """(T, rho_T): how many steps of the schedule `sigmas` (an iterable of sigma_1, sigma_2, ...) fit in the
    zCDP budget, at most max_steps."""
    total, steps = 0.0, 0
    for sigma in sigmas:
        cost = step_rho(sigma, lipschitz, n)
        if steps >= max_steps or total + cost > budget_rho:  # the rule NoisyGD.step applies too
            break
        total, steps = total + cost, steps + 1
    return steps, total


class NoiseSchedule(AccountingMethod):
    """Per configuration: T, the steps of the strategy's schedule (`sigmas`) that fit the budget, and the epsilon
    they spend under both conversions (the budget is met under privacy.accountant). Each run spends its epsilon
    on its own (per_run): the best constant of a grid is chosen in hindsight, as in the paper. A strategy
    whose schedule reads the data (`oracle`) claims no epsilon."""
    @dataclass(frozen=True)
    class Record:
        schedule: dict  # per configuration: its steps and epsilons

    name = "noise_schedule"
    accountants = CONVERSIONS
    # The mean gradient's sensitivity is 2L/N under replacement and L/N under zero-out: the schedule is accounted for
    # the larger, so its epsilon holds under zero-out too (a rho four times too large: conservative, as the paper).
    adjacency = Adjacency("zero-out", ZERO_OUT_WORDS, ZERO_OUT_PUBLIC,
                          "replace one example (the mean gradient's sensitivity 2L/N, as the PUR paper accounts it), "
                          "which bounds zero-out's L/N: its epsilon holds under zero-out a fortiori")
    covers = ("each run's output (its trained model, learning curve and score) by that run's own epsilon (plan.json's "
              "schedule); the grid's runs together, and the best constant chosen in hindsight, cost more")
    procedure = "dpgrid.results.schedule.NoiseScheduleProcedure"

    def calibrate(self, plan, strategy_cls, options: dict, privacy: dict, problem: dict) -> dict:
        conversion = plan.accountant
        budget = rho_budget(plan.epsilon, plan.delta, conversion)
        schedule, total = {}, 0.0
        for c in plan.configurations:
            steps, rho = plan.steps, math.nan  # the oracle stops where its own sigma_t exhaust the budget
            if not strategy_cls.oracle:
                hp = {k: v for k, v in c.items() if k != "config_id"}
                steps, rho = steps_within(strategy_cls.sigmas(hp, problem), problem["lipschitz"], problem["n"], budget,
                                          plan.steps)
                total += rho
            spent = {name: epsilon(rho, plan.delta, name) for name in CONVERSIONS}
            if not strategy_cls.oracle and not spent[conversion] <= plan.epsilon:  # explicit, also under python -O
                raise DpgridError(f"configuration {c['config_id']} would spend epsilon = {spent[conversion]:.6g} "
                                  f"> {plan.epsilon:g}; refusing to run (please report this)")
            schedule[c["config_id"]] = {"steps": steps, **{f"epsilon_{k}": v for k, v in spent.items()}}
        record = dict(budget="per_run", record=self.Record(schedule), noise_multiplier=math.nan,  # sigma_t varies per run
                      problem={**problem, "rho_budget": budget, "eta": 1 / (2 * problem["smoothness"])})
        if strategy_cls.oracle:
            return {**record, "sampling": ORACLE}
        worst = max(v[f"epsilon_{conversion}"] for v in schedule.values())
        return {**record, "sampling": "full batch", "epsilon_spent": worst, "epsilon_per_run": worst,
                "epsilon_grid": epsilon(total, plan.delta, conversion),
                "epsilon_with_seeds": epsilon(total * plan.seeds, plan.delta, conversion)}  # rho adds over seeds
