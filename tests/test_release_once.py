"""A release happens once and publishes only what dpgrid computed: no file of a run directory makes dpgrid run code,
release again or print an edited number (the adversary's edits, each ending in one line)."""

import json
import os
import sys

import pandas as pd
import pytest

import dpgrid
from dpgrid import DpgridError
from dpgrid.results.seal import seal

from .command import dpgrid as run_dpgrid, one_line
from .conftest import trained_grid
from .test_report import make_grid, write

SECURE = ["privacy.secure_rng=true", "privacy.selection=random_stopping", "train.save_models=all", "grid.k=3",
          "train.epochs=1", "train.seeds=1", "train.eval_every=4", "privacy.selection.stopping_mean=4"]


@pytest.mark.slow  # trains a secure selection, then runs its command twice more
def test_a_secure_selection_releases_once_whatever_its_rows_say(tmp_path):
    """The issue's attack: a best_value edited (and digests.json rewritten to match, as a careful adversary would)
    before the same command: the grid re-presents the release its ledger recorded, never another candidate."""
    out = tmp_path / "sel"
    args = [*SECURE, f"hydra.run.dir={out}"]
    assert run_dpgrid("run", *args).returncode == 0
    released = {p.relative_to(out): p.read_bytes() for p in [out / "selection.json", *(out / "model").iterdir()]}
    runs = pd.read_csv(out / "runs.csv", dtype={"config_id": str})
    chosen = json.loads((out / "selection.json").read_text())["chosen"]["config_id"]
    runs.loc[runs.config_id != chosen, "best_value"] = 99.9  # every other candidate made the best
    runs.loc[runs.config_id == chosen, "best_value"] = 0.1
    runs.to_csv(out / "runs.csv", index=False)
    seal(out)
    r = run_dpgrid("run", *args)
    assert r.returncode == 0 and "as this secure grid released it (it releases once)" in r.stdout + r.stderr, r.stderr
    assert {p.relative_to(out): p.read_bytes() for p in [out / "selection.json", *(out / "model").iterdir()]} == released
    (out / "selection.json").write_text(json.dumps({"chosen": None}))  # the release itself edited: refused
    r = run_dpgrid("run", *args)
    assert r.returncode == 2 and one_line(r.stderr) and "is not what this secure grid released" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_secure_grid_whose_record_is_gone_is_refused(tmp_path):
    """Ledger, draws, rows, model/ and plan.json deleted; config.yaml, cli.log and .hydra/ left: refused, not trained
    again (a second release)."""
    out = tmp_path / "sel"
    args = [*SECURE, f"hydra.run.dir={out}"]
    assert run_dpgrid("run", *args).returncode == 0
    for name in os.listdir(out):
        if name not in ("config.yaml", "cli.log", ".hydra", ".lock"):
            path = out / name
            __import__("shutil").rmtree(path) if path.is_dir() else path.unlink()
    r = run_dpgrid("run", *args)
    assert r.returncode == 2 and one_line(r.stderr) and "ledger.json is missing" in r.stderr, r.stderr
    assert "config.yaml, cli.log, .hydra" in r.stderr and not (out / "runs.csv").exists()


def test_an_edited_row_is_refused_by_the_grids_own_command(tmp_path):
    """A seeded grid's sealed runs.csv edited: the rerun refuses in one line naming it (it would name the edited
    configuration as best while model/ holds another); with digests.json gone it trains the runs again (the same
    numbers) rather than vouch for them."""
    spec, out = trained_grid(tmp_path / "grid", **{"grid.k": 2, "train.seeds": 1, "train.epochs": 1})
    from dpgrid.runner import train

    before = pd.read_csv(out / "runs.csv")
    text = (out / "runs.csv").read_text()
    value = f"{before.best_value.iloc[0]}"
    (out / "runs.csv").write_text(text.replace(value, "99.5", 1))
    with pytest.raises(DpgridError, match=r"runs.csv holds lines its grid did not write.*overwrite=true") as refused:
        train(spec, out, progress=False)
    assert "\n" not in str(refused.value)
    (out / "digests.json").unlink()
    with pytest.warns(UserWarning, match="trained again"):
        train(spec, out, progress=False)
    after = pd.read_csv(out / "runs.csv")
    assert sorted(after.best_value) == pytest.approx(sorted(before.best_value)) and 99.5 not in list(after.best_value)


def test_a_row_added_by_hand_is_refused_and_a_stopped_commit_is_finished(tmp_path):
    """Rows after the sealed ones: what a commit left that a kill stopped before its seal (digests.json records it as
    pending) is taken; a row added by hand is refused."""
    from dpgrid.results.runs import commit_run

    spec, out = trained_grid(tmp_path / "grid", **{"grid.k": 2, "train.seeds": 1, "train.epochs": 1})
    from dpgrid.runner import train

    row = pd.read_csv(out / "runs.csv", dtype=str, keep_default_na=False).iloc[-1].to_dict()
    saved = (out / "runs.csv").read_bytes()
    (out / "runs.csv").write_text(saved.decode() + ",".join({**row, "seed": "5"}.values()) + "\n")  # a run never trained
    with pytest.raises(DpgridError, match="runs.csv holds lines its grid did not write"):
        train(spec, out, progress=False)
    (out / "runs.csv").write_bytes(saved)
    commit_run(out / "runs.csv", dict(row))  # a commit whose seal a kill prevented: pending in digests.json
    assert json.loads((out / "digests.json").read_text())["pending"]
    from dpgrid.results.seal import problem

    assert problem(out, whole=False) == ("", "") and "did not seal" in problem(out, whole=True)[0]


