"""Files a grid writes and reads: whole or absent, one writer at a time, damage named in one line.

- Every file is written by write-then-rename (`write_atomic`): a kill or a full disk leaves the old
  file or the new one, never a torn or empty one; the temporary file is removed on failure.
- `locked(out)`: an exclusive OS lock (flock) on the run directory for as long as a grid writes into
  it; the kernel releases it when the holder dies, so kill -9 leaves nothing stale.
- Environment faults (full disk, read-only or missing folders, a file where a folder should be)
  become one line naming the path and what to do (`EnvironmentFault`, exit code 1).
"""

import contextlib
import contextvars
import csv
import errno
import io
import json
import math
import os
import re
import shutil
from pathlib import Path

from dpgrid import DpgridError, EnvironmentFault

MIN_FREE_BYTES = 16 * 2 ** 20  # a grid's files are small; less free space than this is refused up front
MIN_FREE_INODES = 64  # and it creates a few dozen files at most (temporary files included)


# how the caller names the directory it writes into, for the hints below: hydra.run.dir=... for `dpgrid run`,
# hydra.sweep.dir=... for a sweep, --out DIR for `dpgrid tables`, run_grid's out_dir from Python
DIRECTORY = contextvars.ContextVar("directory", default="hydra.run.dir=...")


@contextlib.contextmanager
def directory_setting(name: str):
    """Within the block, the hints of refusals name the directory as `name` says (e.g. "--out DIR")."""
    token = DIRECTORY.set(name)
    try:
        yield
    finally:
        DIRECTORY.reset(token)


def describe_os_error(e: OSError, path) -> EnvironmentFault:
    """An OSError at `path` as one line saying what to do (naming the file dpgrid meant, never its temporary)."""
    temporary = e.filename and Path(str(e.filename)).name.endswith(".tmp") and str(e.filename) != str(path)
    path = path if temporary else e.filename or path
    what = {errno.ENOSPC: "no space left on the device: free some space, then run the same command again "
                          "(it resumes where it stopped)",
            errno.EDQUOT: "disk quota exceeded: free some space, then run the same command again",
            errno.EACCES: f"permission denied: choose a writable directory ({DIRECTORY.get()})",
            errno.EPERM: f"permission denied: choose a writable directory ({DIRECTORY.get()})",
            errno.EROFS: f"read-only file system: choose a writable directory ({DIRECTORY.get()})",
            errno.ENOTDIR: "a file stands where a folder is needed: choose another directory",
            errno.EEXIST: "a file stands where a folder is needed: choose another directory",
            errno.EISDIR: "a folder stands where a file is needed: move it away",
            errno.ENAMETOOLONG: "a name in the path is too long (at most 255 bytes per folder or file name): choose a "
                                f"shorter one ({DIRECTORY.get()})"}
    return EnvironmentFault(f"cannot write {path}: {what.get(e.errno, e.strerror or str(e))}")


@contextlib.contextmanager
def environment(path):
    """Turn OSErrors raised inside into one-line EnvironmentFaults naming `path`."""
    try:
        yield
    except OSError as e:
        raise describe_os_error(e, path) from None


def write_atomic(path, content) -> None:
    """Write text or bytes by write-then-rename, fsynced; on any failure the old file stays as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    data = content.encode() if isinstance(content, str) else content
    with environment(path):
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def write_csv(path, frame) -> None:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    write_atomic(path, buffer.getvalue())


def write_json(path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2) + "\n")


def read_json(path, repair: str) -> dict:
    """A JSON object, or DpgridError naming the file as damaged and saying `repair`."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DpgridError(f"damaged file {path} ({damage(path, e)}); {repair}") from None
    if not isinstance(obj, dict):
        raise DpgridError(f"damaged file {path} (not a JSON object); {repair}")
    return obj


def damage(path: Path, error=None) -> str:
    if path.exists() and path.stat().st_size == 0:
        return "empty"
    return f"unreadable: {str(error).splitlines()[0]}" if error else "unreadable"


