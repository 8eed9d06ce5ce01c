"""Loaders on small generated files in the standard layouts, and their errors."""

import gzip
import struct

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from dpgrid import DpgridError
from dpgrid.data import load
from dpgrid.data.datasets import embed, tokenize




def write_idx(path, array, magic):
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">i", magic) + struct.pack(f">{array.ndim}i", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def make_idx_root(root, folder="MNIST", n_train=12, n_test=5):
    rng = np.random.default_rng(0)
    raw = root / folder / "raw"
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)), 2051)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n), 2049)
    return raw


def idx_cfg(name, folder, task, **extra):
    return OmegaConf.create(dict(name=name, task=task, load={"_target_": "dpgrid.data.datasets.load_idx", "folder": folder},
                                 **extra))


MNIST = idx_cfg("mnist", "MNIST", "classification")
FASHION = idx_cfg("fashion_mnist", "FashionMNIST", "reconstruction")


def test_idx_loader_reads_generated_files(tmp_path):
    raw = make_idx_root(tmp_path)
    d = load(MNIST, tmp_path)
    assert d.x_train.shape == (12, 1, 28, 28) and d.x_test.shape == (5, 1, 28, 28)
    with gzip.open(raw / "train-images-idx3-ubyte.gz") as f:
        first = np.frombuffer(f.read()[16:16 + 784], dtype=np.uint8).reshape(28, 28)
    torch.testing.assert_close(d.x_train[0, 0], torch.from_numpy(first / 255.0).float())
    assert d.x_train.min() >= 0 and d.x_train.max() <= 1 and d.y_train.dtype == torch.int64


def test_reconstruction_targets_are_the_inputs(tmp_path):
    make_idx_root(tmp_path, "FashionMNIST")
    d = load(FASHION, tmp_path)
    assert d.y_train is d.x_train and d.task == "reconstruction"


def corrupt(raw, how):
    path = raw / "train-images-idx3-ubyte.gz"
    if how == "missing":
        path.unlink()
    elif how == "magic":
        write_idx(path, np.zeros((12, 28, 28)), 2049)
    elif how == "truncated":
        data = gzip.open(path).read()
        with gzip.open(path, "wb") as f:
            f.write(data[:-100])
    elif how == "gzip":
        path.write_bytes(b"this is not gzip data")
    elif how == "shape":
        write_idx(path, np.zeros((12, 20, 20)), 2051)
    elif how == "label200":
        write_idx(raw / "train-labels-idx1-ubyte.gz", np.array([0, 1, 200] + [0] * 9), 2049)
    elif how == "testlabel10":
        write_idx(raw / "t10k-labels-idx1-ubyte.gz", np.array([0, 10, 0, 0, 0]), 2049)
    elif how == "header":
        with gzip.open(path, "wb") as f:
            f.write(struct.pack(">ii", 2051, 12))  # cut after the first dimension
    elif how == "empty":
        write_idx(path, np.zeros((0, 28, 28)), 2051)
        write_idx(raw / "train-labels-idx1-ubyte.gz", np.zeros(0), 2049)
    elif how == "negative":
        data = gzip.open(path).read()
        with gzip.open(path, "wb") as f:
            f.write(data[:4] + struct.pack(">i", -1) + data[8:])
    elif how == "longer":
        data = gzip.open(path).read()
        with gzip.open(path, "wb") as f:
            f.write(data + b"\0" * 100)


@pytest.mark.parametrize("how, message", [
    ("missing", "missing data file .*MNIST/raw/train-images-idx3-ubyte.gz"),
    ("magic", "wrong IDX magic"), ("truncated", "truncated IDX"), ("gzip", "corrupt gzip"),
    ("shape", "unexpected IDX shapes"),
    ("label200", "train-labels-idx1-ubyte.gz, example 2: label 200 is outside 0..9"),
    ("testlabel10", "t10k-labels-idx1-ubyte.gz, example 1: label 10 is outside 0..9"),
    ("header", "its header is cut"), ("empty", "holds no images"), ("longer", "longer than its header says"),
    ("negative", r"damaged IDX header in .*: dimensions \(-1, 28, 28\) cannot be negative")])
