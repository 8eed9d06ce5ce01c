"""Tables vouch for every field they publish: each comes from the rows whose hash matches plan.json (or is
recomputed from them), or the grid is skipped in one line naming the file and the field, and the other grids still
get their tables. Identifier columns stay text wherever dpgrid reads a CSV."""

import json

import pandas as pd
import pytest

from dpgrid.reporting.tables import write_tables

from .conftest import fast_layer_runs
from .test_report import edit_plan, edit_runs, make_grid, write


@pytest.fixture
def two(tmp_path):
    root = tmp_path / "outputs"
    online = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.16, 92.22], 0),
                                                        ("lr3", {"lr": 0.1}, [80.0, 81.0], 0)])
    other = make_grid(root, "mnist", "fixed_threshold", 3, 9, [("lr0_clip5", {"lr": 0.003162, "clip": 3.162}, [91.0, 92.0], 0)])
    return root, online, other


def skipped_only(root, folder, message):
    _, lines = write(root)
    assert len(lines) == 1 and str(folder) in lines[0] and message in lines[0], lines
    results = pd.read_csv(root / "tables" / "results.csv")
    assert list(results.strategy) == ["fixed_threshold"]  # the other grid is still tabled


@pytest.mark.parametrize("damage, message", [
    (lambda f: edit_plan(f, epsilon_with_seeds=3.0), "plan.json says epsilon_with_seeds = 3.0 but runs.csv says"),
    (lambda f: edit_plan(f, accountant="pld"), "plan.json says accountant = pld but runs.csv says rdp"),
    (lambda f: edit_plan(f, private=False), "plan.json says private = False but runs.csv says True"),
    (lambda f: edit_plan(f, axes=["lr", "clip"]), "plan.json names the axes lr, clip but its configurations"),
    (lambda f: edit_plan(f, axes=[]), "plan.json names the axes none but its configurations"),
    (lambda f: edit_plan(f, adapts=["clip"]), "plan.json says the strategy adapts clip but"),
    (lambda f: edit_plan(f, configurations=[{"config_id": "lr4", "lr": 1.0}, {"config_id": "lr3", "lr": 0.1}]),
     "configuration lr4 has lr = 0.316228, plan.json 1.0"),
    (lambda f: edit_runs(f, lambda r: r.assign(best_value=[500, 1, 2, 3])), "best_value = 500 is outside accuracy's range"),
    (lambda f: edit_runs(f, lambda r: r.assign(best_value=[-5, 1, 2, 3])), "best_value = -5 is outside accuracy's range"),
])
def test_an_edited_field_skips_its_grid_naming_it(two, damage, message):
    root, online, _ = two
    damage(online)
    skipped_only(root, online, message)


@pytest.mark.parametrize("column", ["config_hash", "epsilon", "strategy", "k", "accountant", "seed", "best_value",
                                    "diverged", "steps"])
def test_a_runs_csv_missing_a_column_is_skipped_in_one_line(two, column):
    root, online, _ = two
    if column == "config_hash":  # a grid that records its hash: rows without one could be another config's
        edit_plan(online, config_hash="aaaa")
        edit_runs(online, lambda r: r.assign(config_hash="aaaa"))
    edit_runs(online, lambda r: r.drop(columns=[column]))
    skipped_only(root, online, f"has no {column} column")


def test_an_edited_selection_json_is_refused(tmp_path):
    root = tmp_path / "outputs"
    folder = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.16, 92.22], 0),
                                                        ("lr3", {"lr": 0.1}, [80.0, 81.0], 0)])
    edit_plan(folder, selection="random_stopping")
    edit_runs(folder, lambda r: r.assign(candidate=[0, 0, 1, 1], budget="selection"))
    edit_plan(folder, budget="selection")
    selection = {"chosen": {"config_id": "lr4", "lr": 0.316228, "score": 91.69}}
    (folder / "selection.json").write_text(json.dumps(selection))
    _, lines = write(root)
    assert lines == [] and pd.read_csv(root / "tables" / "results.csv").value.tolist() == [pytest.approx(91.69)]
    (folder / "selection.json").write_text(json.dumps({"chosen": {**selection["chosen"], "score": 99.0}}))
    make_grid(root, "mnist", "fixed_threshold", 3, 9, [("lr0_clip5", {"lr": 0.003162, "clip": 3.162}, [91.0, 92.0], 0)])
    skipped_only(root, folder, "selection.json does not release what its candidates' rows select")