def read_rows(path, repair: str) -> tuple:
    """(header, rows, DataFrame) of a CSV file read once, every row as long as the header; DpgridError
    naming the file and the first bad line otherwise (a torn last line included). The raw rows are for
    checks the parsed frame would hide (a non-number in a numeric column, say)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise DpgridError(f"damaged file {path} ({damage(path, e)}); {repair}") from None
    if not text.strip():
        raise DpgridError(f"damaged file {path} (empty); {repair}")
    try:
        lines = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise DpgridError(f"damaged file {path} ({e}); {repair}") from None
    header, rows = lines[0], lines[1:]
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DpgridError(f"damaged file {path}, line {number}: {len(row)} fields where the header has "
                              f"{len(header)} (a torn or edited line); {repair}")
    if not text.endswith("\n"):
        raise DpgridError(f"damaged file {path}, line {len(lines)}: the last line is not terminated (torn); {repair}")
    return header, rows, read_frame(io.StringIO(text))


# Columns that name things: read as text whatever they look like (the config hash 31917e5915963710 is not the
# number 3.19e20, nor 0123456789012345 the number 123456789012345, nor a strategy called "nan" a missing value)
TEXT_COLUMNS = ("config_id", "config_hash", "dataset", "strategy", "metric", "accountant", "budget", "sampling",
                "protocol", "normalize", "draw", "label", "status", "path", "axes", "adapts", "analysis",
                "dataset_epsilons", "selection", "device")


def read_frame(source):
    """A CSV that dpgrid wrote (runs.csv, curves.csv, summary.csv, results.csv) as a DataFrame: the columns of
    TEXT_COLUMNS as text, True/False columns as flags, the others as numbers (an empty field is NaN), and a
    column that is not all numbers as text. pandas' own guess would turn a name that looks like a number into one."""
    import pandas as pd

    frame = pd.read_csv(source, dtype=str, keep_default_na=False)
    for column in frame.columns:
        frame[column] = typed_column(frame[column]) if column not in TEXT_COLUMNS else \
            frame[column].astype(object).where(frame[column] != "", None)  # an empty name: none (as written)
    return frame


NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
WHOLE = re.compile(r"-?\d+")


def typed_column(values):
    """A column of text as written: flags where every value is True or False, whole numbers where every value is
    one, numbers where every value is a number or empty (NaN), else the text. Read value by value in Python: a
    run's file is tens of rows, where pandas' per-column machinery costs more than the values."""
    import numpy as np
    import pandas as pd

    texts = values.tolist()
    if not texts:  # no row to tell its type by
        return values
    present = [t for t in texts if t != ""]
    if present and all(t in ("True", "False") for t in present):
        return values.map({"True": True, "False": False, "": np.nan})
    if not all(NUMBER.fullmatch(t) for t in present):
        return values
    if len(present) == len(texts) and all(WHOLE.fullmatch(t) and -2 ** 63 <= int(t) < 2 ** 63 for t in texts):
        return pd.Series([int(t) for t in texts], index=values.index, name=values.name, dtype="int64")
    return pd.Series([float(t) if t else math.nan for t in texts], index=values.index, name=values.name, dtype=float)


def check_writable(folder) -> None:
    """Refuse, before anything is written, a run directory that cannot be created or written into: a file
    in its way, a read-only or full file system."""
    folder = Path(folder).absolute()
    with environment(folder):
        too_long = next((part for part in folder.parts if len(os.fsencode(part)) > 255), None)
        if too_long:
            raise OSError(errno.ENAMETOOLONG, "name too long", str(folder))
        broken = next((p for p in [folder, *folder.parents] if p.is_symlink() and not p.exists()), None)
        existing = folder
        while not existing.exists():
            existing = existing.parent
    if broken is not None:  # mkdir would fail on it, or loop
        raise EnvironmentFault(f"cannot write {folder}: {broken} is a symbolic link to a missing folder (or to itself); "
                               "remove it or point it at a folder, or choose another directory")
    if existing == folder:
        check_entries(folder)
    if not existing.is_dir():
        raise EnvironmentFault(f"cannot write {folder}: {existing} is a file, not a folder; choose another "
                               f"directory ({DIRECTORY.get()})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EnvironmentFault(f"cannot write {folder}: {existing} is not writable; choose a writable directory "
                               f"({DIRECTORY.get()})")
    if shutil.disk_usage(existing).free < MIN_FREE_BYTES:
        raise EnvironmentFault(f"cannot write {folder}: less than {MIN_FREE_BYTES // 2 ** 20} MB free on its "
                               "device; free some space first")
    stats = os.statvfs(existing)
    if stats.f_files and stats.f_favail < MIN_FREE_INODES:  # f_files = 0: a file system without an inode limit
        raise EnvironmentFault(f"cannot write {folder}: its device has {stats.f_favail} free inodes (files) left, "
                               f"fewer than the {MIN_FREE_INODES} a grid may need; free some first")


