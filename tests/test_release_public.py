"""A release carries nothing computed from the private training data but through the noised training: two grids with
the same seeds on neighbouring file-based datasets (one training label changed) release files whose metadata differ
only where the noised training does, and no released file holds a training file's digest or size. A release an
earlier dpgrid made, with the data's fingerprint in its metadata, still loads, and says it must not be published as it
is; its export leaves the fingerprint out."""

import hashlib
import json
import re
import warnings

import numpy as np
import pytest
from safetensors import safe_open

from dpgrid.api import run_grid, tables
from dpgrid.config import compile
from dpgrid.results.models import export, load_model
from dpgrid.results.statement import seal_of

from .conftest import load_cfg


def write_idx(path, array, magic):
    """A gzip'd IDX file whose bytes depend on its content alone (no time stamp in the gzip header)."""
    import gzip
    import struct

    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">i", magic) + struct.pack(f">{array.ndim}i", *array.shape)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(header + array.astype(np.uint8).tobytes())

N_TRAIN, N_TEST = 240, 60
SETTINGS = {"model": "image_mlp", "model.hidden": 8, "dataset.n_train": "null", "train.batch_size": 48,
            "train.steps": 6, "train.eval_every": 3, "train.seeds": 2, "grid.k": 2, "privacy.epsilon": 2}


def idx_dataset(root, changed: bool):
    """MNIST's layout with N_TRAIN training images; `changed`: the last training label moved to another class."""
    rng = np.random.default_rng(7)
    raw = root / "MNIST" / "raw"
    images, labels = rng.integers(0, 256, (N_TRAIN, 28, 28)), rng.integers(0, 10, N_TRAIN)
    if changed:
        labels[-1] = (labels[-1] + 1) % 10
    write_idx(raw / "train-images-idx3-ubyte.gz", images, 2051)
    write_idx(raw / "train-labels-idx1-ubyte.gz", labels, 2049)
    write_idx(raw / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (N_TEST, 28, 28)), 2051)
    write_idx(raw / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, N_TEST), 2049)
    return {p.name: p for p in sorted(raw.glob("*.gz"))}  # the test files' digests are released by nothing either


def released_files(out, export_path):
    """Every file a user is told they may publish: model/ (model.json and each weights file), an export, the tables."""
    files = sorted((out / "model").iterdir()) + [export_path]
    return files + [p for p in sorted((out.parent / "tables").rglob("*")) if p.is_file()]


def metadata(path):
    with safe_open(str(path), "np") as f:
        return json.loads(f.metadata()["dpgrid"])


def masked(statement: dict) -> dict:
    """A statement without what follows from the noised weights: the released score, the default seed (the best
    final model), each model's test value and checksum, and the seal over them."""
    kept = {k: v for k, v in statement.items() if k not in ("score", "default_seed", "seal")}
    if "models" in kept:
        kept["models"] = [{k: v for k, v in e.items() if k not in ("sha256", "test_value")} for e in kept["models"]]
    return kept


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory):
    """Two grids, one on D and one on D' (D with its last training label changed), same seeds and settings."""
    found = {}
    for name, changed in (("d", False), ("d_prime", True)):
        root = tmp_path_factory.mktemp(name)
        training = idx_dataset(root / "data", changed)
        spec = compile(load_cfg("mnist", "fixed_threshold", **SETTINGS, **{"data.root": str(root / "data")}))
        out = root / "results" / "grid"
        run_grid(spec, out, progress=False)
        export(out, 0, root / "exported.safetensors")
        tables(str(root / "results"), report=lambda line: None)
        found[name] = dict(out=out, training=training, export=root / "exported.safetensors",
                           model=load_model(out))
    return found


def test_the_datasets_are_neighbours_and_their_training_files_differ(neighbours):
    a, b = (neighbours[n]["training"] for n in ("d", "d_prime"))
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(a["train-labels-idx1-ubyte.gz"]) != digest(b["train-labels-idx1-ubyte.gz"])
    assert digest(a["train-images-idx3-ubyte.gz"]) == digest(b["train-images-idx3-ubyte.gz"])