def test_two_grids_of_one_cell_are_told_apart_by_protocol_or_both_refused(tmp_path):
    root = tmp_path / "outputs"
    paper = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.16, 92.22], 0)])
    literal = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [72.0, 73.0], 0)], protocol="literal",
                        folder=root / "literal")
    make_grid(root, "mnist", "fixed_threshold", 3, 9, [("lr0_clip5", {"lr": 0.003162, "clip": 3.162}, [91.0, 92.0], 0)])
    _, lines = write(root)
    assert lines == []
    table = pd.read_csv(root / "tables" / "mnist_k9.csv")
    assert sorted(table.protocol) == ["literal", "paper"] and sorted(table["Online acc"]) == pytest.approx([72.5, 91.69])
    edit_runs(literal, lambda r: r.assign(protocol="paper"))  # nothing a table shows tells them apart now
    edit_plan(literal, accountant="rdp")
    _, lines = write(root)
    assert len(lines) == 1 and str(paper) in lines[0] and str(literal) in lines[0] and "two grids for one cell" in lines[0]
    md = (root / "tables" / "mnist_k9.md").read_text()  # the cell's footnote says why it is empty, not "grid not run"
    assert "–: two grids for this cell, skipped (table them from separate results directories): Online at ε = 3" in md
    assert "grid not run" not in md


@pytest.mark.parametrize("digest", fast_layer_runs(["31917e5915963710", "0123456789012345", "1e5", "nan", "inf"],
                                                   "0123456789012345", "1e5"))
def test_a_config_hash_that_looks_like_a_number_stays_text(digest, tmp_path, monkeypatch):
    """Committed, resumed and tabulated: the hash is the same text everywhere (pandas would read 31917e5915963710 as
    a float and write it back as inf, and drop the leading zero of 0123456789012345)."""
    import sys

    from dpgrid.config import compile as compile_grid
    from dpgrid.runner import train

    from .conftest import load_cfg

    monkeypatch.setattr(sys.modules["dpgrid.config.compile"], "config_hash", lambda settings, *args: digest)
    spec = compile_grid(load_cfg("digits", "fixed_threshold", **{"grid.k": 2, "train.seeds": 1, "train.epochs": 1,
                                                                  "grid.only": "[lr0_clip0]"}))
    assert spec.config_hash == digest
    out = tmp_path / "outputs" / "grid"
    train(spec, out, progress=False)
    spec = compile_grid(load_cfg("digits", "fixed_threshold", **{"grid.k": 2, "train.seeds": 1, "train.epochs": 1}))
    train(spec, out, progress=False)  # resumed: the first row read back and written again
    runs = pd.read_csv(out / "runs.csv", dtype=str, keep_default_na=False)
    assert set(runs.config_hash) == {digest} and len(runs) == 4
    assert json.loads((out / "plan.json").read_text())["config_hash"] == digest
    written = write_tables(tmp_path / "outputs", figures=False, report=lambda line: pytest.fail(line))
    assert written and len(pd.read_csv(tmp_path / "outputs" / "tables" / "results.csv")) == 1


def test_tables_of_a_read_only_tree_go_where_out_says(two, tmp_path, monkeypatch):
    import os

    from dpgrid import EnvironmentFault
    from dpgrid.results.files import directory_setting

    root, _, _ = two
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **k: False if str(p).startswith(str(root)) else real(p, m, **k))
    with directory_setting("--out DIR"), pytest.raises(EnvironmentFault, match=r"not writable; choose a writable "
                                                                                r"directory \(--out DIR\)"):
        write_tables(root, figures=False)
    written = write_tables(root, figures=False, out=tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere" / "mnist_k9.tex").exists() and all(tmp_path / "elsewhere" in p.parents for p in written)
    assert not (root / "tables").exists()
