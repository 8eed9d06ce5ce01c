"""A secure grid's ledger (ledger.json, private): what it has committed, drawn and released, so that nothing is
trained or drawn twice.

A secure grid (privacy.secure_rng=true) draws its batches, noise and draws (a selection's candidates, a tuning set,
the statistics its model estimates) from the operating system: a run trained again gets other noise, so its output
is a second release on the same data, which spends epsilon again. A seeded grid's runs trained again are the same
runs (their noise follows from public names), so it repairs damage by retraining; a secure grid must not. Its ledger
is written before anything else of the grid (so that a directory whose ledger is gone is known to have held one), and
rewritten (write-then-rename) at every commit, draw and release:

    {"committed": runs committed, "files": {draw file: its SHA-256 when drawn}, "released": whether the grid ended,
     "release": {released file: its SHA-256} once it has released (selection.json, model/model.json, summary.csv)}

A grid that has released re-presents that release, checked against these digests, at every later command, whatever
runs.csv, curves.csv, weights/ or selection.json then say: it releases once.

At the start of the same command, everything must agree with it, else the command is refused in one line, touching
nothing: runs.csv holds every committed run, each draw file is the one drawn, released files stand only where the
ledger says the grid ended, and a damaged ledger is refused, never rewritten. `overwrite=true` deletes the grid's
files and starts a new release, said to spend epsilon again.
"""

import hashlib
import warnings
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.results.files import DIGESTS, LEDGER, STATISTICS, delete_release, environment, read_json, write_json
from dpgrid.results.procedure import procedure_of
from dpgrid.results.runs import Lost, finished_runs, unreadable_header

NEW_RELEASE = "a new release on the same data, which spends a new (epsilon, delta) on top of the earlier one's"
RELEASED = ("selection.json", "model")  # what a grid writes once it has ended (summary.csv is rewritten at every end)
# the draws made once before the runs train: a selection's, and the statistics a model estimates of the data
DRAW_FILES = ("candidates.json", "tuning_set.json", STATISTICS)
# what else an earlier command of a grid leaves: a secure grid whose ledger is gone beside any of them lost its record
LEFTOVERS = ("config.yaml", "cli.log", ".hydra", DIGESTS, "curves.csv", "summary.csv", "weights", "audit")


def kept(spec) -> bool:
    """Whether this grid keeps a ledger: its runs cannot be trained again without spending epsilon again."""
    return bool(spec.train.secure_rng) and spec.plan.private


def committed_rows(out: Path):
    """The number of sound rows of runs.csv, or None when it is missing, empty or unreadable."""
    path = Path(out) / "runs.csv"
    if not path.exists() or unreadable_header(path):
        return None
    with environment(path):
        lines = [line for line in path.read_text(errors="replace").splitlines()[1:] if line.strip()]
    return len(lines)


def read_ledger(path: Path) -> dict:
    """ledger.json as {"committed", "files", "released"}; Lost in one line when it is damaged (never rewritten).
    A ledger of an earlier dpgrid ({"committed": n} alone) reads with its draws unrecorded (None)."""
    try:
        ledger = read_json(path, "")
    except DpgridError as e:
        raise Lost(damaged(path, str(e).split("(", 1)[-1].rstrip("); "))) from None
    committed, files, released = ledger.get("committed"), ledger.get("files", None), ledger.get("released", False)
    if not (isinstance(committed, int) and not isinstance(committed, bool) and committed >= 0):
        raise Lost(damaged(path, f"committed = {committed!r}, not a count of runs"))
    if not (files is None or (isinstance(files, dict) and all(isinstance(v, str) for v in files.values()))):
        raise Lost(damaged(path, "files is not a map of draw files to checksums"))
    if not isinstance(released, bool):
        raise Lost(damaged(path, f"released = {released!r}, not true or false"))
    release = ledger.get("release")
    if not (release is None or (isinstance(release, dict) and all(isinstance(v, str) for v in release.values()))):
        raise Lost(damaged(path, "release is not a map of released files to checksums"))
    release_id = ledger.get("release_id")
    return {"committed": committed, "files": files, "released": released,
            **({"release": release} if release is not None else {}),
            **({"release_id": release_id} if isinstance(release_id, str) else {})}


def fresh() -> dict:
    """A new secure grid's ledger: nothing committed, drawn or released, and the id of this release (the study's
    ledger enters each release of a secure grid apart: dpgrid.results.study)."""
    import secrets

    return {"committed": 0, "files": {}, "released": False, "release_id": secrets.token_hex(8)}