def test_idx_errors_are_clear(tmp_path, how, message):
    corrupt(make_idx_root(tmp_path), how)
    with pytest.raises(DpgridError, match=message):
        load(MNIST, tmp_path)


# --- AG News ----------------------------------------------------------------------------------

WORDS = ["the", "stocks", "rise", ",", "team", "wins", "game", "."]


@pytest.fixture
def glove_txt(tmp_path):
    path = tmp_path / "glove.txt"
    rows = [f"{w} " + " ".join(str(float(i + 1 + j / 100)) for j in range(50)) for i, w in enumerate(WORDS)]
    path.write_text("\n".join(rows) + "\n")
    return path


def ag_cfg(glove, max_words=3):
    return OmegaConf.create(dict(name="ag_news", task="classification", load={
        "_target_": "dpgrid.data.datasets.load_ag_news", "max_words": max_words, "glove": str(glove)}))


ROWS = [(3, "Stocks rise", "the stocks, rise"), (2, "Team wins", "game on"), (1, "Zzz unknown", "x")]


def test_ag_news_csv_layout(tmp_path, glove_txt):
    folder = tmp_path / "ag_news_csv"
    folder.mkdir()
    for split in ("train", "test"):
        pd.DataFrame(ROWS).to_csv(folder / f"{split}.csv", header=False, index=False)
    d = load(ag_cfg(glove_txt), tmp_path)
    assert d.x_train.shape == (3, 150) and d.y_train.tolist() == [2, 1, 0]
    # "stocks rise the" -> GloVe rows 2, 3, 1 (values i + 1 + j / 100); unknown words are zeros
    assert d.x_train[0, 0].item() == pytest.approx(2.0) and d.x_train[0, 50].item() == pytest.approx(3.0)
    assert d.x_train[0, 100].item() == pytest.approx(1.0)
    assert (d.x_train[2] == 0).all()


def test_ag_news_parquet_layout_gives_the_same_features(tmp_path, glove_txt):
    csv_root, pq_root = tmp_path / "a", tmp_path / "b"
    (csv_root / "ag_news_csv").mkdir(parents=True)
    (pq_root / "ag_news").mkdir(parents=True)
    for split in ("train", "test"):
        pd.DataFrame(ROWS).to_csv(csv_root / "ag_news_csv" / f"{split}.csv.gz", header=False, index=False)
        pd.DataFrame({"text": [f"{t} {d}" for _, t, d in ROWS], "label": [c - 1 for c, _, _ in ROWS]}).to_parquet(
            pq_root / "ag_news" / f"{split}.parquet")
    a, b = load(ag_cfg(glove_txt, 5), csv_root), load(ag_cfg(glove_txt, 5), pq_root)
    torch.testing.assert_close(a.x_train, b.x_train)
    assert a.y_test.tolist() == b.y_test.tolist()


def test_ag_news_bad_labels_and_missing_files(tmp_path, glove_txt):
    folder = tmp_path / "ag_news_csv"
    folder.mkdir()
    with pytest.raises(DpgridError, match="missing data file .*ag_news_csv/train.csv"):
        load(ag_cfg(glove_txt), tmp_path)
    for split in ("train", "test"):
        pd.DataFrame([(5, "a", "b")]).to_csv(folder / f"{split}.csv", header=False, index=False)
    with pytest.raises(DpgridError, match="labels outside 1..4"):
        load(ag_cfg(glove_txt), tmp_path)


@pytest.mark.parametrize("text, message", [
    ("", "holds no rows"),
    ('3,"Stocks rise","the stocks"\n2\n', "row 2: 1 field"),
    ('3,"Stocks rise","the stocks"\n2,"Team wins,"game on\n1,"a","b"\n', "row 2: malformed CSV"),
    ('3,"Stocks rise","the stocks"\n2,"Team wins,game on\n', "row 2: malformed CSV \\(unexpected end of data"),
])
def test_ag_news_rows_are_checked(tmp_path, glove_txt, text, message):
    folder = tmp_path / "ag_news_csv"
    folder.mkdir()
    (folder / "train.csv").write_text(text)
    pd.DataFrame(ROWS).to_csv(folder / "test.csv", header=False, index=False)
    with pytest.raises(DpgridError, match=f"ag_news_csv/train.csv.*{message}"):
        load(ag_cfg(glove_txt), tmp_path)


