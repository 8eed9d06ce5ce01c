"""Tables, captions and figures state the epsilon that covers each grid's released model (model.json's covered_by,
composed where it was fine-tuned from a private checkpoint on the same data), say when a grid released none, tell
variants of one cell apart in titles and captions, fit the paper's column, and draw no one-point curve."""

import json

import pandas as pd
import pytest

from dpgrid.reporting.tables import write_tables
from dpgrid.results.statement import grid_plan, sealed

from .conftest import fast_layer_runs, load_cfg
from .test_report import edit_plan, make_grid, write

CHECKPOINT = {"init": {"sha256": "ab" * 32, "provenance": {"private": True, "dataset": "mnist"}}}


def release(folder, epsilon):
    """model/model.json as a grid seals it, covered by `epsilon` (the fields the tables read: its plan and seal)."""
    plan = json.loads((folder / "plan.json").read_text())
    record = {"covered_by": {"epsilon": epsilon, "delta": 1e-5}, "plan": grid_plan(plan)}
    (folder / "model").mkdir()
    (folder / "model" / "model.json").write_text(json.dumps(sealed(record)))


def fine_tuned_beside_scratch(root, released=True):
    """Online at epsilon = 3 twice in one cell: from scratch, and fine-tuned from a private checkpoint of the same data
    (its release covered by both grids together, 9.5), and fixed_threshold, which released nothing."""
    scratch = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [90.0, 91.0], 0)],
                        folder=root / "scratch")
    tuned = make_grid(root, "mnist", "online", 3, 9, [("lr3", {"lr": 0.1}, [92.0, 93.0], 0)], folder=root / "tuned")
    edit_plan(tuned, start=CHECKPOINT)
    make_grid(root, "mnist", "fixed_threshold", 3, 9, [("lr0_clip0", {"lr": 0.003162, "clip": 0.01}, [80.0, 81.0], 0)],
              folder=root / "unreleased")
    if released:
        release(scratch, json.loads((scratch / "plan.json").read_text())["epsilon_with_seeds"])
        release(tuned, 9.5)
    return scratch, tuned


def test_the_table_states_the_epsilon_that_covers_each_released_model(tmp_path):
    root = tmp_path / "outputs"
    fine_tuned_beside_scratch(root)
    _, lines = write(root)
    assert lines == []
    results = pd.read_csv(root / "tables" / "results.csv").set_index("path")
    assert results.loc[str(root / "tuned"), "epsilon_released"] == 9.5
    scratch = results.loc[str(root / "scratch")]
    assert scratch.epsilon_released == pytest.approx(scratch.epsilon_with_seeds) and scratch.released
    assert not results.loc[str(root / "unreleased"), "released"]
    assert pd.isna(results.loc[str(root / "unreleased"), "epsilon_released"])
    table = pd.read_csv(root / "tables" / "mnist_k9.csv")
    by_start = table.set_index("start")
    assert by_start.loc["from abababab (private, mnist)", "Online ε model"] == 9.5  # composed: shown
    assert by_start.loc["from abababab (private, mnist)", "Online ε seeds"] < 9.5  # its own grid's cost beside it
    md = (root / "tables" / "mnist_k9.md").read_text()
    assert "| 9.50 |" in md and "ε model: the ε that covers each grid's released model" in md
    assert "No released model" in md and "Fixed Threshold, from scratch at ε = 3" in md
    tex = (root / "tables" / "mnist_k9.tex").read_text()
    assert r"$\varepsilon$ model" in tex and "9.50" in tex


def test_without_a_composed_release_the_caption_says_the_row_covers_it(tmp_path):
    root = tmp_path / "outputs"
    folder = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [90.0, 91.0], 0)])
    release(folder, json.loads((folder / "plan.json").read_text())["epsilon_with_seeds"])
    write(root)
    md = (root / "tables" / "mnist_k9.md").read_text()
    assert "ε model" not in md  # no column where it would repeat what the row shows
    assert "Each grid's released model (model/) is covered by the ε its row shows (its ε seeds)." in md