def release_id(out: Path) -> str:
    """The id of the secure grid's release in `out` (its ledger's; '' for a ledger of an earlier dpgrid)."""
    path = Path(out) / LEDGER
    return read_ledger(path).get("release_id", "") if path.exists() else ""


def damaged(path: Path, why: str) -> str:
    return (f"{path} is damaged ({why}): what this secure grid committed cannot be known, and a ledger is never "
            f"rewritten; restore it, or pass overwrite=true to start {NEW_RELEASE}")


def check(out: Path, spec, plan: dict) -> None:
    """Refuse, before anything is trained, a secure grid whose files do not agree with its ledger (above), or whose
    release (model/) is not sound or not this grid's (`plan`: the plan.json it writes); write a new grid's empty
    ledger. With overwrite=true, delete the grid's files and warn that the next release spends epsilon again."""
    out = Path(out)
    if not kept(spec):
        return
    path, rows = out / LEDGER, committed_rows(out)
    try:
        ledger = read_ledger(path) if path.exists() else None
    except Lost as e:
        return start_over(out, spec, str(e), said=True)
    released = [name for name in RELEASED if (out / name).exists()]
    started = [name for name in ("plan.json", "runs.csv", *DRAW_FILES, *released, *LEFTOVERS) if (out / name).exists()]
    if ledger is None:
        if started:
            return start_over(out, spec, f"{path} is missing but {out} holds this secure grid's {', '.join(started)}: "
                                         "what it committed and released cannot be known")
        write_json(path, fresh())  # before plan.json: a grid begins here
        return
    committed = max(ledger["committed"], rows or 0)
    problem = ""
    if committed and rows is None:
        problem = f"{out / 'runs.csv'} is missing or damaged but this secure grid committed {committed} run(s) ({path})"
    elif rows is not None and rows < committed:
        problem = f"{out / 'runs.csv'} holds {rows} of the {committed} runs this secure grid committed ({path})"
    elif released and not ledger["released"]:
        problem = (f"{out} holds released files ({', '.join(released)}) but {path} records no release (an earlier copy "
                   "of the ledger, or files from elsewhere)")
    elif draw_problem := drawn_problem(out, ledger, committed):
        problem = draw_problem
    elif draw_problem := procedure_of(spec.plan.method).unreleased_draw(out, committed):
        problem = draw_problem
    elif changed := changed_release(out, ledger):
        problem = changed
    elif "model" in released:
        from dpgrid.results.statement import release_problem

        problem = release_problem(out, plan=plan)[1]
    if problem:
        return start_over(out, spec, problem)
    if rows and rows > ledger["committed"]:  # a kill between a commit and the ledger's update: the rows are right
        write_json(path, {**ledger, "committed": rows})


def drawn_problem(out: Path, ledger: dict, committed: int) -> str:
    """Why a draw file does not agree with the ledger ('' when it does): gone, or not the file that was drawn."""
    for name, digest in (ledger["files"] or {}).items():
        file = out / name
        if not file.exists():
            return f"{file} is missing but this secure grid drew it ({out / LEDGER})"
        if sha256(file) != digest:
            return f"{file} is not the draw this secure grid recorded in {out / LEDGER} (edited or replaced)"
    if ledger["files"] is not None:
        for name in DRAW_FILES:
            if (out / name).exists() and name not in ledger["files"] and committed:
                return f"{out / name} was not drawn by this secure grid ({out / LEDGER} records no such draw)"
    return ""


def start_over(out: Path, spec, problem: str, said: bool = False) -> None:
    """Refuse the damaged release `problem` describes, or with overwrite=true delete it and say that the next one
    spends epsilon again. `said`: the problem already says what to do."""
    if not spec.overwrite:
        raise Lost(problem if said else f"{problem}; training its runs again would be {NEW_RELEASE}: restore the "
                   "file, or pass overwrite=true to start a new release")
    warnings.warn(f"overwrite=true: {problem.split('; ')[0]}; the release's files are deleted and its runs trained "
                  f"anew: {NEW_RELEASE}", stacklevel=3)
    delete_release(out)
    write_json(Path(out) / LEDGER, fresh())


def update(out: Path, spec, **changes) -> None:
    """Rewrite this secure grid's ledger with `changes` (committed=n, released=True)."""
    if kept(spec):
        path = Path(out) / LEDGER
        write_json(path, {**read_ledger(path), **changes})


