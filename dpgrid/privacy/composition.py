"""Composition (docs/protocol.md section 3): every configuration of the grid is trained, and its K runs of
T Poisson-subsampled Gaussian steps (K x seeds with privacy.account_seeds) compose. nu is the smallest
multiplier whose epsilon at delta is at most the target, under privacy.accountant.

privacy.budget=per_grid (the default, honest: the K runs share epsilon) or per_run (each configuration gets
epsilon on its own, as most papers report; the grid's true cost is recorded beside it). The cost of the
Liu-Talwar random-stopping selection (Mohapatra et al. 2022, Theorem 1) is recorded for comparison.
"""

import math
from dataclasses import dataclass

from dpgrid import DpgridError
from dpgrid.privacy.accountants import ACCOUNTANTS, calibrate, epsilon_curve
from dpgrid.privacy.method import AccountingMethod


class Composition(AccountingMethod):
    @dataclass(frozen=True)
    class Record:
        liu_talwar: dict  # the cost of Liu-Talwar selection, for comparison

    name = "composition"
    accountants = tuple(ACCOUNTANTS)
    covers = ("every run of the grid together: each configuration's trained models, learning curves and scores "
              "(runs.csv, curves.csv, summary.csv, model/); unless the seeds are accounted, one seed per configuration: "
              "the means over seeds that tables publish, and the model chosen from them, are covered by the epsilon "
              "with seeds")

    composes_statistics = True  # every epsilon below composes the model's private statistics (plan.statistics)

    @staticmethod
    def released_steps(plan):
        """Every run of every configuration (epsilon_with_seeds): K x seeds runs of T steps at (q, nu), after the
        model's private statistics where it has them."""
        if plan.noise_per_run or plan.sampling != "poisson":
            return None
        return [*(list(e) for e in plan.statistics),
                [plan.sample_rate, plan.noise_multiplier, plan.n_configs * plan.seeds * plan.steps]]

    def calibrate(self, plan, strategy_cls, options: dict, privacy: dict, problem: dict) -> dict:
        steps = budget_runs(plan) * plan.steps
        try:
            nu = calibrate(plan.epsilon, plan.sample_rate, steps, plan.delta, accountant=plan.accountant,
                           prior=plan.statistics)
        except DpgridError as e:  # RDP's and PRV's conversions have a floor that PLD's does not: say where it helps
            if plan.accountant == "pld" or not reachable(plan.epsilon, plan.sample_rate, steps, plan.delta, "pld"):
                raise
            raise DpgridError(f"{e}; or privacy.accountant=pld, which reaches it") from None
        return self.spent(plan, strategy_cls, options, nu)

    def spent(self, plan, strategy_cls, options: dict, nu: float) -> dict:
        """The plan's fields for noise multiplier nu: its split among the strategy's queries and what it spends."""
        q, steps, accountant, delta = plan.sample_rate, plan.steps, plan.accountant, plan.delta
        per_config = plan.seeds if plan.account_seeds else 1  # runs of one configuration that are accounted
        # each (steps, delta) asked once; RDP's curve computed once; the model's private statistics in every figure
        epsilon = epsilon_curve(accountant, q, nu, plan.statistics)
        # shuffled batches: no analysis covers them, so no selection's cost is compared either (make_plan claims none);
        # nor beside private statistics, which the comparison's formula does not compose
        cost = {} if plan.sampling == "shuffle" or plan.statistics else liu_talwar_cost(
            plan.epsilon, delta, plan.n_configs, q, per_config * steps, nu,
            epsilon if accountant == "rdp" else epsilon_curve("rdp", q, nu))
        return dict(noise_multiplier=nu, per_query=strategy_cls.split_noise(nu, options, plan.batch_size),
                    epsilon_spent=epsilon(budget_runs(plan) * steps, delta), epsilon_grid=epsilon(plan.composed_runs * steps, delta),
                    epsilon_per_run=epsilon(per_config * steps, delta), record=self.Record(cost),
                    epsilon_with_seeds=epsilon(plan.n_configs * plan.seeds * steps, delta))


def reachable(epsilon: float, sample_rate: float, steps: int, delta: float, accountant: str) -> bool:
    try:
        calibrate(epsilon, sample_rate, steps, delta, accountant=accountant)
    except DpgridError:
        return False
    return True


def budget_runs(plan) -> int:
    """How many runs the budget covers: the grid's K (K x seeds) per grid, one configuration's per run."""
    return plan.composed_runs if plan.budget == "per_grid" else (plan.seeds if plan.account_seeds else 1)


def liu_talwar_cost(epsilon: float, delta: float, n_candidates: int, sample_rate: float, run_steps: int,
                    noise_multiplier: float, rdp_curve) -> dict:
    """Both directions of the comparison: the nu LT needs for this (epsilon, delta), and the epsilon
    LT would spend with the composition's nu (RDP for the candidate, as Mohapatra et al.). A comparison only: where
    LT cannot reach the target (its per-candidate (epsilon_1, delta_1) are out of any noise's reach), its nu is None,
    recorded as unavailable, and the grid, which composition calibrates, trains."""
    eps1, delta1, upsilon = liu_talwar_parameters(epsilon, delta, n_candidates)
    try:
        nu = calibrate(eps1, sample_rate, run_steps, delta1, rtol=1e-3) if eps1 > 0 else None
    except DpgridError:  # unreachable for LT: no comparison, never a refusal of the grid
        nu = None
    eps_candidate = rdp_curve(run_steps, delta1)  # epsilon_curve("rdp", sample_rate, noise_multiplier)
    return {"noise_multiplier": nu, "candidate_epsilon": eps1, "candidate_delta": delta1, "max_iterations": upsilon,
            "epsilon_with_composition_nu": 3 * eps_candidate + 3 * math.sqrt(2 * delta1)}


def liu_talwar_parameters(epsilon_f: float, delta_f: float, n_candidates: int, delta_2: float = 1e-20):
    """Per-candidate (epsilon_1, delta_1) so that LT selection is (epsilon_f, delta_f)-DP.

    Liu & Talwar 2019, Theorem 3.4 (Mohapatra et al. 2022, Theorem 1): with stopping probability
    gamma = 1/K and Upsilon = log(1/delta_2) / gamma, LT is (3 e1 + 3 sqrt(2 d1), sqrt(2 d1) Upsilon + d2)-DP.
    Returns (epsilon_1, delta_1, Upsilon); epsilon_1 <= 0 means the target is out of LT's reach."""
    gamma = 1.0 / n_candidates
    upsilon = math.log(1 / delta_2) / gamma
    root = (delta_f - delta_2) / upsilon  # sqrt(2 delta_1)
    return (epsilon_f - 3 * root) / 3, root ** 2 / 2, upsilon
