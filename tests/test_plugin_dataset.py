"""A dataset that is not in dpgrid (scikit-learn's breast cancer set, examples/) runs and is tabulated."""

import pandas as pd
import pytest

from .command import one_line
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
    assert "Fixed Threshold" in table and "| 3 |" in table  # the privacy level run is the row


def test_a_plugin_loader_refuses_bad_input_in_one_line(tmp_path):
    r = dpgrid("run", "dataset=wdbc", "dataset.load.test_fraction=1.5", SEARCHPATH, f"hydra.run.dir={tmp_path / 'bc'}")
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert "dataset.load.test_fraction must be in (0, 1), got 1.5" in r.stderr
    assert not (tmp_path / "bc").exists()


MINIMAL = {  # a plugin written as docs/extending.md says: a dataset with only name, task and load, and a model
    "minimal_plugin/__init__.py": '''
import torch
from dpgrid import Data


def digits_again(root=None, n_test: int = 300):
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)
    return Data(x[n_test:], y[n_test:], x[:n_test], y[:n_test], "classification")


def tiny():
    return torch.nn.Sequential(torch.nn.Linear(64, 10))
''',
    "minimal_plugin/conf/__init__.py": "",
    "minimal_plugin/conf/dataset/digits_again.yaml": "name: digits_again\ntask: classification\nload:\n"
                                                     "  _target_: minimal_plugin.digits_again\n  n_test: 300\n",
    "minimal_plugin/conf/model/tiny.yaml": "_target_: minimal_plugin.tiny\n",
    "pyproject.toml": '''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "minimal-plugin"
version = "0.1.0"

[tool.setuptools]
packages = ["minimal_plugin", "minimal_plugin.conf"]

[tool.setuptools.package-data]
"minimal_plugin.conf" = ["**/*.yaml"]
''',
}
SMALL = ["strategy=fixed_threshold", "grid.k=2", "train.epochs=1", "train.seeds=1"]


def minimal_plugin(folder):
    for name, text in MINIMAL.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text.lstrip("\n"))
    return folder


def runs_with_model_given_and_refuses_without(searchpath, path, tmp_path):
    from .command import dpgrid as run, one_line

    r = run("run", "dataset=digits_again", "model=tiny", searchpath, *SMALL, f"hydra.run.dir={tmp_path / 'out'}", path=path)
    assert r.returncode == 0, r.stderr
    assert set(pd.read_csv(tmp_path / "out" / "runs.csv").dataset) == {"digits_again"}
    r = run("run", "dataset=digits_again", searchpath, *SMALL, f"hydra.run.dir={tmp_path / 'none'}", path=path)
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert "names no model: pass model=<name>" in r.stderr and "'- /model@_global_.model: <name>'" in r.stderr
    assert "tiny" in r.stderr and not (tmp_path / "none").exists()


def test_a_minimal_dataset_plugin_on_the_search_path_takes_model(tmp_path):
    folder = minimal_plugin(tmp_path / "plugin")
    runs_with_model_given_and_refuses_without(f"hydra.searchpath=[file://{folder / 'minimal_plugin' / 'conf'}]",
                                              [folder], tmp_path)


def test_a_minimal_dataset_plugin_installed_with_pip_takes_model(tmp_path):
    import subprocess
    import sys

    folder = minimal_plugin(tmp_path / "plugin")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(folder)], check=True, capture_output=True)
    assert (target / "minimal_plugin" / "conf" / "dataset" / "digits_again.yaml").exists()
    runs_with_model_given_and_refuses_without("hydra.searchpath=[pkg://minimal_plugin.conf]", [target], tmp_path)
