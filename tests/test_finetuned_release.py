"""A release fine-tuned from a private checkpoint reads back through every entry point a user takes: `dpgrid model`,
`dpgrid model --out`, `dpgrid.load_model` and the grid's own command run again, with the composed epsilon wherever it
is stated. Same data (the default: composed) and other data (model.init_disjoint=true: stated apart), on file-based
datasets, and a chain: the exported file fine-tuned again composes all three grids."""

import json

import pytest
from safetensors import safe_open

import dpgrid
from dpgrid.privacy.accountants import composed_epsilon

from .command import dpgrid as run_dpgrid
from .test_release_public import idx_dataset

SMALL = ["strategy=fixed_threshold", "model=image_mlp", "model.hidden=8", "dataset.n_train=null",
         "train.batch_size=48", "train.steps=6", "train.eval_every=3", "train.seeds=2", "grid.k=2",
         "privacy.epsilon=2"]


def statement_of(path):
    with safe_open(str(path), "np") as f:
        return json.loads(f.metadata()["dpgrid"])


def events_of(run_dir) -> list:
    plan = json.loads((run_dir / "plan.json").read_text())
    return [[plan["sample_rate"], plan["noise_multiplier"], plan["n_configs"] * plan["seeds"] * plan["steps"]]]  # all runs read


def read_back(run_dir, covered: dict, tmp_path, name: str):
    """Every entry point a user reads a release with states `covered`."""
    shown = run_dpgrid("model", run_dir)
    assert shown.returncode == 0, shown.stderr
    assert f"covered by: epsilon = {covered['epsilon']:.4g}" in shown.stdout
    exported = tmp_path / f"{name}.safetensors"
    copy = run_dpgrid("model", run_dir, "--out", exported)
    assert copy.returncode == 0, copy.stderr
    assert statement_of(exported)["covered_by"] == pytest.approx(covered)
    assert dpgrid.load_model(run_dir).statement["covered_by"] == pytest.approx(covered)
    return exported


@pytest.mark.slow
def test_a_fine_tuned_release_loads_exports_and_resumes_on_the_same_data_and_on_other_data(tmp_path):
    idx_dataset(tmp_path / "data", changed=False)
    fashion = tmp_path / "data" / "FashionMNIST"
    (tmp_path / "data" / "MNIST").rename(fashion)  # another dataset's files, in its own layout
    idx_dataset(tmp_path / "data", changed=True)
    data = f"data.root={tmp_path / 'data'}"
    base = tmp_path / "base"
    first = run_dpgrid("run", *SMALL, "dataset=mnist", data, f"hydra.run.dir={base}")
    assert first.returncode == 0, first.stderr
    checkpoint = base / "model" / "seed0.safetensors"
    own = json.loads((base / "model" / "model.json").read_text())["covered_by"]

    same = [*SMALL, "dataset=mnist", data, f"model.init={checkpoint}", f"hydra.run.dir={tmp_path / 'same'}"]
    tuned = run_dpgrid("run", *same)
    assert tuned.returncode == 0, tuned.stderr
    plan = json.loads((tmp_path / "same" / "plan.json").read_text())
    composed = {"epsilon": composed_epsilon(events_of(base) + events_of(tmp_path / "same"), plan["delta"]),
                "delta": plan["delta"]}
    assert composed["epsilon"] > max(own["epsilon"], plan["epsilon_with_seeds"])
    assert plan["release_covered_by"] == pytest.approx(composed)
    assert f"covered by epsilon = {composed['epsilon']:.4g}" in tuned.stdout
    exported = read_back(tmp_path / "same", composed, tmp_path, "same")
    again = run_dpgrid("run", *same)
    assert again.returncode == 0, again.stderr
    assert "nothing to train" in again.stderr and f"covered by epsilon = {composed['epsilon']:.4g}" in again.stdout

    chain = run_dpgrid("run", *SMALL, "dataset=mnist", data, f"model.init={exported}",
                       f"hydra.run.dir={tmp_path / 'chain'}")
    assert chain.returncode == 0, chain.stderr
    thrice = composed_epsilon(events_of(base) + events_of(tmp_path / "same") + events_of(tmp_path / "chain"),
                              plan["delta"])
    read_back(tmp_path / "chain", {"epsilon": thrice, "delta": plan["delta"]}, tmp_path, "chain")

    other = [*SMALL, "dataset=fashion_mnist_classes", data, f"model.init={checkpoint}", "model.init_disjoint=true",
             f"hydra.run.dir={tmp_path / 'other'}"]
    apart = run_dpgrid("run", *other)
    assert apart.returncode == 0, apart.stderr
    plan = json.loads((tmp_path / "other" / "plan.json").read_text())
    stated = {"epsilon": plan["epsilon_with_seeds"], "delta": plan["delta"]}
    read_back(tmp_path / "other", stated, tmp_path, "other")
    statement = json.loads((tmp_path / "other" / "model" / "model.json").read_text())
    assert statement["checkpoint"]["declared_disjoint"] and statement["checkpoint"]["checkpoint"]["dataset"] == "mnist"
    assert run_dpgrid("run", *other).returncode == 0
