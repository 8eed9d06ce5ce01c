"""Fault injection: full disks, blocked folders, damaged files, a second writer, SIGTERM. Each ends in
one line with its exit code, and once the fault is gone the same command ends with the CSVs of an
undisturbed grid (issues: every failure is one line; privacy in every mode, point 9)."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys

import pandas as pd
import pytest

from .command import dpgrid as run_dpgrid, start_paused

pytestmark = pytest.mark.slow  # every test here trains grids, several times over
GRID = ["strategy=fixed_threshold", "grid.k=2", "train.seeds=2", "train.epochs=1", "train.eval_every=4"]


def dpgrid(*args, fail_at=None, error="ENOSPC"):
    """`dpgrid *args`, its `fail_at`-th fsync failing with `error`: fsync is called once by every file dpgrid
    writes (config.yaml, plan.json, then per run curves and runs, then summary.csv)."""
    calls, real = [0], os.fsync

    def fsync(fd):
        calls[0] += 1
        if calls[0] == fail_at:
            raise OSError(getattr(errno, error), os.strerror(getattr(errno, error)))
        return real(fd)

    os.fsync = fsync
    try:
        return run_dpgrid(*args)
    finally:
        os.fsync = real


def progress(line: str) -> bool:
    return (": run " in line or line.startswith(("plan: ", "per-sample engine: ", "train.parallel_runs",
                                                 "nothing to train:"))) \
        and not line.startswith("dpgrid:")


def errors(r) -> list:
    return [line for line in r.stderr.strip().splitlines() if not line.startswith("dpgrid: warning:") and not progress(line)]


def warnings_of(r) -> list:
    return [line for line in r.stderr.strip().splitlines() if line.startswith("dpgrid: warning:")]


def results(out):
    runs = pd.read_csv(out / "runs.csv").drop(columns=["seconds", "eval_seconds"]).sort_values(["config_id", "seed"])
    curves = pd.read_csv(out / "curves.csv").sort_values(["config_id", "seed", "step"])
    return runs.reset_index(drop=True), curves.reset_index(drop=True), pd.read_csv(out / "summary.csv")


@pytest.fixture(scope="module")
def reference_grid(tmp_path_factory):
    """The undisturbed grid, trained once; tests that damage a finished grid damage a copy of it."""
    out = tmp_path_factory.mktemp("reference") / "grid"
    assert dpgrid("run", *GRID, f"hydra.run.dir={out}").returncode == 0
    return out


@pytest.fixture(scope="module")
def reference(reference_grid):
    return results(reference_grid)


def assert_same(out, reference):
    for got, expected in zip(results(out), reference):
        pd.testing.assert_frame_equal(got, expected)


@pytest.mark.parametrize("fail_at", [1, 2, 3, 6, 7, 10])
def test_a_full_disk_at_any_write_is_one_line_and_the_same_command_resumes(fail_at, tmp_path, reference):
    """The first writes are the grid's header (.hydra/, config.yaml, plan.json), then its entry in the study's ledger
    (the ledger's folder is named then), then each run's curves and commit, then summary.csv."""
    import os

    out = tmp_path / "grid"
    r = dpgrid("run", *GRID, f"hydra.run.dir={out}", fail_at=fail_at)
    assert r.returncode == 1 and len(errors(r)) == 1, r.stderr
    assert "no space left on the device" in r.stderr
    assert str(out) in r.stderr or os.environ["DPGRID_LEDGER"] in r.stderr, r.stderr
    for name in ("config.yaml", "plan.json", "runs.csv", "summary.csv"):
        assert not (out / name).exists() or (out / name).stat().st_size > 0, f"{name} left empty"
    assert not list(out.glob(".*.tmp"))
    again = dpgrid("run", *GRID, f"hydra.run.dir={out}")
    assert again.returncode == 0, again.stderr
    assert_same(out, reference)


def test_blocked_run_directories_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for run_dir, message in ((afile, "is a file, not a folder"), (afile / "below", "is a file, not a folder")):
        r = dpgrid("run", *GRID, f"hydra.run.dir={run_dir}")
        assert r.returncode == 1 and len(errors(r)) == 1 and message in r.stderr, r.stderr
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: simulate the read-only folder where the check looks
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **k: False if str(p).startswith(str(readonly))
                            else real(p, m, **k))
    r = dpgrid("run", *GRID, f"hydra.run.dir={readonly / 'grid'}")
    assert r.returncode == 1 and len(errors(r)) == 1 and "is not writable" in r.stderr, r.stderr
    assert list(readonly.iterdir()) == []


def run_then(finished, tmp_path, damage):
    """A copy of the finished grid, damaged, then the same command run on it again."""
    out = tmp_path / "grid"
    shutil.copytree(finished, out)
    damage(out)
    return out, dpgrid("run", *GRID, f"hydra.run.dir={out}")


def garbage(path):
    """Random bytes over the middle of the file (invalid UTF-8, a NUL, no line structure)."""
    data = path.read_bytes()
    middle = len(data) // 2
    path.write_bytes(data[:middle] + bytes([0xFF, 0x00, 0xFE]) * 20 + data[middle + 60:])


def torn_header(path):
    """A CSV's first line cut half-way and run into the second; a JSON object cut half-way (a torn write)."""
    text = path.read_text()
    if path.suffix == ".json":
        return path.write_text(text[: len(text) // 2])
    lines = text.splitlines(keepends=True)
    path.write_text(lines[0][: len(lines[0]) // 2] + "".join(lines[1:]))


DAMAGE = {"empty": lambda path: path.write_text(""), "garbage bytes": garbage, "torn header": torn_header}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("name", ["runs.csv", "curves.csv", "plan.json", "summary.csv"])
def test_a_damaged_result_file_is_repaired_by_the_same_command(name, damage, tmp_path, reference_grid, reference):
    out, r = run_then(reference_grid, tmp_path, lambda out: DAMAGE[damage](out / name))
    assert r.returncode == 0, r.stderr
    if name != "summary.csv":  # rewritten at every end anyway
        assert len(warnings_of(r)) == 1 and name in warnings_of(r)[0] and not errors(r)  # one warning naming the file
    assert_same(out, reference)
    assert json.loads((out / "plan.json").read_text())["config_hash"]


def cell(lines, index, column, value) -> str:
    """lines[index] with `column` set to `value`."""
    fields = lines[index].split(",")
    fields[lines[0].split(",").index(column)] = value
    return ",".join(fields)


def joined(lines):
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("edit, message", [
    (lambda lines: joined(lines + [lines[-1]]), "lines 9 and 10: configuration lr1_clip1 seed 1 twice"),
    (lambda lines: joined(lines[:-1] + [",".join(lines[-1].split(",")[:15])]), "line 9: 15 fields where the header has "),
    (lambda lines: joined(lines)[:-3], "line 9: the last line is not terminated"),  # cut mid-number
    (lambda lines: joined(lines[:2] + [cell(lines, 2, "diverged", "abc")] + lines[3:]), "line 3: diverged = 'abc'"),
    (lambda lines: joined(lines[:2] + [cell(lines, 2, "seed", "x")] + lines[3:]), "line 3: seed = 'x'"),
    (lambda lines: joined(lines[:2] + [cell(lines, 2, "best_value", "abc")] + lines[3:]), "line 3: best_value = 'abc'"),
    (lambda lines: joined(lines[:2] + [cell(lines, 2, "best_value", "inf")] + lines[3:]), "line 3: best_value = 'inf'"),
    (lambda lines: joined(lines[:2] + [cell(lines, 2, "config_hash", "0123456789abcdef")] + lines[3:]),
     "line 3: config_hash 0123456789abcdef is not this grid's"),  # a row of another config, pasted in
])
def test_a_damaged_runs_csv_is_refused_naming_the_file_and_line(edit, message, tmp_path, reference_grid):
    def damage(out):
        lines = (out / "runs.csv").read_text().splitlines()
        (out / "runs.csv").write_text(edit(lines))
    out, r = run_then(reference_grid, tmp_path, damage)
    assert r.returncode == 2 and len(errors(r)) == 1, r.stderr
    assert f"{out / 'runs.csv'}" in r.stderr and message in r.stderr, r.stderr


def test_a_plan_that_disagrees_with_its_runs_is_refused_with_both_values(tmp_path, reference_grid):
    import json

    def damage(out):
        plan = json.loads((out / "plan.json").read_text())
        del plan["config_hash"]
        (out / "plan.json").write_text(json.dumps(plan))
        runs = pd.read_csv(out / "runs.csv")
        runs["noise_multiplier"] = 0.01
        runs.to_csv(out / "runs.csv", index=False)
    out, r = run_then(reference_grid, tmp_path, damage)
    assert r.returncode == 2 and len(errors(r)) == 1, r.stderr
    assert "has no config hash" in r.stderr and "noise_multiplier is 0.01" in r.stderr, r.stderr


def snapshot(folder) -> dict:
    """Every file under folder: its bytes and inode (a file deleted and made again is another file)."""
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_ino) for p in folder.rglob("*") if p.is_file()}


def test_one_writer_per_directory_and_nothing_lost(tmp_path, reference):
    """Three writers into one directory, the second and third while the first trains: they are refused
    and touch nothing; the first ends with the CSVs of an undisturbed grid."""
    out = tmp_path / "grid"
    first, go = start_paused(["run", *GRID, f"hydra.run.dir={out}"], after=2, folder=tmp_path)
    before = snapshot(out)
    assert {".lock", ".hydra/config.yaml", "cli.log", "runs.csv"} <= {str(p) for p in before}
    second = dpgrid("run", *GRID, f"hydra.run.dir={out}")
    third = subprocess.run([sys.executable, "-m", "dpgrid.commands.cli", "run", *GRID, f"hydra.run.dir={out}"],
                           capture_output=True, text=True)
    for refused in (second, third):
        assert refused.returncode == 2 and len(errors(refused)) == 1, refused.stderr
        assert f"another dpgrid process is writing into {out}" in refused.stderr
    assert snapshot(out) == before
    go.touch()
    assert first.wait(timeout=600) == 0, first.stderr.read()
    runs = pd.read_csv(out / "runs.csv")
    assert not runs.duplicated(["config_id", "seed"]).any()
    assert_same(out, reference)


def test_a_sweep_whose_jobs_share_a_directory_is_refused_before_any_job(tmp_path):
    r = dpgrid("run", "-m", *GRID, "train.eval_every=4,2", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(errors(r)) == 1, r.stderr
    assert "would both write into" in r.stderr and "train.eval_every=2" in r.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_is_checked_job_by_job_before_any_runs(tmp_path):
    r = dpgrid("run", "-m", *GRID, "privacy.epsilon=3,-1", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(errors(r)) == 1, r.stderr
    assert "sweep job" in r.stderr and "privacy.epsilon=-1" in r.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_are_one_line_and_the_same_command_resumes(sig, code, tmp_path, reference):
    out = tmp_path / "grid"
    proc, _ = start_paused(["run", *GRID, f"hydra.run.dir={out}"], after=1, folder=tmp_path)  # mid-grid, by design
    proc.send_signal(sig)
    stderr = proc.stderr.read()
    lines = [line for line in stderr.strip().splitlines() if not progress(line)]
    assert proc.wait() == code and len(lines) == 1, stderr
    assert "incomplete; the same command resumes it" in stderr
    assert len(pd.read_csv(out / "runs.csv")) == 1
    assert dpgrid("run", *GRID, f"hydra.run.dir={out}").returncode == 0
    assert_same(out, reference)


def test_a_moved_data_directory_resumes_and_a_changed_file_is_named(tmp_path):
    import numpy as np

    from .test_data import make_idx_root, write_idx

    first, moved = tmp_path / "data", tmp_path / "moved"
    raw = make_idx_root(first)
    out = tmp_path / "grid"
    mnist = ["dataset=mnist", "strategy=nodp", "grid.k=2", "train.seeds=1", "train.epochs=1", "train.batch_size=4",
             f"hydra.run.dir={out}"]
    stated = dpgrid("run", *mnist, f"data.root={first}")  # the config states MNIST's N, the files hold 12 examples
    assert stated.returncode == 2 and "dataset.n_train=60000 but the data under" in stated.stderr \
        and "pass dataset.n_train=12" in stated.stderr and not out.exists(), stated.stderr
    mnist.append("dataset.n_train=null")  # planned for the loaded data's N
    assert dpgrid("run", *mnist, f"data.root={first}").returncode == 0
    before = (out / "runs.csv").read_text()
    first.rename(moved)
    r = dpgrid("run", *mnist, f"data.root={moved}")
    assert r.returncode == 0, r.stderr
    assert (out / "runs.csv").read_text() == before  # resumed: nothing trained again
    write_idx(moved / raw.relative_to(first) / "train-labels-idx1-ubyte.gz", np.zeros(12), 2049)
    r = dpgrid("run", *mnist, f"data.root={moved}")
    assert r.returncode == 2 and len(errors(r)) == 1, r.stderr
    assert "was run on other data: MNIST/raw/train-labels-idx1-ubyte.gz" in r.stderr


# moments of start-up, each reached by design: composing the config; inside torch's own import (its modules half
# initialised: whatever breaks after the signal is still the signal); Hydra's job machinery; the accountant; the
# data's loader, once Hydra has made the run directory (which is removed again)
START_UP = {"the command line's import": "dpgrid.commands.cli", "compose": -1, "inside torch's import": "torch.nn",
            "Hydra's job": "hydra.core.utils", "the accountant": "opacus", "the data's loader": "sklearn.datasets"}


@pytest.mark.parametrize("moment", START_UP)
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_at_start_up_is_one_line(sig, code, moment, tmp_path):
    out = tmp_path / "grid"
    proc, _ = start_paused(["run", *GRID, f"hydra.run.dir={out}"], after=START_UP[moment], folder=tmp_path)
    proc.send_signal(sig)
    stderr = proc.stderr.read()
    assert proc.wait() == code and stderr.count("\n") == 1, stderr
    assert any(words in stderr for words in ("stopped before it finished", "incomplete; the same command resumes it",
                                             "stopped as it started")), stderr
    assert not out.exists() and not any(tmp_path.glob("**/grid"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_after_the_results_changes_nothing(sig, tmp_path):
    """A grid that has said "results:" has finished: a signal as it exits leaves it finished, exit 0."""
    out = tmp_path / "grid"
    proc, go = start_paused(["run", *GRID, f"hydra.run.dir={out}"], after="finished", folder=tmp_path)
    proc.send_signal(sig)
    go.touch()
    stderr = proc.stderr.read()
    assert proc.wait() == 0 and "error" not in stderr, stderr
    assert (out / "summary.csv").exists()


def test_exhausted_inodes_are_a_full_disk(tmp_path, monkeypatch):
    real = os.statvfs

    def statvfs(path):
        found = real(path)
        return os.statvfs_result((*found[:6], 3, 3, *found[8:]))  # f_files kept, f_ffree = f_favail = 3

    monkeypatch.setattr(os, "statvfs", statvfs)
    r = dpgrid("run", *GRID, f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 1 and len(errors(r)) == 1 and "free inodes" in r.stderr, r.stderr
    assert not (tmp_path / "grid").exists()


@pytest.mark.parametrize("make, message", [
    (lambda out: (out / ".hydra").write_text("x"), ".hydra: dpgrid needs a folder there"),
    (lambda out: (out / "cli.log").mkdir(), "cli.log: dpgrid needs a file there"),
    (lambda out: (out / "runs.csv").mkdir(), "runs.csv: dpgrid needs a file there"),
])
def test_a_run_directory_with_entries_of_the_wrong_kind_is_one_line(make, message, tmp_path):
    out = tmp_path / "grid"
    out.mkdir()
    make(out)
    r = dpgrid("run", *GRID, f"hydra.run.dir={out}")
    assert r.returncode == 1 and len(errors(r)) == 1 and message in r.stderr, r.stderr


def test_a_path_component_too_long_is_one_line(tmp_path):
    r = dpgrid("run", *GRID, f"hydra.run.dir={tmp_path / ('x' * 300) / 'grid'}")
    assert r.returncode == 1 and len(errors(r)) == 1 and "a name in the path is too long" in r.stderr, r.stderr


@pytest.mark.parametrize("damage", ["empty", "missing"])
def test_tables_without_curves_are_written_and_say_which_figure_is_missing(damage, tmp_path):
    out = tmp_path / "outputs" / "grid"
    assert dpgrid("run", *GRID, f"hydra.run.dir={out}").returncode == 0
    (out / "curves.csv").write_text("") if damage == "empty" else (out / "curves.csv").unlink()
    r = dpgrid("tables", tmp_path / "outputs")
    assert r.returncode == 0 and len(warnings_of(r)) == 1 and "its learning-curve figure is not drawn" in r.stderr, r.stderr
    assert (tmp_path / "outputs" / "tables" / "results.csv").exists()