def test_a_release_edited_after_its_seal_is_not_tabled(tmp_path):
    root = tmp_path / "outputs"
    _, tuned = fine_tuned_beside_scratch(root)
    statement = json.loads((tuned / "model" / "model.json").read_text())
    statement["covered_by"]["epsilon"] = 3.0  # a smaller epsilon, written by hand
    (tuned / "model" / "model.json").write_text(json.dumps(statement))
    _, lines = write(root)
    assert len(lines) == 1 and str(tuned / "model" / "model.json") in lines[0] and "does not match its seal" in lines[0]
    assert str(tuned) not in set(pd.read_csv(root / "tables" / "results.csv").path)


def test_two_grids_of_one_cell_are_told_apart_in_the_curves_titles_and_captions(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from .test_figures import kept_figures

    root = tmp_path / "outputs"
    fine_tuned_beside_scratch(root)
    drawn = kept_figures(monkeypatch)
    write_tables(root, report=lambda line: None)
    curves = {name: fig for name, fig in drawn.items() if name.startswith("mnist_online_eps3") and name.endswith(".png")}
    titles = sorted(fig.axes[0].get_title() for fig in curves.values())
    assert len(titles) == 2 and titles[0] != titles[1]
    assert any("from abababab (private, mnist)" in t for t in titles) and any("from scratch" in t for t in titles)
    captions = sorted(p.read_text() for p in (root / "tables" / "figures" / "curves").glob("mnist_online_eps3*.txt"))
    assert len(captions) == 2 and captions[0] != captions[1]
    tuned = next(c for c in captions if "from abababab" in c)
    assert "Its released model (model/) is covered by ε = 9.50: both grids together" in tuned
    scratch = next(c for c in captions if "from scratch" in c)
    assert "Its released model (model/) is covered by the same ε." in scratch
    metric = (root / "tables" / "figures" / "mnist_k9.txt").read_text()
    assert "Online, from abababab (private, mnist) at ε = 3 is covered by ε = 9.50" in metric
    assert "No released model" in metric and "Fixed Threshold, from scratch at ε = 3" in metric


def outside(fig, artists) -> list:
    """The artists that do not lie within the figure, rendered as saved (Agg, the figure's own size)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the tables closed the figure: drawn again on a canvas of its own
    canvas.draw()
    box, renderer = fig.bbox, canvas.get_renderer()
    extents = [(artist, artist.get_window_extent(renderer)) for artist in artists]
    return [artist for artist, e in extents if not (box.x0 <= e.x0 + 0.5 and e.x1 <= box.x1 + 0.5
                                                    and box.y0 <= e.y0 + 0.5 and e.y1 <= box.y1 + 0.5)]


@pytest.mark.parametrize("strategies, starts", fast_layer_runs([(1, 2), (2, 5)], (1, 2)))
def test_legends_and_titles_never_clip_at_the_columns_width(tmp_path, monkeypatch, strategies, starts):
    """Series named by long starts (fine-tuned from checkpoints, LoRA on named layers), several per strategy: every
    legend, title and axis label lies within the figure, rendered at the paper's column width."""
    pytest.importorskip("matplotlib")
    from .test_figures import kept_figures

    root = tmp_path / "outputs"
    for i in range(starts):
        for strategy, hp in (("online", {"lr": 0.316228}), ("fixed_quantile", {"lr": 0.316228, "quantile": 0.5}))[
                :strategies]:
            folder = make_grid(root, "fashion_mnist", strategy, 3, 9, [("c0", hp, [0.02, 0.03], 0)], "mse",
                               folder=root / f"{strategy}{i}", adapts=["clip"])
            edit_plan(folder, start={"init": {"sha256": f"{i:02d}" * 32, "provenance": {"private": True,
                                                                                       "dataset": "fashion_mnist"}},
                                     "lora": {"rank": 8, "targets": ["encoder.blocks.*.attention.qkv",
                                                                     "encoder.blocks.*.mlp.fc1"]}})
    drawn = kept_figures(monkeypatch)
    write_tables(root, report=lambda line: None)
    drawn = {name: fig for name, fig in drawn.items() if name.endswith(".png")}  # (the PDF is the same figure)
    assert len(drawn) == 1 + strategies * starts
    for name, fig in drawn.items():
        assert fig.get_size_inches()[0] <= 3.4 + 1e-9, name
        artists = [ax.title for ax in fig.axes] + [ax.xaxis.label for ax in fig.axes] + list(fig.legends)
        assert outside(fig, artists) == [], name
    legend = drawn["fashion_mnist_k9.png"].legends[0]
    assert len(legend.get_texts()) == strategies * starts  # every series named, none dropped to fit


def test_a_run_validated_once_draws_no_curve_and_says_so(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from .test_figures import kept_figures

    root = tmp_path / "outputs"
    folder = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [90.0, 91.0], 0)])
    once = pd.read_csv(folder / "curves.csv")
    once[once.step == 100].to_csv(folder / "curves.csv", index=False)  # T at most eval_every: one validation
    from dpgrid.results.seal import seal

    seal(folder)
    drawn, lines = kept_figures(monkeypatch), []
    write_tables(root, report=lines.append)
    assert sorted(drawn) == ["mnist_k9.pdf", "mnist_k9.png"]  # the metric figure only
    assert len(lines) == 1 and "no learning-curve figure of Online at ε = 3" in lines[0]
    assert "validated once" in lines[0]