def record(out: Path, spec, committed: int) -> None:
    """After a commit: the number of runs this secure grid has committed."""
    update(out, spec, committed=committed)


def record_draws(out: Path, spec) -> None:
    """Once the grid's draws are made (before anything is trained from them): each draw file's checksum, which it
    must keep from now on. A file the ledger holds already was checked by `check`."""
    if not kept(spec):
        return
    ledger = read_ledger(Path(out) / LEDGER)
    files = dict(ledger["files"] or {})
    for name in DRAW_FILES:
        if (Path(out) / name).exists() and name not in files:
            files[name] = sha256(Path(out) / name)
    if files != (ledger["files"] or {}):
        update(out, spec, files=files)


def sha256(path: Path) -> str:
    with environment(path):
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def release_files(out: Path) -> dict:
    """{released file: its SHA-256} of what a grid's release consists of as it stands: selection.json, model.json
    (which holds each model file's digest) and summary.csv."""
    out = Path(out)
    return {name: sha256(out / name) for name in ("selection.json", "model/model.json", "summary.csv")
            if (out / name).exists()}


def record_release(out: Path, spec) -> None:
    """Once a secure grid has released: what it released, which every later command of the grid re-presents or
    refuses, never releases anew."""
    if kept(spec):
        update(out, spec, release=release_files(out))


def recorded_release(out: Path, spec):
    """What a secure grid released earlier (release_files's), or None when it has not released yet. Lost (one line)
    when a released file is gone or changed: the grid releases once."""
    if not kept(spec):
        return None
    ledger = read_ledger(Path(out) / LEDGER)
    release = ledger.get("release")
    if not ledger["released"] or release is None:
        return None
    changed = changed_release(out, ledger)
    if changed:
        raise Lost(f"{changed}; restore it (the ledger holds its digest), or pass overwrite=true to start a new release "
                   "(it spends epsilon again)")
    return release


def changed_release(out: Path, ledger: dict) -> str:
    """Why what a secure grid released is not as its ledger recorded it ('' when it is, or nothing was released)."""
    now = release_files(out)
    for name, digest in (ledger.get("release") or {}).items():
        if now.get(name) != digest:
            return (f"{Path(out) / name} is not what this secure grid released ({Path(out) / LEDGER}): a grid releases "
                    "once, and releasing again would be a second output on the same data")
    return ""


def check_untrained(out: Path, spec, todo: list) -> None:
    """The last word before a secure grid trains: a grid whose ledger says it ended trains nothing again."""
    if kept(spec) and todo and read_ledger(Path(out) / LEDGER)["released"]:
        raise Lost(f"{out} holds a secure grid that has ended ({out / LEDGER}), yet {len(todo)} run(s) would be trained "
                   f"again: that would be {NEW_RELEASE}; restore the files it lost, or choose another hydra.run.dir")


def committed_runs(out: Path, spec) -> set:
    """(config_id, seed) of the runs runs.csv holds with their whole curves. A seeded grid trains again a run whose
    curves were lost (the same run); a secure grid refuses, or with overwrite=true starts a new release."""
    def found(repair: bool) -> set:
        return finished_runs(out, spec.plan, spec.train.eval_every, spec.config_hash,
                             {c["config_id"] for c in spec.to_train}, repair=repair)
    try:
        return found(repair=not kept(spec))
    except Lost as lost:
        start_over(out, spec, str(lost))
        return found(repair=True)


def recorded_statistics(out: Path, spec, data):
    """A secure grid's statistics as it first estimated them: read from statistics.json (its ledger holds the file's
    checksum, checked before), or this command's estimate written there before anything trains with it. A seeded
    grid's, or a model's without statistics: `data` as it is."""
    if not (spec.train.secure_rng and data.statistics):
        return data
    import torch
    from dataclasses import replace

    path = Path(out) / STATISTICS
    if path.exists():
        found = read_json(path, "")
        try:
            statistics = {name: torch.tensor(found[name], dtype=value.dtype, device=value.device)
                          for name, value in data.statistics.items()}
            fits = len(found) == len(statistics) and all(statistics[n].shape == v.shape for n, v in data.statistics.items())
        except (KeyError, TypeError, ValueError):
            fits = False
        if not fits:
            raise DpgridError(f"{path} does not hold this grid's statistics ({', '.join(sorted(data.statistics))}); "
                              "restore it, or pass overwrite=true to start a new release (it spends a new epsilon)")
        return replace(data, statistics=statistics)
    write_json(path, {name: value.tolist() for name, value in data.statistics.items()})
    return data
