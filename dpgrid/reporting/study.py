"""What the grids a table shows spend together on their dataset: the study's whole cost beside each grid's own
epsilon (the tables' footnote), from their plans' public figures alone (dpgrid.results.study composes the grids this
machine ran on a dataset, from its private ledger)."""

import json

import pandas as pd

def study_events(plan: dict, privacy: dict, procedure, noise_per_run: bool) -> str:
    """The Poisson-subsampled Gaussian steps every run of the grid took ([[q, nu, K x seeds x T]], JSON), what the
    study's composition over its grids reads ('' where the grid's epsilon is not such a composition: a selection's,
    a noise schedule's; its epsilon with seeds and delta are composed as they are)."""
    if procedure.releases_best_only or noise_per_run or privacy.get("sampling") != "poisson" or \
            privacy.get("epsilon_spent") is None or any(plan.get(k) is None for k in ("batch_size", "n_train", "steps")):
        return ""
    return json.dumps([[plan["batch_size"] / plan["n_train"], privacy["noise_multiplier"],
                        int(plan["n_configs"]) * int(plan.get("seeds", 1)) * int(plan["steps"])]])


def study_note(grids: pd.DataFrame) -> str:
    """What every grid of the tabled tree on one dataset spends together (the study's whole cost beside each grid's
    own): their steps composed by the RDP accountant (Opacus) at the largest delta, a selection's or a schedule's
    epsilon and delta added; infinite where a grid without differential privacy trained on the data."""
    from dpgrid.results.study import composed

    dataset = grids.dataset.iloc[0]
    private = grids[grids.private.astype(bool) & grids.epsilon_with_seeds.notna()]
    baseline = grids[~grids.private.astype(bool) | grids.epsilon_with_seeds.isna()]  # no epsilon claimed
    if not len(private):
        return ""
    delta = float(private.delta.astype(float).max())
    accounts = [{"epsilon": float(r.epsilon_with_seeds), "delta": float(r.delta),
                 "events": json.loads(r.study_events) if isinstance(r.study_events, str) and r.study_events else None}
                for r in private.itertuples()]
    total = composed(accounts, delta)
    note = (f"The study's whole cost on {dataset}: the {len(private)} private grid(s) tabled on it spend together "
            f"ε = {total['rdp']:.2f} at δ = {total['delta']:.2g} (composed by the Rényi DP accountant), beside each "
            "grid's own ε above; `dpgrid budget` composes every grid this machine ran on these data")
    if len(baseline):
        note += (f"; with the {len(baseline)} grid(s) trained on them without differential privacy (non-private "
                 "baselines, shuffled batches), no ε covers the study as a whole")
    return note + "."
