"""A release happens once: a secure grid or selection whose committed runs, draw or released files are damaged or
gone is never trained or drawn again silently. The same command refuses in one line, naming what is missing and
that overwrite=true starts a new release, which spends epsilon again (and says so when it does). A seeded grid's
runs trained again are the same runs: it still repairs by retraining (tests/test_faults.py)."""

import json
import shutil

import pandas as pd
import pytest

from .command import dpgrid, one_line

pytestmark = pytest.mark.slow  # trains secure grids end to end, several times over

SELECTION = ["strategy=fixed_threshold", "grid.k=2", "train.epochs=1", "train.seeds=2", "train.eval_every=4",
             "privacy.selection=random_stopping", "privacy.stopping_mean=3", "privacy.secure_rng=true",
             "hydra.run.dir=sel"]
GRID = ["strategy=fixed_threshold", "grid.k=2", "train.epochs=1", "train.seeds=2", "train.eval_every=4",
        "privacy.secure_rng=true", "hydra.run.dir=grid"]


def snapshot(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def blank(path):
    path.write_text("")


def drop_last_row(path):
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))


def drop_curves_of_first_run(path):
    lines = path.read_text().splitlines(keepends=True)
    first = lines[1].split(",")[:2]
    path.write_text("".join([lines[0]] + [line for line in lines[1:] if line.split(",")[:2] != first]))


SELECTION_DAMAGE = {  # each as an adversary did it, with what the refusal names
    "candidates.json deleted and runs.csv emptied": (lambda out: ((out / "candidates.json").unlink(), blank(out / "runs.csv")),
                                                      "runs.csv is missing or damaged"),
    "runs.csv emptied": (lambda out: blank(out / "runs.csv"), "runs.csv is missing or damaged"),
    "runs.csv deleted": (lambda out: (out / "runs.csv").unlink(), "runs.csv is missing or damaged"),
    "candidates.json, runs.csv and curves.csv deleted": (
        lambda out: [(out / name).unlink() for name in ("candidates.json", "runs.csv", "curves.csv")],
        "runs.csv is missing or damaged"),
    "a row deleted": (lambda out: drop_last_row(out / "runs.csv"), "holds 1 of the 2 runs"),  # one candidate drawn
    "candidates.json deleted": (lambda out: (out / "candidates.json").unlink(), "candidates.json is missing"),
    "a run's curves deleted": (lambda out: drop_curves_of_first_run(out / "curves.csv"), "lost the curves of 1"),
}


@pytest.fixture(scope="module")
def secure_selection(tmp_path_factory):
    """A finished secure selection of exactly one candidate (its draw fixed by choosing where it is run again)."""
    folder = tmp_path_factory.mktemp("selection")
    for attempt in range(40):  # secure: K is drawn from the OS; keep a selection that drew one candidate
        r = dpgrid("run", *SELECTION, "overwrite=true", cwd=folder)
        assert r.returncode == 0, r.stderr
        if len(json.loads((folder / "sel" / "candidates.json").read_text())["candidates"]) == 1:
            return folder
        for path in (folder / "sel").iterdir():
            if path.is_file() and path.name in ("runs.csv", "candidates.json"):
                path.unlink()
    pytest.fail("no secure selection of one candidate in 40 draws")


@pytest.mark.parametrize("damage", SELECTION_DAMAGE)
def test_a_damaged_secure_selection_is_refused_not_drawn_again(damage, secure_selection, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(secure_selection, folder)
    act, message = SELECTION_DAMAGE[damage]
    act(folder / "sel")
    before = snapshot(folder / "sel")
    r = dpgrid("run", *SELECTION, cwd=folder)
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert message in r.stderr and "spends a new (epsilon, delta)" in r.stderr and "overwrite=true" in r.stderr
    after = snapshot(folder / "sel")
    assert {k: v for k, v in after.items() if k.parts[0] != ".hydra"} == \
        {k: v for k, v in before.items() if k.parts[0] != ".hydra"}  # nothing trained, drawn or rewritten


def test_overwrite_starts_a_new_secure_release_and_says_it_spends_epsilon_again(secure_selection, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(secure_selection, folder)
    (folder / "sel" / "runs.csv").unlink()
    r = dpgrid("run", *SELECTION, "overwrite=true", cwd=folder)
    assert r.returncode == 0, r.stderr
    assert "a new release on the same data, which spends a new (epsilon, delta)" in r.stderr
    assert (folder / "sel" / "selection.json").exists() and (folder / "sel" / "model" / "model.json").exists()
    ledger = json.loads((folder / "sel" / "ledger.json").read_text())
    assert ledger["committed"] == len(pd.read_csv(folder / "sel" / "runs.csv"))


@pytest.mark.parametrize("damage, message", [
    (lambda out: blank(out / "runs.csv"), "runs.csv is missing or damaged but this secure grid committed 8 run(s)"),
    (lambda out: (out / "runs.csv").unlink(), "runs.csv is missing or damaged"),
    (lambda out: drop_last_row(out / "runs.csv"), "holds 7 of the 8 runs this secure grid committed"),
    (lambda out: drop_curves_of_first_run(out / "curves.csv"), "lost the curves of 1 committed run(s) of this secure grid"),
    (lambda out: [(out / name).unlink() for name in ("runs.csv", "curves.csv")], "runs.csv is missing or damaged"),
], ids=["runs.csv emptied", "runs.csv deleted", "a row deleted", "a run's curves deleted", "runs and curves deleted"])
def test_a_damaged_secure_grid_is_refused_not_trained_again(damage, message, tmp_path):
    assert dpgrid("run", *GRID, cwd=tmp_path).returncode == 0
    out = tmp_path / "grid"
    damage(out)
    before = snapshot(out)
    r = dpgrid("run", *GRID, cwd=tmp_path)
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr
    assert {k: v for k, v in snapshot(out).items() if k.parts[0] != ".hydra"} == \
        {k: v for k, v in before.items() if k.parts[0] != ".hydra"}
    r = dpgrid("run", *GRID, "overwrite=true", cwd=tmp_path)
    assert r.returncode == 0 and "spends a new (epsilon, delta)" in r.stderr, r.stderr
    assert len(pd.read_csv(out / "runs.csv")) == 8


def test_a_killed_secure_grid_resumes_what_it_did_not_commit(tmp_path):
    """Nothing lost: the runs not committed are trained (they released nothing), the committed ones kept."""
    from .command import start_paused

    import signal

    args = [*GRID[:-1], f"hydra.run.dir={tmp_path / 'grid'}"]
    proc, go = start_paused(["run", *args], after=3, folder=tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    committed = pd.read_csv(tmp_path / "grid" / "runs.csv")
    r = dpgrid("run", *args)
    assert r.returncode == 0, r.stderr
    runs = pd.read_csv(tmp_path / "grid" / "runs.csv")
    assert len(runs) == 8 and runs.iloc[:3].best_value.tolist() == committed.best_value.tolist()


def keep_lines(path, count):
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:count]))