LEDGER = "ledger.json"  # a secure grid's count of committed runs (dpgrid.results.ledger)
DIGESTS = "digests.json"  # the result files' digests (dpgrid.results.seal)
STATISTICS = "statistics.json"  # a secure grid's one estimate of its model's statistics (dpgrid.results.ledger)
FOLDERS_IN_A_RUN = (".hydra", "model", "weights")
FILES_IN_A_RUN = (".lock", "cli.log", "config.yaml", "plan.json", "runs.csv", "curves.csv", "summary.csv",
                  "selection.json", "candidates.json", "tuning_set.json", STATISTICS, LEDGER, DIGESTS)
# everything a grid's runs and release are made of: what overwrite=true deletes to start afresh
RELEASE_FILES = tuple(name for name in FILES_IN_A_RUN if name not in (".lock", "cli.log", "config.yaml", "plan.json"))
RELEASE_FOLDERS = ("model", "weights")


def delete_release(out: Path) -> None:
    """Every file a grid's runs and release are made of (overwrite=true)."""
    for name in RELEASE_FILES:
        with environment(out / name):
            (out / name).unlink(missing_ok=True)
    for name in RELEASE_FOLDERS:
        with environment(out / name):
            shutil.rmtree(out / name, ignore_errors=True)


def check_entries(folder: Path) -> None:
    """A run directory whose entries are of the wrong kind (a file named .hydra, a folder named cli.log)."""
    for names, kind, wrong in ((FOLDERS_IN_A_RUN, "folder", Path.is_file), (FILES_IN_A_RUN, "file", Path.is_dir)):
        for name in names:
            if wrong(folder / name):
                raise EnvironmentFault(f"cannot write {folder / name}: dpgrid needs a {kind} there; move it away")


class Busy(DpgridError):
    """Another process holds the run directory: this one writes nothing there and removes nothing."""


@contextlib.contextmanager
def locked(folder):
    """Hold an exclusive lock on `folder` (its .lock file) while the block runs; refuse a second writer.
    The lock file is never deleted while a grid may hold it; a lock taken on a file that has since been
    replaced (its folder removed and made again) is refused like a held one."""
    import fcntl

    path = Path(folder) / ".lock"
    with environment(path):
        handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not path.exists() or os.stat(path).st_ino != os.fstat(handle.fileno()).st_ino:
                raise BlockingIOError
        except BlockingIOError:
            raise Busy(f"another dpgrid process is writing into {folder}; wait for it to finish, or give "
                       f"this job its own directory ({DIRECTORY.get()})") from None
        yield
    finally:
        handle.close()  # releases the lock


def outermost_missing(path: Path):
    """The outermost folder of `path` that does not exist yet (what creating `path` would add), or None."""
    path = Path(path).absolute()
    missing = [p for p in [path, *path.parents] if not p.exists()]
    return missing[-1] if missing else None


def remove_created(out: Path, outermost) -> None:
    """Delete a run directory that holds nothing but what a refused start wrote (Hydra's record, an empty
    log, the lock), and the empty parents created with it, up to `outermost` (None: nothing was created).
    Called with the lock held, so no other grid is writing there."""
    import shutil

    out = Path(out).absolute()
    if outermost is None or not (out == outermost or outermost in out.parents):
        return
    if any(p.name not in (".hydra", "cli.log", ".lock") for p in out.iterdir()):
        return
    shutil.rmtree(out / ".hydra", ignore_errors=True)
    for name in ("cli.log", ".lock"):
        (out / name).unlink(missing_ok=True)
    for folder in [out, *out.parents]:
        if any(folder.iterdir()):
            break
        folder.rmdir()
        if folder == outermost:
            break
