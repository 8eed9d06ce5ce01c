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
