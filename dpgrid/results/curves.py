"""curves.csv: every validation of every run, appended and fsynced before the run's commit in runs.csv, and
read back with whatever damage it took dropped (the runs whose curves lost a validation are trained again)."""

import csv
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from dpgrid.results.files import environment


def whole_curve(steps: list, last, eval_every: int) -> bool:
    """Whether a run's validation steps are all there: every multiple of eval_every up to its last step, and
    that last step (the one its row records, unless it diverged: then wherever its curve ends)."""
    last = max(steps) if last is None else last
    return sorted(steps) == sorted(set(range(eval_every, last + 1, eval_every)) | {last})


def read_curves(path: Path) -> tuple:
    """(curves.csv's sound rows, what damage was dropped: '' for none). A torn last line (a kill mid-append),
    garbage bytes, lines that are not a validation's numbers, a torn header or an empty file are dropped;
    the runs whose curves they held are then trained again."""
    columns = ["config_id", "seed", "step"]
    empty = pd.DataFrame(columns=columns)
    if not path.exists():
        return empty, ""
    with environment(path):
        text = path.read_bytes().decode("utf-8", errors="replace")
    try:
        lines = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error:
        lines = []
    header = lines[0] if lines else []
    if not set(columns) <= set(header) or len(set(header)) != len(header):
        return empty, "was empty" if not text.strip() else "is damaged (its header is not a curves header)"
    sound = [row for row in lines[1:] if sound_curve_row(header, row)]
    dropped = len(lines) - 1 - len(sound)
    damage = f"held {dropped} damaged line(s), dropped" if dropped else ""
    frame = pd.DataFrame(sound, columns=header).replace("", np.nan)
    numeric = [c for c in header if c != "config_id"]
    frame[numeric] = frame[numeric].astype(float)
    frame["seed"], frame["step"] = frame.seed.astype(int), frame.step.astype(int)
    return frame, damage


def sound_curve_row(header: list, row: list) -> bool:
    """A whole validation row: every field a number (or empty, a diverged value), seed and step whole."""
    if len(row) != len(header):
        return False
    record = dict(zip(header, row))
    if not record["config_id"] or "\ufffd" in record["config_id"]:
        return False
    try:
        numbers = {k: float(v) for k, v in record.items() if k != "config_id" and v != ""}
    except ValueError:
        return False
    return all(k in numbers and numbers[k].is_integer() and numbers[k] >= 0 for k in ("seed", "step"))


def append_curves(path: Path, rows: list) -> None:
    """Append complete rows and fsync, before the run's commit; the file they make is recorded as pending first
    (dpgrid.results.seal)."""
    from dpgrid.results.seal import expect

    path = Path(path)
    with environment(path):
        before = path.read_bytes() if path.exists() else b""
    added = pd.DataFrame(rows).to_csv(header=not before, index=False).encode()
    expect(path.parent, path.name, before + added)
    with environment(path), open(path, "ab") as f:
        f.write(added)
        f.flush()
        os.fsync(f.fileno())
