"""A fixed stage's features of a dataset (dpgrid.models.stages.FixedFeatures: the scattering transform), computed once
and kept as a private working file on this machine; every grid after the first reads them in seconds.

Where: DPGRID_FEATURES, else $XDG_CACHE_HOME/dpgrid/features (~/.cache/dpgrid/features), one folder per key:

    key = SHA-256 of the stage's identity (its name, settings and version) and of the inputs' bytes, shapes and dtypes
          (both splits, as the loader returned them): another setting, another data file or another loader's output is
          another key, so a changed data file is never served stale features
    train.npy, test.npy   float32 in NumPy's format, read back as memory maps: their pages are the operating system's
                          file cache, shared by the processes of one machine; a process holds at most the file
    meta.json             the dataset's name and the stage's identity (to drop the entries of the same dataset and stage
                          made from other data), written first, so that a computation a kill interrupted is
                          known too; an entry is finished when both arrays are there

While computing, each split is written chunk by chunk into <split>.npy.part, and <split>.rows (how many rows are in it)
is replaced after each chunk is flushed: a process killed, kill -9 included, leaves at most one chunk to do again, and
the next one resumes there. Two processes that need the same entry take turns (a lock file); the second finds it done.
A process opening an entry holds it shared, and drop_stale removes only what nobody holds.

The features are the private training data, transformed: the folder is made readable by its owner only, and nothing
of it (its path, its key, the data's digest) is written into a run directory, a plan or a release. "off" keeps
nothing: the features are computed in memory by every process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dpgrid import cache_folder
from dpgrid.data import Data

CHUNK = 128  # images per step of the transform on a CPU: bounds its working memory (the scattering's coefficients of one
             # scale, 11 MB); 16 times more on a GPU, whose steps are bound by their launches


def digest(stage, data: Data) -> str:
    """The entry's key: the stage's identity and the inputs' bytes, shapes and dtypes (both splits)."""
    h = hashlib.sha256(json.dumps(stage.identity(), sort_keys=True).encode())
    for x in (data.x_train, data.x_test):
        h.update(f"{tuple(x.shape)}|{x.dtype}|".encode())
        h.update(memoryview(np.ascontiguousarray(x.detach().cpu().numpy())).cast("B"))
    return h.hexdigest()


def with_features(stage, data: Data, name: str, progress: bool = False) -> tuple:
    """(the data with x_train and x_test replaced by the stage's features, on the inputs' device; what was done, in
    words, or '' where the features were read back). Targets stay as they are."""
    device = data.x_train.device
    stage = stage.to(device)
    folder = cache_folder("DPGRID_FEATURES", "features")
    started = time.perf_counter()
    if folder is None:
        train, test = (transform(stage, x, None, progress, f"{name} {split}") for split, x in
                       (("train", data.x_train), ("test", data.x_test)))
        said = f"features: {name}'s computed in {time.perf_counter() - started:.1f} s (not kept: DPGRID_FEATURES=off)"
    else:
        entry = folder / digest(stage, data)[:32]
        computed = False
        maps = read_back(entry)
        if maps is None:
            with locked(entry):
                if not finished(entry):  # another process may have finished it while this one waited
                    # labelled before computing, so that drop_stale also knows a computation a kill interrupted
                    write_private(entry / "meta.json", json.dumps({"dataset": name, "stage": stage.identity(),
                                                                   "made": time.strftime("%Y-%m-%d %H:%M:%S")}))
                    for split, x in (("train", data.x_train), ("test", data.x_test)):
                        split_file(stage, x, entry, split, progress, f"{name} {split}")
                    drop_stale(folder, entry, name, stage.identity())
                    computed = True
                maps = memory_maps(entry)  # opened while held: nothing drops the entry in between
        train, test = maps
        said = (f"features: {name}'s {stage.identity()['stage']} computed in {time.perf_counter() - started:.1f} s and "
                f"kept for the next grids ({train.nbytes + test.nbytes:,} bytes, private: DPGRID_FEATURES says "
                "where)") if computed else ""
    features = replace(data, x_train=train.to(device), x_test=test.to(device))
    return features, said


def transform(stage, x: torch.Tensor, write, progress: bool, what: str, start: int = 0) -> torch.Tensor:
    """The stage on x chunk by chunk (on x's device): each chunk handed to `write(first row, float32 array)`, or, with
    write None, the whole as a new tensor."""
    from tqdm.auto import tqdm

    rows, chunk = len(x), CHUNK if x.device.type == "cpu" else 16 * CHUNK
    bar = tqdm(total=rows, initial=start, desc=f"features {what}", unit="img", disable=None if progress else True)
    chunks = []
    with torch.no_grad():
        for first in range(start, rows, chunk):
            y = stage(x[first:first + chunk]).float().cpu()
            if write is None:
                chunks.append(y)
            else:
                write(first, y.numpy())
            bar.update(len(y))
    bar.close()
    return torch.cat(chunks) if write is None else None


