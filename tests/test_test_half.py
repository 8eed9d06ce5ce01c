"""data.validation=test_half: a fixed, stratified half of the public test set chooses the best configuration and the
default seed, and every reported score (runs' report_value, summary, the console, model.json, the tables) is measured
on the other half, which chooses nothing."""

import json

import pandas as pd
import pytest
import torch

from dpgrid import data as data_mod
from dpgrid.api import tables
from dpgrid.config import compile
from dpgrid.runner import train

from .conftest import load_cfg

SMALL = {"grid.k": 3, "train.seeds": 2, "train.epochs": 2, "train.eval_every": 5}


def digits_data():
    from dpgrid.data import load
    from dpgrid.specs import dataset_spec

    return load(dataset_spec(load_cfg("digits", "online").dataset), "unused")


def test_the_halves_are_fixed_stratified_disjoint_and_seeded_by_the_dataset_name():
    data = digits_data()
    one, again = data_mod.test_halves(data, "digits"), data_mod.test_halves(data, "digits")
    assert torch.equal(one.x_test, again.x_test) and torch.equal(one.x_report, again.x_report)
    assert len(one.x_test) + len(one.x_report) == len(data.x_test)
    rows = {tuple(r.tolist()) for r in data.x_test}
    assert {tuple(r.tolist()) for r in one.x_test} | {tuple(r.tolist()) for r in one.x_report} == rows
    for c in range(10):  # each class split in two, the odd example to the report half
        total = int((data.y_test == c).sum())
        assert int((one.y_test == c).sum()) == total // 2 and int((one.y_report == c).sum()) == total - total // 2
    other = data_mod.test_halves(data, "digits_copy")
    assert not torch.equal(one.x_test, other.x_test)  # another name, another fixed split
    assert torch.equal(one.x_train, data.x_train)  # the training data untouched: no privacy is spent on either half


def test_the_selection_half_chooses_and_the_report_half_reports(tmp_path, monkeypatch):
    """Scrambling the report half's labels changes every reported score and nothing that was chosen."""
    spec = compile(load_cfg("digits", "online", **SMALL, **{"data.validation": "test_half"}))
    assert spec.config_hash != compile(load_cfg("digits", "online", **SMALL)).config_hash
    train(spec, tmp_path / "a" / "grid", progress=False)
    halves = data_mod.test_halves

    def scrambled(data, name):
        split = halves(data, name)
        return data_mod.Data(split.x_train, split.y_train, split.x_test, split.y_test, split.task, split.files,
                             split.x_report, (split.y_report + 3) % 10)

    monkeypatch.setattr(data_mod, "test_halves", scrambled)
    train(spec, tmp_path / "b" / "grid", progress=False)
    a, b = (pd.read_csv(tmp_path / n / "grid" / "summary.csv") for n in "ab")
    assert a[a.best].config_id.tolist() == b[b.best].config_id.tolist()
    assert a["mean"].tolist() == b["mean"].tolist()  # what chose: the selection half's, the same
    assert (a.report_mean - b.report_mean).abs().max() > 10  # what was reported: the report half's
    runs, curves = (pd.read_csv(tmp_path / "a" / "grid" / f) for f in ("runs.csv", "curves.csv"))
    for run in runs.itertuples():  # each run's reported value: the report half's at the step the selection half chose
        at = curves[(curves.config_id == run.config_id) & (curves.seed == run.seed) & (curves.step == run.best_step)]
        assert float(at.report_value.iloc[0]) == pytest.approx(run.report_value)
    statement = json.loads((tmp_path / "a" / "grid" / "model" / "model.json").read_text())
    best = a[a.best].iloc[0]
    assert statement["score"]["value"] == pytest.approx(best.report_mean) and "report half" in statement["score"]["what"]
    assert all("selection_value" in e for e in statement["models"]) and "selection half" in statement["chosen_by"]
    chosen = max(statement["models"], key=lambda e: (e["selection_value"], -e["seed"]))["seed"]
    assert statement["default_seed"] == chosen  # the default seed chosen on the selection half
    written = tables(str(tmp_path / "a"), figures=False, report=lambda line: None)
    results = pd.read_csv([p for p in written if str(p).endswith("results.csv")][0])
    assert set(results.validation) == {"test_half"}
    row = results.iloc[0]
    assert row.value == pytest.approx(best.report_mean) and row["std"] == pytest.approx(best.report_std)
    markdown = "\n".join(open(p).read() for p in written if str(p).endswith(".md"))
    assert "Scored on the report half of the test set" in markdown


def test_the_console_names_the_half_it_reports():
    from dpgrid.reporting.console import describe_best

    summary = pd.DataFrame([{"config_id": "lr0", "lr": 0.1, "mean": 80.0, "std": 1.0, "report_mean": 78.5,
                             "report_std": 1.5, "n_seeds": 5, "n_diverged": 0, "best": True}])
    line = describe_best(summary, "classification")
    assert "78.5 ± 1.5 over 5 seed(s) on the report half of the test set (chosen on the selection half: 80)" in line
