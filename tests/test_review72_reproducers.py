"""Reproducers of an independent privacy review of issue 72's fix. Each test asserts the property the fix claims;
both failed on the reviewed commit (59ba548) and pass since the mends:

1. An earlier release's export (`dpgrid model RUN_DIR --out FILE`, and `dpgrid.load_model`'s statement) leaves out
   `data_files` but keeps `models[].sha256`: the checksum of each weights file *as the earlier dpgrid wrote it*, whose
   metadata held the fingerprint. An adversary holding the export (the weights and every other field of that metadata)
   rebuilds the earlier file for each candidate dataset and compares checksums: the fingerprint's disclosure remains.
2. A chain of fine-tunings drops a private checkpoint's epsilon after one true declaration: a grid declared disjoint
   from its checkpoint's data (model.init_disjoint=true) writes weights whose metadata state its own epsilon alone,
   on its own dataset; fine-tuned again on the first checkpoint's data, with no declaration, the release composes
   only that, not the first grid's spending on the same examples (a nodp start: a finite epsilon is stated for a
   model whose ancestry was trained on that data without any privacy).
"""

import hashlib
import json
import math

import pytest
from safetensors import safe_open

from dpgrid.api import run_grid
from dpgrid.config import compile
from dpgrid.results.models import export

from .conftest import load_cfg
from .test_release_public import earlier_release, metadata, neighbours, idx_dataset  # noqa: F401 (fixtures)


def test_an_earlier_releases_export_holds_no_checksum_computed_from_its_fingerprint(earlier_release, tmp_path):
    """FAILS on 59ba548: the exported statement's models[].sha256 is the checksum of the fingerprinted weights file."""
    from safetensors.torch import load, save

    out, record = earlier_release
    exported = export(out, 0, tmp_path / "copy.safetensors")
    statement = metadata(exported)
    assert "data_files" not in json.dumps(statement)
    fingerprint = json.loads((out / "plan.json").read_text())["data_files"]  # what an adversary tests, candidate by candidate
    with safe_open(str(out / "model" / "seed0.safetensors"), "np") as f:
        earlier = json.loads(f.metadata()["dpgrid"])
    # the earlier file's metadata, rebuilt from the export alone plus one candidate fingerprint (here the true one)
    # (the weights' metadata held these fields of model.json, and privacy's accountant alone)
    known = {**statement, "privacy": {"accountant": statement["privacy"]["accountant"]}, "data_files": fingerprint}
    assert set(earlier) <= set(known)
    rebuilt = {k: known[k] for k in earlier}
    content = save(load(exported.read_bytes()), metadata={"dpgrid": json.dumps(rebuilt)})
    entry = next(e for e in statement["models"] if e["seed"] == 0)
    assert hashlib.sha256(content).hexdigest() != entry.get("sha256"), (
        "the export's models[].sha256 is a deterministic function of the training data's fingerprint: hashing "
        "candidate datasets recovers the one trained on")


SMALL = {"strategy": "fixed_threshold", "model": "image_mlp", "model.hidden": 8, "dataset.n_train": "null",
         "train.batch_size": 48, "train.steps": 6, "train.eval_every": 3, "train.seeds": 1, "grid.k": 2}


@pytest.mark.slow
def test_a_chain_of_fine_tunings_never_drops_the_first_checkpoints_spending_on_its_data(tmp_path):
    """FAILS on 59ba548: nodp on MNIST -> private on FashionMNIST, declared disjoint (true) -> private on MNIST again,
    no declaration: the last release states a finite epsilon for MNIST's examples, which a non-private model of them
    was trained on."""
    root = tmp_path / "data"
    idx_dataset(root, changed=False)
    (root / "MNIST").rename(root / "FashionMNIST")
    idx_dataset(root, changed=True)

    def grid(name, dataset, strategy, **extra):
        settings = {**SMALL, "strategy": strategy, "data.root": str(root), **extra}
        strategy = settings.pop("strategy")
        if strategy != "nodp":
            settings["privacy.epsilon"] = 2
        out = tmp_path / name
        run_grid(compile(load_cfg(dataset, strategy, **settings)), out, progress=False)
        return out

    start = grid("nodp", "mnist", "nodp")
    middle = grid("fashion", "fashion_mnist_classes", "fixed_threshold",
                  **{"model.init": str(start / "model" / "seed0.safetensors"), "model.init_disjoint": True})
    last = grid("again", "mnist", "fixed_threshold", **{"model.init": str(middle / "model" / "seed0.safetensors")})
    covered = json.loads((last / "model" / "model.json").read_text())["covered_by"]
    assert covered is None or math.isinf(covered["epsilon"]), (
        f"the release states {covered} for MNIST's examples, yet its first ancestor was trained on them without "
        "differential privacy; only FashionMNIST was declared disjoint")


@pytest.mark.slow
def test_a_chain_through_a_disjoint_grid_composes_every_grid_on_the_first_data(tmp_path):
    """private on MNIST -> private on FashionMNIST, declared disjoint -> private on MNIST again, no declaration: the
    last release covers MNIST's examples with at least the composition of both MNIST grids (and, nothing declared of
    the last grid, the FashionMNIST grid's too), checked against dp-accounting's RDP accountant."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    root = tmp_path / "data"
    idx_dataset(root, changed=False)
    (root / "MNIST").rename(root / "FashionMNIST")
    idx_dataset(root, changed=True)

    def grid(name, dataset, **extra):
        settings = {**SMALL, "data.root": str(root), "privacy.epsilon": 2, **extra}
        settings.pop("strategy")
        out = tmp_path / name
        run_grid(compile(load_cfg(dataset, "fixed_threshold", **settings)), out, progress=False)
        plan = json.loads((out / "plan.json").read_text())
        return out, (plan["sample_rate"], plan["noise_multiplier"], plan["n_configs"] * plan["seeds"] * plan["steps"])

    first, a = grid("first", "mnist")
    middle, b = grid("fashion", "fashion_mnist_classes",
                     **{"model.init": str(first / "model" / "seed0.safetensors"), "model.init_disjoint": True})
    stated = json.loads((middle / "model" / "model.json").read_text())
    assert stated["covered_by"]["epsilon"] == json.loads((middle / "plan.json").read_text())["epsilon_with_seeds"]
    assert [a["dataset"] for a in stated["accounts"]] == ["mnist", "fashion_mnist_classes"]  # both carried on
    last, c = grid("again", "mnist", **{"model.init": str(middle / "model" / "seed0.safetensors")})
    covered = json.loads((last / "model" / "model.json").read_text())["covered_by"]

    def independent(events):
        accountant = rdp_privacy_accountant.RdpAccountant()
        for q, nu, steps in events:
            accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(nu)), steps)
        return accountant.get_epsilon(covered["delta"])

    assert covered["epsilon"] >= independent([a, c]) * 0.99  # both MNIST grids, at least
    assert covered["epsilon"] == pytest.approx(independent([a, b, c]), rel=0.01)  # and the undeclared middle one