class Evil:
    pass


def test_tables_import_no_module_a_plan_names(tmp_path, monkeypatch):
    """plan.json naming a module as its accounting method: tables read it as text, never import it (here a module that
    would write a file on import, and the standard library's `this`, which prints on import)."""
    package = tmp_path / "pkg"
    package.mkdir()
    pwned = tmp_path / "pwned"
    (package / "evilmod.py").write_text(f"open({str(pwned)!r}, 'w').write('ran')\nclass Evil: pass\n")
    monkeypatch.syspath_prepend(str(package))
    root = tmp_path / "outputs"
    for module, folder in (("evilmod.Evil", "a"), ("this.X", "b")):
        grid = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.16, 92.22], 0)],
                         folder=root / folder)
        plan = json.loads((grid / "plan.json").read_text())
        (grid / "plan.json").write_text(json.dumps({**plan, "selection": "mine", "method": module}))
    monkeypatch.delitem(sys.modules, "this", raising=False)
    write(root)
    assert not pwned.exists() and "evilmod" not in sys.modules and "this" not in sys.modules


def test_the_audit_deletes_only_what_it_wrote(tmp_path):
    """hydra.run.dir naming a tree that holds a real grid in a folder called grid/ beside others: refused, overwrite or
    not, and nothing deleted; an audit is recognised by its marker, not by a folder's name."""
    tree = tmp_path / "tree"
    trained_grid(tree / "grid", **{"grid.k": 2, "train.seeds": 1, "train.epochs": 1})
    (tree / "notes.txt").write_text("mine")
    before = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
    for overwrite in ("false", "true"):
        r = run_dpgrid("audit", "strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=1",
                       "--canaries", "50", f"hydra.run.dir={tree}", f"overwrite={overwrite}")
        assert r.returncode == 2 and one_line(r.stderr) and "not an audit's" in r.stderr, r.stderr
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*")) == before


@pytest.mark.parametrize("args, message", [
    (["strategy=nodp"], "strategy=nodp is non-private"),
    (["--canaries", "1000000000"], "at most"),
])
def test_an_audit_that_cannot_run_is_one_line(tmp_path, args, message):
    r = run_dpgrid("audit", "grid.k=2", "train.seeds=1", "train.epochs=1", *args, f"hydra.run.dir={tmp_path / 'a'}")
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()


@pytest.mark.slow  # two audits of a small grid
def test_an_audit_stopped_before_it_ended_is_resumed_by_the_same_command(tmp_path):
    """What the SIGINT line says is true: the same command goes on with the stopped audit's own seed (its marker)."""
    out = tmp_path / "a"
    args = ["audit", "strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=1", "--canaries", "50",
            f"hydra.run.dir={out}"]
    assert run_dpgrid(*args).returncode == 0
    seed = json.loads((out / "audit.json").read_text())["seed"]
    (out / "audit.json").unlink()  # as a stop before its end leaves it
    r = run_dpgrid(*args)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "audit.json").read_text())["seed"] == seed


def resealed_model(out, change):
    from dpgrid.results.statement import sealed

    record = json.loads((out / "model" / "model.json").read_text())
    change(record)
    (out / "model" / "model.json").write_text(json.dumps(sealed(record)))


@pytest.mark.parametrize("change, message", [
    (lambda r: r["model"].update(depth=3), "takes no argument 'depth'"),
    (lambda r: r.update(model={"_target_": "dpgrid.models.image_mlp", "hidden": 10 ** 12}),
     "does not have the released weights' shapes"),
])
def test_a_resealed_statement_that_would_crash_is_one_line(tmp_path, change, message):
    _, out = trained_grid(tmp_path / "grid", **{"grid.k": 2, "train.seeds": 1, "train.epochs": 1})
    resealed_model(out, change)
    with pytest.raises(DpgridError, match=message) as refused:
        dpgrid.load_model(out)
    assert "\n" not in str(refused.value)


def test_a_weak_stopping_rule_leaks_no_numpy_warning():
    r = run_dpgrid("plan", "privacy.selection=random_stopping", "privacy.selection.stopping_eta=-0.997", "grid.k=2")
    assert "divide by zero" not in r.stderr and "RuntimeWarning" not in r.stderr, r.stderr


def test_a_checksum_is_read_afresh_when_the_bytes_changed_under_the_same_size_and_mtime(tmp_path):
    from dpgrid.data import fingerprint

    path = tmp_path / "init.safetensors"
    path.write_bytes(b"a" * 64)
    first = fingerprint({"init": path})["init"]["sha256"]
    stat = path.stat()
    path.write_bytes(b"b" * 64)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # touch -r: size and mtime as they were
    assert fingerprint({"init": path})["init"]["sha256"] != first