def test_one_epoch_is_said_in_the_singular(tmp_path):
    root = tmp_path / "outputs"
    make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [90.0, 91.0], 0)], settings={"epochs": 1})
    write(root)
    assert "All grids: 1 epoch, " in (root / "tables" / "mnist_k9.md").read_text()


@pytest.mark.slow  # trains three digits grids
def test_a_grid_fine_tuned_on_the_same_data_is_tabled_with_its_composed_epsilon(tmp_path):
    """The issue's case on digits: a base grid, a grid fine-tuned from its release on the same data and one from
    scratch at the same epsilon. The table shows the fine-tuned grid's composed epsilon, as its model.json states it."""
    from dpgrid.config import compile
    from dpgrid.runner import train

    common = {"grid.k": 2, "train.seeds": 2, "train.epochs": 1, "train.eval_every": 4}
    root = tmp_path / "outputs"
    train(compile(load_cfg("digits", "online", **common, **{"privacy.epsilon": 4})), root / "base", progress=False)
    init = root / "base" / "model" / "seed0.safetensors"
    train(compile(load_cfg("digits", "online", **common, **{"privacy.epsilon": 2, "model.init": init})),
          root / "tuned", progress=False)
    train(compile(load_cfg("digits", "online", **common, **{"privacy.epsilon": 2})), root / "scratch", progress=False)
    lines = []
    write_tables(root, figures=False, report=lines.append)
    assert lines == []
    covered = json.loads((root / "tuned" / "model" / "model.json").read_text())["covered_by"]["epsilon"]
    own = json.loads((root / "tuned" / "plan.json").read_text())["epsilon_with_seeds"]
    assert covered > own  # both grids together
    table = pd.read_csv(root / "tables" / "digits_k2.csv")
    tuned = table[table.start.str.contains("private, digits")].iloc[0]
    assert tuned["Online ε model"] == pytest.approx(covered) and tuned["Online ε seeds"] == pytest.approx(own)
    scratch = table[(table.start == "from scratch") & (table["ε"] == 2)].iloc[0]
    assert scratch["Online ε model"] == pytest.approx(scratch["Online ε seeds"])
    assert f"{covered:.2f}" in (root / "tables" / "digits_k2.md").read_text()
