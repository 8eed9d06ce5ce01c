"""The digests of a grid's result files (digests.json): what a table, `dpgrid model` or a rerun reads as the grid's
result is what the grid wrote, or it is refused in one line naming the file.

runs.csv, curves.csv and summary.csv are published as a composition grid's result (a selection's are its private
log, from which its release is checked). dpgrid alone appends to them or rewrites them, and it records each one's
SHA-256 and size in digests.json (write-then-rename):

- before a commit writes a file, the digest the file will have afterwards, as `pending`;
- after every commit of a run, and at the end of every command, each file's digest as `files` (the pending ones go).

So a reader (tables, `dpgrid model`) takes a file only when it is whole and its digest is the sealed one; a rerun
takes a file whose beginning is the sealed one and whose end, if any, is what the pending commit was writing (a
command stopped between a commit and its seal); anything else is refused in one line naming the file. The digests
are no signature: whoever can write the directory can write them too. What they prevent is a number edited by hand,
or a row added, published under the grid's epsilon without a word.
"""

import hashlib
import json
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.results.files import DIGESTS, delete_release, environment, write_json

SEALED = ("runs.csv", "curves.csv", "summary.csv")


LINED = ("runs.csv", "curves.csv")  # each line's digest kept too: a rerun tells a line lost from a line changed