def test_released_metadata_differ_only_where_the_noised_training_does(neighbours):
    a, b = neighbours["d"], neighbours["d_prime"]
    statements = [json.loads((g["out"] / "model" / "model.json").read_text()) for g in (a, b)]
    assert masked(statements[0]) == masked(statements[1])
    assert statements[0]["seal"] != statements[1]["seal"]  # the noised weights differ, and their checksums with them
    for file in sorted((a["out"] / "model").glob("*.safetensors")):
        assert masked(metadata(file)) == masked(metadata(b["out"] / "model" / file.name))
    assert masked(metadata(a["export"])) == masked(metadata(b["export"]))
    assert masked(a["model"].statement) == masked(b["model"].statement)
    tables_a = {p.name for p in released_files(a["out"], a["export"])}
    assert tables_a == {p.name for p in released_files(b["out"], b["export"])}
    assert any(name.endswith(".md") for name in tables_a)


def test_no_released_file_holds_a_training_files_digest_or_size(neighbours):
    for name in ("d", "d_prime"):
        grid = neighbours[name]
        secrets = set()
        for path in grid["training"].values():
            content = path.read_bytes()
            secrets |= {hashlib.sha256(content).hexdigest(), hashlib.sha256(content).hexdigest()[:12]}
        sizes = {str(p.stat().st_size) for name, p in grid["training"].items() if name.startswith("train")}
        plan = json.loads((grid["out"] / "plan.json").read_text())
        assert {v["sha256"] for v in plan["data_files"].values()} == {s for s in secrets if len(s) == 64}  # kept privately
        for file in released_files(grid["out"], grid["export"]):
            text = file.read_bytes().decode("latin-1")
            assert not any(secret in text for secret in secrets), file
            if file.suffix in (".json", ".md", ".tex", ".csv"):
                assert not sizes & set(re.findall(r"\d+", text)), file
        statement = grid["model"].statement
        assert "data_files" not in json.dumps(statement)
        assert statement["privacy"]["adjacency"]["name"] == "zero-out"


@pytest.fixture
def earlier_release(neighbours, tmp_path):
    """A release as an earlier dpgrid wrote it: each training file's SHA-256 in model.json, its plan and each weights
    file's metadata, sealed."""
    import shutil

    from safetensors.torch import load, save

    out = tmp_path / "old"
    shutil.copytree(neighbours["d"]["out"], out)
    plan = json.loads((out / "plan.json").read_text())
    path = out / "model" / "model.json"
    record = json.loads(path.read_text())
    record.update(data_files=plan["data_files"], plan={**record["plan"], "data_files": plan["data_files"]})
    for entry in record["models"]:  # the weights' metadata held it too; the statement records their new checksums
        weights = out / "model" / entry["file"]
        old = {**metadata(weights), "data_files": plan["data_files"]}
        content = save(load(weights.read_bytes()), metadata={"dpgrid": json.dumps(old)})
        weights.write_bytes(content)
        entry["sha256"] = hashlib.sha256(content).hexdigest()
    record["seal"] = seal_of(record)
    path.write_text(json.dumps(record))
    return out, record


def test_a_release_with_an_earlier_dpgrids_fingerprint_loads_says_so_and_exports_without_it(earlier_release, tmp_path):
    out, record = earlier_release
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_model(out)
    said = [str(w.message) for w in caught if "fingerprint of the training data" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and "do not publish it as it is" in said[0]
    assert "data_files" not in json.dumps(model.statement)
    exported = export(out, 0, tmp_path / "copy.safetensors")
    copied = metadata(exported)
    assert "data_files" not in json.dumps(copied)
    body = {k: v for k, v in copied.items() if k not in ("seal", "seed")}
    assert copied["seal"]["statement"] == seal_of(body)["statement"]  # sealed anew, without it
    from dpgrid.privacy.provenance import checkpoint_provenance

    assert checkpoint_provenance(str(exported), None).epsilon == pytest.approx(record["covered_by"]["epsilon"])


@pytest.mark.slow
def test_dpgrid_model_says_in_one_line_that_an_earlier_release_must_not_be_published_as_it_is(earlier_release,
                                                                                                tmp_path):
    from .command import dpgrid

    out, _ = earlier_release
    shown = dpgrid("model", out)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stderr.splitlines() if "fingerprint of the training data" in line]
    assert len(lines) == 1 and "do not publish it as it is" in lines[0] and "--out" in lines[0]
    copy = dpgrid("model", out, "--out", tmp_path / "copy.safetensors")
    assert copy.returncode == 0 and "data_files" not in json.dumps(metadata(tmp_path / "copy.safetensors"))
