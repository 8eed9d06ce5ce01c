"""Figures a paper prints as they are: a short title, a caption beside each (and in the PDF) saying what the bars
are and what epsilon the points cost, points at one epsilon apart, the non-private baseline labelled so, learning
curves with a band over seeds and a panel only for what the strategy adapts."""

import pandas as pd
import pytest

from dpgrid.reporting.tables import write_tables

from .test_report import edit_plan, make_grid

pytest.importorskip("matplotlib")


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "outputs"
    for strategy, hp, adapts in (("online", {"lr": 0.316228}, ["clip", "lr"]),
                                 ("fixed_quantile", {"lr": 0.316228, "quantile": 0.5}, ["clip"]),
                                 ("fixed_threshold", {"lr": 0.316228, "clip": 1.0}, [])):
        for epsilon in (3, 5):
            folder = make_grid(root, "mnist", strategy, epsilon, 9, [("c0", hp, [90.0 + epsilon, 91.0 + epsilon], 0)])
            edit_plan(folder, adapts=adapts)
    make_grid(root, "mnist", "nodp", 3, 9, [("lr0", {"lr": 0.3}, [98.0, 98.2], 0)], folder=root / "nodp")
    return root


def drawn_figures(monkeypatch):
    from dpgrid.reporting import figures

    drawn, real = {}, figures.save

    def keep(fig, path, dpi, title="", caption=""):
        drawn[path.name] = fig
        return real(fig, path, dpi, title, caption)

    monkeypatch.setattr(figures, "save", keep)
    return drawn


def test_every_figure_has_its_caption_beside_it(tree):
    written = write_tables(tree)
    figures = [p for p in written if p.suffix in (".png", ".pdf")]
    assert figures and all(p.with_suffix(".txt").exists() for p in figures)
    caption = (tree / "tables" / "figures" / "mnist_k9.txt").read_text()
    assert "bars one standard deviation over those seeds (ddof 0)" in caption and "means over 2 seeds" in caption
    assert "costs more than the target ε: Fixed Quantile at ε = 3: 6.89" in caption and "which no ε covers" in caption
    assert b"/Subject" in (tree / "tables" / "figures" / "mnist_k9.pdf").read_bytes()
    curve = (tree / "tables" / "figures" / "curves" / "mnist_online_eps3_per_grid_k9.txt").read_text()
    assert "the mean over its 2 seed(s), the band one standard deviation over them" in curve and "C_t" in curve


def test_points_at_one_epsilon_stand_apart_and_the_baseline_is_non_private(tree, monkeypatch):
    drawn = drawn_figures(monkeypatch)
    write_tables(tree)
    ax = drawn["mnist_k9.png"].axes[0]
    lines = [line for line in ax.get_lines() if line.get_marker() == "o"]
    at_three = [min(line.get_xdata()) for line in lines]
    assert len(at_three) == 3 and len(set(at_three)) == 3  # three strategies at epsilon = 3, side by side
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "NoDP (non-private)" in labels and not any("ε" in label for label in labels)
    assert ax.get_title() == "mnist, k = 9"


@pytest.mark.parametrize("strategy, panels", [("online", ["accuracy %", "$C_t$", r"$\rho_t$"]),
                                              ("fixed_quantile", ["accuracy %", "$C_t$"]),
                                              ("fixed_threshold", ["accuracy %"])])
def test_a_learning_curve_has_a_panel_for_what_its_strategy_adapts_and_a_band(tree, monkeypatch, strategy, panels):
    from matplotlib.collections import PolyCollection

    drawn = drawn_figures(monkeypatch)
    write_tables(tree)
    fig = drawn[f"mnist_{strategy}_eps3_per_grid_k9.png"]
    assert [ax.get_ylabel() for ax in fig.axes] == panels
    assert all(any(isinstance(c, PolyCollection) for c in ax.collections) for ax in fig.axes)  # the band over seeds
    nodp = drawn["mnist_nodp_nonprivate_k9.png"]
    assert nodp._suptitle.get_text() == "NoDP (non-private)"


def test_a_non_private_plan_states_no_epsilon(tmp_path):
    import json

    from dpgrid.config import compile
    from dpgrid.runner import run_grid

    from .conftest import load_cfg

    spec = compile(load_cfg("digits", "nodp", **{"grid.k": 2, "train.epochs": 1, "train.seeds": 1}))
    run_grid(spec, tmp_path / "nodp", progress=False)
    plan = json.loads((tmp_path / "nodp" / "plan.json").read_text())
    assert plan["epsilon"] is None and plan["budget"] == "non-private" and plan["delta"] is None
    runs = pd.read_csv(tmp_path / "nodp" / "runs.csv")
    assert runs.epsilon.isna().all() and set(runs.budget) == {"non-private"}