LEDGER_DAMAGE = {  # as an adversary tried it, with what the refusal names
    "ledger deleted, rows cut": (lambda out: ((out / "ledger.json").unlink(), keep_lines(out / "runs.csv", 2)),
                                 "ledger.json is missing but"),
    "an earlier ledger replayed, rows cut": (
        lambda out: ((out / "ledger.json").write_text(json.dumps({**json.loads((out / "ledger.json").read_text()),
                                                                  "committed": 1, "released": False})),
                     keep_lines(out / "runs.csv", 2)), "records no release"),
    "garbage ledger": (lambda out: (out / "ledger.json").write_text("garbage"), "ledger.json is damaged"),
    "a count that is no count": (lambda out: (out / "ledger.json").write_text('{"committed": "abc"}'),
                                 "committed = 'abc', not a count of runs"),
    "everything but plan.json and config.yaml": (
        lambda out: [shutil.rmtree(p) if p.is_dir() else p.unlink() for p in out.iterdir()
                     if p.name not in ("plan.json", "config.yaml", ".lock", ".hydra")], "ledger.json is missing but"),
}

@pytest.mark.parametrize("damage", LEDGER_DAMAGE)
def test_a_secure_release_cannot_be_repeated_by_editing_private_files(damage, secure_selection, tmp_path):
    """Whatever is done to ledger.json, runs.csv and the draw, a finished secure selection trains and draws nothing
    again: refused in one line, touching nothing (a damaged ledger is never rewritten)."""
    folder = tmp_path / "copy"
    shutil.copytree(secure_selection, folder)
    act, message = LEDGER_DAMAGE[damage]
    act(folder / "sel")
    before = snapshot(folder / "sel")
    r = dpgrid("run", *SELECTION, cwd=folder)
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr and "overwrite=true" in r.stderr, r.stderr
    assert {k: v for k, v in snapshot(folder / "sel").items() if k.parts[0] != ".hydra"} == \
        {k: v for k, v in before.items() if k.parts[0] != ".hydra"}


def test_an_edited_draw_of_a_secure_selection_is_refused(secure_selection, tmp_path):
    """candidates.json is checked against the checksum its ledger recorded when it was drawn: a draw with a candidate
    added (which no row contradicts) would train a new candidate after the release."""
    folder = tmp_path / "copy"
    shutil.copytree(secure_selection, folder)
    drawn = folder / "sel" / "candidates.json"
    recorded = json.loads(drawn.read_text())
    drawn.write_text(json.dumps({**recorded, "candidates": recorded["candidates"] * 2}))
    r = dpgrid("run", *SELECTION, cwd=folder)
    assert r.returncode == 2 and one_line(r.stderr) and "is not the draw this secure grid recorded" in r.stderr, r.stderr


def test_a_secure_grid_whose_release_was_replayed_is_refused(tmp_path):
    """A secure composition grid: an earlier ledger with its rows cut to match would retrain and publish a new
    mean; the release it made (model/) says it ended."""
    assert dpgrid("run", *GRID, cwd=tmp_path).returncode == 0
    out = tmp_path / "grid"
    (out / "ledger.json").write_text(json.dumps({"committed": 6, "files": {}, "released": False}))
    keep_lines(out / "runs.csv", 7)
    r = dpgrid("run", *GRID, cwd=tmp_path)
    assert r.returncode == 2 and one_line(r.stderr) and "records no release" in r.stderr, r.stderr