def test_generic_checks_catch_any_loader(tmp_path):
    from dpgrid.data import check_loaded
    from dpgrid.specs import DatasetSpec

    cfg = DatasetSpec(name="mine", task="classification", load=None, classes=3)
    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 2, 3])
    with pytest.raises(DpgridError, match="mine's train split under .*: label 3 of example 3 is outside 0..2"):
        check_loaded(cfg, tmp_path, x, y, x, y.clamp(max=2))
    with pytest.raises(DpgridError, match="test split .* holds no examples"):
        check_loaded(cfg, tmp_path, x, y.clamp(max=2), x[:0], y[:0])
    bad = x.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(DpgridError, match="train split .*: example 2 has features that are NaN or infinite"):
        check_loaded(cfg, tmp_path, bad, y.clamp(max=2), x, y.clamp(max=2))
    bad[2, 1] = float("inf")
    with pytest.raises(DpgridError, match="test split .*: example 2 has features that are NaN or infinite"):
        check_loaded(cfg, tmp_path, x, y.clamp(max=2), bad, y.clamp(max=2))


def test_tokenizer_and_padding():
    assert tokenize("Stocks RISE, again.") == ["stocks", "rise", ",", "again", "."]
    x = embed(["rise"], {"rise": 0}, np.ones((1, 2), dtype=np.float32), 3)
    assert x.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]


def test_packaged_glove_vectors_cover_common_words():
    from dpgrid.data.datasets import load_glove
    index, vectors = load_glove()
    assert vectors.shape == (400000, 50) and index["the"] == 0 and "," in index


# --- the embedded default and the real files --------------------------------------------------

def test_digits_is_embedded():
    d = load(OmegaConf.create(dict(name="digits", task="classification",
                                   load={"_target_": "dpgrid.data.datasets.load_digits"})), "/nonexistent")
    assert d.x_train.shape == (1437, 64) and d.x_test.shape == (360, 64)
    assert sorted(d.y_train.unique().tolist()) == list(range(10))


@pytest.mark.slow  # reads and checks 140,000 real images (3 s)
def test_real_mnist_and_fashion_mnist(shared_data):
    m = load(MNIST, shared_data)
    assert m.x_train.shape == (60000, 1, 28, 28) and m.x_test.shape == (10000, 1, 28, 28)
    assert m.x_train.mean().item() == pytest.approx(0.1307, abs=1e-4)  # SOURCES.md
    assert torch.bincount(m.y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    f = load(FASHION, shared_data)
    assert f.x_train.mean().item() == pytest.approx(0.2860, abs=1e-4)


def test_real_ag_news_test_split_as_a_scratch_train_test_pair(shared_data, tmp_path):
    """A checkout may hold only AG News's test split: split it 6,000 / 1,600 into a scratch root."""
    rows = pd.read_csv(shared_data / "ag_news_csv" / "test.csv.gz", header=None)
    folder = tmp_path / "ag_news_csv"
    folder.mkdir()
    rows.iloc[:6000].to_csv(folder / "train.csv", header=False, index=False)
    rows.iloc[6000:].to_csv(folder / "test.csv", header=False, index=False)
    cfg = OmegaConf.create(dict(name="ag_news", task="classification", load={
        "_target_": "dpgrid.data.datasets.load_ag_news", "max_words": 15, "glove": None}))
    d = load(cfg, tmp_path)
    assert d.x_train.shape == (6000, 750) and d.x_test.shape == (1600, 750)
    assert (d.x_train != 0).any(dim=1).float().mean() > 0.99  # nearly every text has known words
