"""A secure grid's ledger (ledger.json, private): how many runs it has committed, so that none is trained twice.

A secure grid (privacy.secure_rng=true) draws its batches and noise from the operating system: a run trained
again gets other noise, so its output is a second release on the same data, which spends epsilon again. A seeded
grid's runs trained again are the same runs (their noise follows from public names), so it repairs damage by
retraining; a secure grid, or a selection whose draw is gone, must not. The ledger is rewritten after every
commit (write-then-rename); at the start of the same command, runs.csv (and a selection's candidates.json) must
still hold every committed run, else the command is refused in one line, and `overwrite=true` starts a new
release, said to spend epsilon again.
"""

import warnings
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.results.files import LEDGER, delete_release, environment, read_json, write_json
from dpgrid.results.runs import Lost, finished_runs, unreadable_header

NEW_RELEASE = "a new release on the same data, which spends a new (epsilon, delta) on top of the earlier one's"


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


def check(out: Path, spec) -> None:
    """Refuse, before anything is trained, a secure grid whose committed runs are not all in runs.csv (and a
    selection's draw in candidates.json), or whose released files stand without their runs; with overwrite=true,
    delete the release and warn that the next one spends epsilon again."""
    out = Path(out)
    if not kept(spec):
        return
    path, rows = out / LEDGER, committed_rows(out)
    recorded = read_json(path, "").get("committed", 0) if path.exists() and _readable(path) else None
    committed = max(recorded or 0, rows or 0)
    problem = ""
    if committed and rows is None:
        problem = f"{out / 'runs.csv'} is missing or damaged but this secure grid committed {committed} run(s) ({path})"
    elif rows is not None and rows < committed:
        problem = f"{out / 'runs.csv'} holds {rows} of the {committed} runs this secure grid committed ({path})"
    elif draw_problem := spec.plan.accounting().unreleased_draw(out, committed):
        problem = draw_problem
    elif not committed and any((out / name).exists() for name in ("selection.json", "model")):
        problem = f"{out} holds released files (selection.json or model/) but no committed run"
    if not problem:
        if recorded is None and rows:  # a lost ledger: the rows are what was committed
            write_json(path, {"committed": rows})
        return
    start_over(out, spec, problem)


def start_over(out: Path, spec, problem: str) -> None:
    """Refuse the damaged release `problem` describes, or with overwrite=true delete it and say that the next one
    spends epsilon again."""
    if not spec.overwrite:
        raise Lost(f"{problem}; training its runs again would be {NEW_RELEASE}: restore the file, or pass "
                   "overwrite=true to start a new release")
    warnings.warn(f"overwrite=true: {problem}; the release's files are deleted and its runs trained anew: "
                  f"{NEW_RELEASE}", stacklevel=3)
    delete_release(out)


def record(out: Path, spec, committed: int) -> None:
    """After a commit: the number of runs this secure grid has committed."""
    if kept(spec):
        write_json(Path(out) / LEDGER, {"committed": committed})


def _readable(path: Path) -> bool:
    try:
        read_json(path, "")
        return True
    except DpgridError:
        return False


def committed_runs(out: Path, spec) -> set:
    """(config_id, seed) of the runs runs.csv holds with their whole curves. A seeded grid trains again a run whose
    curves were lost (the same run); a secure grid refuses, or with overwrite=true starts a new release."""
    def found(repair: bool) -> set:
        return finished_runs(out, spec.plan, spec.train.eval_every, spec.config_hash,
                             {c["config_id"] for c in spec.selected}, repair=repair)
    try:
        return found(repair=not kept(spec))
    except Lost as lost:
        start_over(out, spec, str(lost))
        return found(repair=True)
