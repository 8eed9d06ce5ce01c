"""The README's promises that are words, not code: they must stay stated (privacy in every mode, point 2)."""

from .conftest import ROOT


def guarantees() -> str:
    text = (ROOT / "README.md").read_text()
    return " ".join(text[text.index("## Guarantees"):].split())


def test_guarantees_say_seeded_runs_are_for_reproduction_and_point_to_secure_mode():
    g = guarantees()
    assert "the ε of a seeded run holds only against an adversary who does not know the seeds" in g
    assert "For sensitive data use `privacy.secure_rng=true`" in g


def test_guarantees_state_what_is_not_covered():
    g = guarantees()
    for topic in ("*Timing side channels.*", "*Floating-point attacks on the Gaussian sampler.*",
                  "*Composition with anything outside dpgrid.*", "*Shuffled batches.*"):
        assert topic in g, topic


def test_the_readmes_accounting_figures_are_what_dpgrid_plan_prints():
    """The README quotes per-grid RDP nu for MNIST fixed_threshold, k = 7, epsilon = 3, and the Liu-Talwar comparison:
    each must be the plan's own number at the precision quoted."""
    import dpgrid

    readme = (ROOT / "README.md").read_text()
    plan = dpgrid.plan(dpgrid.compose(["dataset=mnist", "strategy=fixed_threshold", "grid.k=7"]))
    assert f"per grid RDP {plan.noise_multiplier:.3f}" in readme
    small = dpgrid.plan(dpgrid.compose(["dataset=mnist", "strategy=online", "grid.k=7"]))
    assert (f"K = 7: ν {small.noise_multiplier:.2f} vs {small.liu_talwar['noise_multiplier']:.2f} for LT" in readme
            and f"K = 49: {plan.noise_multiplier:.2f} vs {plan.liu_talwar['noise_multiplier']:.2f}" in readme)
