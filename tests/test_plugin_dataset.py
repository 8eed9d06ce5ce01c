"""A dataset that is not in dpgrid (scikit-learn's breast cancer set, examples/) runs and is tabulated."""

import pandas as pd
import pytest

from .plugin import SEARCHPATH, dpgrid

pytestmark = pytest.mark.slow  # every test here starts dpgrid processes


def test_breast_cancer_runs_with_its_default_model_and_tables(tmp_path):
    args = ["dataset=wdbc", "strategy=fixed_threshold", "grid.k=2", "train.epochs=2", "train.seeds=1",
            SEARCHPATH]
    r = dpgrid("run", *args, f"hydra.run.dir={tmp_path / 'results' / 'bc'}")
    assert r.returncode == 0, r.stderr
    runs = pd.read_csv(tmp_path / "results" / "bc" / "runs.csv")
    assert set(runs.dataset) == {"wdbc"} and runs.best_value.between(0, 100).all()
    t = dpgrid("tables", str(tmp_path / "results"))
    assert t.returncode == 0, t.stderr
    table = (tmp_path / "results" / "tables" / "wdbc_k2.md").read_text()
    assert "Fixed Threshold" in table and "| 1 |" in table  # the dataset's own privacy levels are the rows


def test_a_plugin_loader_refuses_bad_input_in_one_line(tmp_path):
    r = dpgrid("run", "dataset=wdbc", "dataset.load.test_fraction=1.5", SEARCHPATH, f"hydra.run.dir={tmp_path / 'bc'}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "dataset.load.test_fraction must be in (0, 1), got 1.5" in r.stderr
    assert not (tmp_path / "bc").exists()
