"""What a grid of a noise schedule (dpgrid.privacy.noise_schedule: full-batch noisy gradient descent, the PUR
track) trains and says: each configuration's own T, the steps of its schedule that fit the budget, and each run's own
epsilon in its row."""

from dpgrid.results.procedure import Procedure, configuration_lines


class NoiseScheduleProcedure(Procedure):
    def describe(self, plan) -> list:
        """How many iterations of each configuration fit the budget, under both conversions."""
        p = plan.problem
        lines = [f"  full-batch noisy gradient descent: L = {p['lipschitz']:.4g}, M = {p['smoothness']:.4g}, eta = "
                 f"1/(2M) = {p['eta']:.4g}, lambda = {p['l2']:g}, Z = {p['feature_bound']:g}, R = {p['radius']:.4g}, "
                 f"d = {p['d']}"]
        claim = ("NOT PRIVATE (oracle): the schedule reads the gradient norm; epsilon below is what it would spend were "
                 "that free" if plan.epsilon_spent is None else f"each run spends at most epsilon = {plan.epsilon:g} on "
                 "its own")
        lines.append(f"  budget (eps, delta) = ({plan.epsilon:g}, {plan.delta:g}), zCDP rho <= {p['rho_budget']:.5g} "
                     f"({plan.accountant} conversion): {claim}")
        if plan.epsilon_spent is not None and plan.epsilon_with_seeds is not None and \
                plan.epsilon_with_seeds > plan.epsilon_grid * (1 + 1e-9):
            lines.append(f"  tables publish means over {plan.seeds} seeds: {plan.n_configs} x {plan.seeds} runs with this "
                         f"noise spend eps = {plan.epsilon_with_seeds:.5g} ({plan.accountant}; epsilon_with_seeds)")
        notes = {config_id: (f": stops where its budget ends (at most {s['steps']:,} iterations)" if plan.epsilon_spent is None
                             else f": {s['steps']:,} iterations fit; eps (zcdp) = {s['epsilon_zcdp']:.4g}, eps (rdp) = "
                             f"{s['epsilon_rdp']:.4g}") for config_id, s in plan.record.schedule.items()}
        return lines + configuration_lines(plan, notes)

    def run_steps(self, plan, config_id: str) -> int:
        return plan.record.schedule.get(config_id, {}).get("steps", plan.steps)

    def spent_fields(self, plan, config_id: str, result) -> dict:
        """Each run's own T (the oracle's stops where its budget does) and, for a schedule that claims one, its own
        epsilon under both conversions."""
        fields = {"steps": result.steps}
        if config_id in plan.record.schedule and plan.epsilon_spent is not None:
            spent = plan.record.schedule[config_id]
            fields.update(epsilon_spent=spent[f"epsilon_{plan.accountant}"],
                          **{k: v for k, v in spent.items() if k.startswith("epsilon_")})
        return fields
