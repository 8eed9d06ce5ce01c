"""Figures a paper prints as they are: a short title, a caption beside each (and in the PDF) saying what the bars
are and what epsilon the points cost, points at one epsilon apart, the non-private baseline labelled so, learning
curves with a band over seeds and a panel only for what the strategy adapts."""

import pandas as pd
import pytest

from dpgrid.reporting.tables import write_tables

from .test_report import edit_plan, make_grid

pytest.importorskip("matplotlib")


def make_tree(root, strategies=("online", "fixed_quantile", "fixed_threshold"), epsilons=(3, 5)):
    for strategy, hp, adapts in (("online", {"lr": 0.316228}, ["clip", "lr"]),
                                 ("fixed_quantile", {"lr": 0.316228, "quantile": 0.5}, ["clip"]),
                                 ("fixed_threshold", {"lr": 0.316228, "clip": 1.0}, [])):
        if strategy not in strategies:
            continue
        for epsilon in epsilons:
            make_grid(root, "mnist", strategy, epsilon, 9, [("c0", hp, [90.0 + epsilon, 91.0 + epsilon], 0)],
                      adapts=adapts)
    make_grid(root, "mnist", "nodp", 3, 9, [("lr0", {"lr": 0.3}, [98.0, 98.2], 0)], folder=root / "nodp")
    return root


def kept_figures(patch) -> dict:
    """{file name: figure} of every figure the tables draw, kept instead of rendered (the tests that read the figures'
    objects need no PNG or PDF)."""
    from dpgrid.reporting import figures

    drawn = {}

    def keep(fig, path, dpi, title="", caption=""):
        drawn[path.name] = fig
        return [path]

    patch.setattr(figures, "save", keep)
    return drawn


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """The figures of one tree's tables, drawn once for the tests that read them."""
    with pytest.MonkeyPatch.context() as patch:
        found = kept_figures(patch)
        write_tables(make_tree(tmp_path_factory.mktemp("figures") / "outputs"))
    return found


@pytest.mark.slow  # renders every kind of figure, PNG and PDF (3-4 s); other captions are read in the fast layer
def test_every_figure_has_its_caption_beside_it(tmp_path):
    tree = make_tree(tmp_path / "outputs", ("online", "fixed_quantile"), (3,))  # each kind of figure, rendered
    written = write_tables(tree)
    figures = [p for p in written if p.suffix in (".png", ".pdf")]
    assert figures and all(p.with_suffix(".txt").exists() for p in figures)
    caption = (tree / "tables" / "figures" / "mnist_k9.txt").read_text()
    assert "bars one standard deviation over those seeds (ddof 0)" in caption and "means over 2 seeds" in caption
    assert "costs more than the target ε: Fixed Quantile at ε = 3: 6.89" in caption and "which no ε covers" in caption
    assert b"/Subject" in (tree / "tables" / "figures" / "mnist_k9.pdf").read_bytes()
    curve = (tree / "tables" / "figures" / "curves" / "mnist_online_eps3_per_grid_k9.txt").read_text()
    assert "the mean over its 2 seeds, the band one standard deviation over them" in curve and "C_t" in curve
    assert "δ = 1e-5" in curve and "(a mean over seeds) is covered by ε = 6.89" in curve
    assert (tree / "tables" / "figures" / "curves" / "mnist_online_eps3_per_grid_k9.pdf").exists()  # vector beside PNG


def test_points_at_one_epsilon_stand_apart_and_the_baseline_is_non_private(drawn):
    fig = drawn["mnist_k9.png"]
    ax = fig.axes[0]
    from dpgrid.reporting.figures import MARKERS

    lines = [line for line in ax.get_lines() if line.get_marker() in MARKERS]  # the points, not the bars' caps
    at_three = [min(line.get_xdata()) for line in lines]
    assert len(at_three) == 3 and len(set(at_three)) == 3  # three strategies at epsilon = 3, side by side
    assert len({line.get_marker() for line in lines}) == 3  # each its own marker: told apart in grayscale
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "NoDP (non-private)" in labels and not any("ε" in label for label in labels)
    assert ax.get_title() == "mnist, k = 9" and "δ = 1e-5" in ax.get_xlabel()
    assert fig.get_size_inches()[0] <= 3.5  # one column of a paper: its text prints at its size


@pytest.mark.parametrize("strategy, panels", [("online", ["accuracy %", "$C_t$", r"$\rho_t$"]),
                                              ("fixed_quantile", ["accuracy %", "$C_t$"]),
                                              ("fixed_threshold", ["accuracy %"])])
def test_a_learning_curve_has_a_panel_for_what_its_strategy_adapts_and_a_band(drawn, strategy, panels):
    from matplotlib.collections import PolyCollection

    fig = drawn[f"mnist_{strategy}_eps3_per_grid_k9.png"]
    assert [ax.get_ylabel() for ax in fig.axes] == panels
    assert all(any(isinstance(c, PolyCollection) for c in ax.collections) for ax in fig.axes)  # the band over seeds
    assert fig.axes[0].get_title() == "mnist: " + {"online": "Online", "fixed_quantile": "Fixed Quantile",
                                                    "fixed_threshold": "Fixed Threshold"}[strategy] + ", ε = 3 (ε per grid)"
    assert all(ax.get_yscale() == "log" for ax in fig.axes[1:])  # C_t and rho_t on one scale in every figure
    steps = fig.axes[-1].get_xticks()
    assert all(float(t).is_integer() for t in steps)  # whole steps
    nodp = drawn["mnist_nodp_nonprivate_k9.png"]
    assert nodp.axes[0].get_title() == "mnist: NoDP (non-private)"


def test_a_non_private_plan_states_no_epsilon(tmp_path):
    import json

    from dpgrid.config import compile
    from dpgrid.runner import train

    from .conftest import load_cfg

    spec = compile(load_cfg("digits", "nodp", **{"grid.k": 2, "train.epochs": 1, "train.seeds": 1}))
    train(spec, tmp_path / "nodp", progress=False)
    plan = json.loads((tmp_path / "nodp" / "plan.json").read_text())
    assert plan["epsilon"] is None and plan["budget"] == "non-private" and plan["delta"] is None
    runs = pd.read_csv(tmp_path / "nodp" / "runs.csv")
    assert runs.epsilon.isna().all() and set(runs.budget) == {"non-private"}


def test_mixed_budgets_are_drawn_as_their_caption_says(tmp_path, monkeypatch):
    """--mix-budgets: a strategy's per-grid and per-run grids at one epsilon are two series, each with its own legend
    entry and marker, shifted apart (never one line joining two budgets)."""
    root = tmp_path / "outputs"
    make_grid(root, "mnist", "online", 3, 9, [("c0", {"lr": 0.3}, [90.0, 91.0], 0)])
    make_grid(root, "mnist", "online", 3, 9, [("c0", {"lr": 0.3}, [93.0, 94.0], 0)], budget="per_run")
    drawn = kept_figures(monkeypatch)
    write_tables(root, mix_budgets=True)
    from dpgrid.reporting.figures import MARKERS

    fig = drawn["mnist_k9.png"]
    lines = [line for line in fig.axes[0].get_lines() if line.get_marker() in MARKERS]
    assert len(lines) == 2 and len({float(line.get_xdata()[0]) for line in lines}) == 2
    assert len({line.get_marker() for line in lines}) == 2
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["Online (ε per grid)", "Online (ε per run)"]
    caption = (root / "tables" / "figures" / "mnist_k9.txt").read_text()
    assert "one series per budget" in caption and "shifted apart" in caption