def digest(content: bytes, name: str = "") -> dict:
    found = {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
    if name in LINED:
        found["lines"] = sorted({line_digest(line) for line in content.splitlines()})
    return found


def line_digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()[:16]


def read_bytes(path: Path) -> bytes:
    with environment(path):
        return path.read_bytes()


def recorded(out: Path):
    """digests.json as {"files": {name: digest}, "pending": {name: digest}}, or None where there is none or it is
    damaged."""
    path = Path(out) / DIGESTS
    try:
        with environment(path):
            found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None

    def digests(value) -> bool:
        return isinstance(value, dict) and all(isinstance(v, dict) and isinstance(v.get("sha256"), str)
                                               and isinstance(v.get("bytes"), int) for v in value.values())
    if not (isinstance(found, dict) and digests(found.get("files")) and digests(found.get("pending", {}))):
        return None
    return {"files": found["files"], "pending": found.get("pending", {})}


def seal(out: Path) -> None:
    """Record each result file's digest as it stands now (no commit pending)."""
    out = Path(out)
    write_json(out / DIGESTS, {"files": {name: digest(read_bytes(out / name), name) for name in SEALED
                                         if (out / name).exists()}})


def expect(out: Path, name: str, content: bytes) -> None:
    """Before a commit writes `name` as `content`: the digest it will have, pending until the next seal."""
    out = Path(out)
    found = recorded(out) or {"files": {}, "pending": {}}
    if not found["files"] and not found["pending"] and any((out / n).exists() for n in SEALED):
        return  # results no digest covers: the rerun that vouches for them seals them first (resume)
    write_json(out / DIGESTS, {"files": found["files"], "pending": {**found["pending"], name: digest(content, name)}})


RERUN = "run the grid's command again, which finishes or drops that commit"
RESTORE = "restore it, or run the grid's command again with overwrite=true to train the grid anew"
UNSEALED = "run the grid's command again: a seeded grid trains its runs again (the same numbers) and seals them"


def problem(out: Path, whole: bool = True) -> tuple:
    """(why a result file of `out` is not the one its grid wrote, what to do), ('', '') when every one is: `whole`, as
    a reader needs it (sealed, nothing after); else as a rerun takes it (its sealed beginning, and at most the
    pending commit)."""
    out = Path(out)
    present = [name for name in SEALED if (out / name).exists()]
    if not present:
        return "", ""
    found = recorded(out)
    if found is None:
        return (f"{out / DIGESTS} is missing or damaged, so {out / present[0]} cannot be told from an edited copy "
                "(results written before dpgrid sealed them, or files from elsewhere)", UNSEALED)
    for name in present:
        path, sealed, pending = out / name, found["files"].get(name), found["pending"].get(name)
        content = read_bytes(path)
        if name == "curves.csv" and not content.strip():  # as if missing: no learning-curve figure, and said
            continue
        if sealed is None and pending is None:
            return f"{path} is not among the files its grid sealed ({out / DIGESTS})", RESTORE
        if same(content, sealed):
            continue
        if not whole and pending is not None and matches_pending(content, sealed, pending, name):
            continue
        if pending is not None and matches_pending(content, sealed, pending, name):
            return f"{path} holds a commit its grid did not seal (a command stopped between a commit and its seal)", RERUN
        return f"{path} is not the file its grid wrote (edited after it was sealed: {out / DIGESTS})", RESTORE
    return "", ""


def same(content: bytes, entry) -> bool:
    """Whether `content` is the file a digest entry records (its SHA-256 and size)."""
    return entry is not None and len(content) == entry["bytes"] and \
        hashlib.sha256(content).hexdigest() == entry["sha256"]


def matches_pending(content: bytes, sealed, pending: dict, name: str) -> bool:
    """Whether `content` is what a stopped commit left: the pending file whole, or (curves.csv, appended in place)
    a beginning of it that starts with the sealed file."""
    if same(content, pending):
        return True
    if name != "curves.csv" or len(content) > pending["bytes"]:
        return False
    return sealed is None or same(content[:sealed["bytes"]], sealed)


def changed_lines(out: Path, name: str) -> list:
    """The lines of `name` that neither its seal nor a pending commit holds, and that read as its rows (the header's
    number of fields, text): lines changed or added by hand. Lines lost, and garbage (damage), are not among them:
    a rerun's own checks train again what they lost, or name them."""
    found = recorded(out) or {"files": {}, "pending": {}}
    known = {d for entry in (found["files"].get(name), found["pending"].get(name)) if entry for d in entry.get("lines", [])}
    lines = read_bytes(Path(out) / name).splitlines()
    if not lines or line_digest(lines[0]) not in known:  # no header, or not the sealed one: damage, not an edit
        return []
    width = lines[0].count(b",")
    return [line for line in lines[1:] if line_digest(line) not in known and line.count(b",") == width
            and b"\x00" not in line and line.decode("utf-8", errors="replace") == line.decode("utf-8", errors="ignore")]


def unsealed(out: Path) -> list:
    """The result files of `out` that are not as their grid wrote them, as a rerun takes them (problem's, whole=False);
    every present one where no digest covers them."""
    out = Path(out)
    present = [name for name in SEALED if (out / name).exists()]
    found = recorded(out)
    if found is None:
        return present
    bad = []
    for name in present:
        sealed, pending = found["files"].get(name), found["pending"].get(name)
        content = read_bytes(out / name)
        if not (same(content, sealed) or (pending is not None and matches_pending(content, sealed, pending, name))):
            bad.append(name)
    return bad


def check(out: Path) -> None:
    """A reader's check: DpgridError naming the first result file that is not whole and sealed."""
    found, repair = problem(out, whole=True)
    if found:
        raise DpgridError(f"{found}; {repair}")


def resume(out: Path, found: str, overwrite: bool) -> str:
    """A seeded grid about to train in `out` again, whose result files are not what it wrote (`found`: `problem`'s
    line, not whole): where no digest covers them, delete them and say so (its runs are trained again: the same runs,
    the same numbers); else DpgridError naming the file, or with overwrite=true delete the grid's results and say so.
    (A secure grid's ledger judges instead: dpgrid.results.ledger.start_over.)"""
    out = Path(out)
    if recorded(out) is None:
        for name in SEALED:
            with environment(out / name):
                (out / name).unlink(missing_ok=True)
        return f"{found}: its runs are trained again (a seeded grid: the same runs, the same numbers) and sealed"
    if not overwrite:
        raise DpgridError(f"{found}; restore it, or pass overwrite=true to train the grid anew")
    delete_release(out)
    return f"overwrite=true: {found}; the grid's results are deleted and it trains anew"