def split_file(stage, x: torch.Tensor, entry: Path, split: str, progress: bool, what: str) -> None:
    """<entry>/<split>.npy, resuming a partial file where a killed process left it. Rows are written with pwrite, not
    through a memory map: the process holds one chunk, never the file's pages."""
    final, part, rows_file = entry / f"{split}.npy", entry / f"{split}.npy.part", entry / f"{split}.rows"
    if final.exists():
        return
    with torch.no_grad():
        shape = (len(x), *stage(x[:1]).shape[1:])
    start, offset = 0, None
    if part.exists() and rows_file.exists():
        try:
            found = np.load(part, mmap_mode="r")
            start, offset = int(rows_file.read_text()), found.offset
            if found.shape != shape or found.dtype != np.float32 or not 0 <= start <= len(x):
                start, offset = 0, None
            del found
        except (OSError, ValueError):
            start, offset = 0, None
    if offset is None:
        with contextlib.suppress(FileNotFoundError):
            rows_file.unlink()
        header = np.lib.format.open_memmap(part, mode="w+", dtype=np.float32, shape=shape)  # sized, zero, unwritten
        offset = header.offset
        del header
        os.chmod(part, 0o600)
    row_bytes = int(np.prod(shape[1:])) * 4
    fd = os.open(part, os.O_WRONLY)
    try:
        def write(first: int, rows: np.ndarray) -> None:
            os.pwrite(fd, np.ascontiguousarray(rows).tobytes(), offset + first * row_bytes)
            os.fsync(fd)  # the rows reach the file before the count that vouches for them
            write_private(rows_file, str(first + len(rows)))

        transform(stage, x, write, progress, what, start)
    finally:
        os.close(fd)
    os.replace(part, final)
    rows_file.unlink()


def write_private(path: Path, text: str) -> None:
    """Write-then-rename, readable by the owner only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def finished(entry: Path) -> bool:
    """Both arrays are there (each is renamed into place whole) under the entry's label."""
    return all((entry / name).exists() for name in ("meta.json", "train.npy", "test.npy"))


def memory_maps(entry: Path) -> tuple:
    return tuple(torch.from_numpy(np.load(entry / f"{split}.npy", mmap_mode="c")) for split in ("train", "test"))


def read_back(entry: Path) -> tuple | None:
    """(train, test) as memory maps of a finished entry, or None. The entry is held shared while its files are opened,
    so drop_stale (which needs it exclusively) cannot remove one between the two; once open, a map outlives the
    file's removal."""
    import fcntl

    path = entry / ".lock"
    try:
        handle = open(path, "r")  # "r": an entry that is not there is not made here
    except FileNotFoundError:
        return None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        return memory_maps(entry) if holds(handle, path) and finished(entry) else None


def holds(handle, path: Path) -> bool:
    """Whether the lock taken through `handle` is on the entry's lock file still: drop_stale moves an entry away
    before removing it, so the file a process waited on may no longer be the entry's."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def locked(entry: Path):
    """The entry's folder (made owner-only), held exclusively: a second process waits for the first."""
    import fcntl

    entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    while True:
        entry.mkdir(exist_ok=True, mode=0o700)
        try:
            handle = open(entry / ".lock", "a+")
        except FileNotFoundError:  # moved away between the two lines: made again
            continue
        fcntl.flock(handle, fcntl.LOCK_EX)
        if holds(handle, entry / ".lock"):
            break
        handle.close()  # dropped while this process waited: the entry is made again
    with handle:
        yield


def drop_stale(folder: Path, keep: Path, name: str, identity: dict) -> None:
    """Remove the entries of the same dataset and stage made from other data (a data file changed since), finished
    or left half-computed by a kill: they would never be read again. An entry another process holds (computing or
    opening it) is left alone. One dropped is first moved out of its key's way (.dropped-*), so no process finds half
    of it there; a removal that a kill interrupted is finished by the next call."""
    import fcntl

    for other in folder.iterdir():
        if other.name.startswith(".dropped-"):
            shutil.rmtree(other, ignore_errors=True)
            continue
        if other == keep or not (other / "meta.json").exists():
            continue
        try:
            meta = json.loads((other / "meta.json").read_text())
        except (OSError, ValueError):  # removed meanwhile, or not readable: not this call's to drop
            continue
        if meta.get("dataset") != name or meta.get("stage") != identity:
            continue
        try:  # read-write, as an exclusive lock over NFS needs; made where a killed removal took it
            handle = os.fdopen(os.open(other / ".lock", os.O_RDWR | os.O_CREAT, 0o600), "r+")
        except OSError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # BlockingIOError: held by another process
                continue
            if not holds(handle, other / ".lock"):
                continue
            moved = folder / f".dropped-{other.name}-{os.getpid()}"
            try:
                os.rename(other, moved)
            except OSError:
                continue
        shutil.rmtree(moved, ignore_errors=True)
