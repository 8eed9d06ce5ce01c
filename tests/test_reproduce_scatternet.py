"""scripts/reproduce_scatternet.py: the tuned parts repeat the whole tuned experiment, and score it on data it did not
choose with (the report half of the test set)."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from .conftest import script_module
from .test_data import make_idx_root

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce_scatternet.py"


@pytest.fixture(scope="module")
def script():
    return script_module(SCRIPT, "reproduce_scatternet")


def test_a_repetition_takes_the_run_its_own_seed_chose_on_the_selection_half(script):
    runs = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1], "config_id": ["a", "b", "c"] * 2, "lr": [1.0, 2.0, 4.0] * 2,
                         "clip": [0.1] * 6, "diverged": [False, False, True, False, False, False],
                         "best_value": [90.0, 95.0, 99.0, 97.0, 96.0, 10.0],
                         "report_value": [91.0, 93.0, 98.0, 94.0, 99.0, 11.0]})
    chosen = script.repetitions(runs)
    # seed 0: b (c diverged, however it scored); seed 1: a, scored by its report half (94), not by what chose it
    assert chosen.config_id.tolist() == ["b", "a"] and chosen.report_value.tolist() == [93.0, 94.0]


def test_the_tuned_parts_choose_on_one_half_and_random_stopping_pays_one_seed_per_candidate(script):
    import argparse

    a = argparse.Namespace(base_lrs=[0.25, 1.0], clips=[0.1, 1.0], data_root="data", set=["train.threads=1"])
    paper = script.overrides("mnist", "scatternet_linear", "paper", 5, a)
    composition = script.overrides("mnist", "scatternet_linear", "composition", 5, a)
    stopping = script.overrides("mnist", "scatternet_linear", "random_stopping", 5, a, repetition=3)
    assert "data.validation=test_half" not in paper and "+strategy.axes.lr=[8]" in paper
    assert {"data.validation=test_half", "train.seeds=5", "+strategy.axes.lr=[2,8]"} <= set(composition)
    assert {"data.validation=test_half", "train.seeds=1", "privacy.selection.stopping_seed=3",
            "privacy/selection=random_stopping"} <= set(stopping)
    assert stopping[-1] == "train.threads=1"  # the user's overrides come last, so they win


@pytest.mark.slow  # a tiny grid, two selections and the report half scored again, on 60 generated images
def test_the_tuned_cells_report_each_repetition_and_read_back_what_each_grid_released(script, tmp_path, monkeypatch):
    monkeypatch.setenv("DPGRID_LEDGER", str(tmp_path / "ledger"))
    make_idx_root(tmp_path, "MNIST", n_train=60, n_test=20)
    monkeypatch.setattr(sys, "argv", [
        "reproduce_scatternet.py", "--data-root", str(tmp_path), "--results", str(tmp_path / "results"), "--out",
        str(tmp_path / "out"), "--datasets", "mnist", "--models", "scatternet_linear", "--parts", "composition",
        "random_stopping", "--seeds", "2", "--repetitions", "2", "--base-lrs", "0.25", "1", "--clips", "0.1", "1",
        "--quiet", "--set", "train.batch_size=6", "train.steps=2", "train.eval_every=1", "dataset.n_train=60",
        "train.threads=1"])
    script.main()
    table = pd.read_csv(tmp_path / "out" / "table.csv").set_index("part")
    composed = pd.read_csv(tmp_path / "results" / "mnist" / "scatternet_linear" / "composition" / "runs.csv")
    for seed in (0, 1):  # each seed's own choice, read back from the grid's runs
        mine = composed[composed.seed == seed]
        best = mine.loc[mine.best_value.idxmax()]
        assert f"{best.report_value:.2f}" == table.loc["composition", "values"].split()[seed]
    assert table.loc["composition", "seeds"] == 2 and table.loc["composition", "scored_on"] == "report half of test"
    scores = []
    for r in (0, 1):
        released = json.loads((tmp_path / "results" / "mnist" / "scatternet_linear" / "random_stopping" /
                               f"repetition{r}" / "model" / "model.json").read_text())
        assert released["covered_by"]["epsilon"] <= 3 + 1e-6 and len(released["models"]) == 1
        scores.append(f"{released['score']['value']:.2f}")
    assert table.loc["random_stopping", "values"].split() == scores
    assert "| MNIST | ScatterNet + linear |" in (tmp_path / "out" / "table.md").read_text()
    # the paper's setting is scored on the report half through load_model: on a grid that chose on the selection half,
    # that gives back what its own training measured on the report half (each released model's test_value)
    out = tmp_path / "results" / "mnist" / "scatternet_linear" / "composition"
    measured = [m["test_value"] for m in json.loads((out / "model" / "model.json").read_text())["models"]]
    assert script.report_half(out, "mnist", str(tmp_path)) == pytest.approx(measured, abs=1e-6)
