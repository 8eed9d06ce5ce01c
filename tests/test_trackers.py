"""tracker=mlflow and tracker=tensorboard against the real libraries: what a grid logs is read back (MLflow's sqlite
store through MlflowClient, TensorBoard's event files through its own reader), every key and value checked against
what dpgrid publishes, and the runs' structure, ends and resumes under kills, sweeps and parallel workers."""

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from .command import dpgrid, one_line, start_paused
from .conftest import load_cfg

GRID = {"grid.k": 2, "train.seeds": 2, "train.epochs": 1, "train.eval_every": 4}
ARGS = ["strategy=fixed_threshold", *(f"{k}={v}" for k, v in GRID.items())]

# Every key a tracker may write, by what it is (dpgrid.tracking.published): anything else fails the rule test.
PLAN_KEYS = {"dataset", "strategy", "k", "n_configs", "n_train", "batch_size", "epochs", "steps", "sample_rate",
             "epsilon", "delta", "seeds", "account_seeds", "composed_runs", "noise_multiplier", "budget", "sampling",
             "accountant", "epsilon_spent", "epsilon_grid", "epsilon_per_run", "epsilon_with_seeds", "selection",
             "selection_accountant", "private", "model_parameters"}
CONFIG_KEYS = {"model", "protocol", "eval_every", "momentum", "secure_rng", "config_hash", "axes"}
RUN_PARAMS = {"config_id", "lr", "clip", "seed"}
CURVE_METRICS = {"test_accuracy", "test_loss", "clip", "lr"}               # curves.csv's, per step
RUN_METRICS = {"best_test_accuracy": "best_value", "best_step": "best_step", "steps": "steps", "seconds": "seconds",
               "eval_seconds": "eval_seconds"}                            # runs.csv's
TAG_KEYS = {"mlflow.runName", "mlflow.parentRunId", "dpgrid.kind", "dpgrid.folder", "dpgrid.config_hash",
            "dpgrid.covers", "dpgrid.metric", "dpgrid.host", "dpgrid.process", "dpgrid.best_config",
            "dpgrid.release.covers", "dpgrid.release.model", "dpgrid.config_id", "dpgrid.seed", "dpgrid.diverged",
            "dpgrid.overrides", "dpgrid.audit.mechanism"}


def tracked(tmp_path, tracker, *extra, strategy="fixed_threshold", dataset="digits", **overrides):
    """(spec, run directory, outputs' root): a small grid trained with `tracker`, logged in this process."""
    from dpgrid.config import compile
    from dpgrid.runner import train
    from dpgrid.tracking import Place

    cfg = load_cfg(dataset, strategy, tracker=tracker, **{**GRID, **overrides})
    spec = compile(cfg)
    root = tmp_path / "outputs"
    out = root / dataset / "grid"
    train(spec, out, progress=False, tracked_from=Place(root, inline=True))
    return spec, out, root


def client(root):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def all_runs(root) -> list:
    c = client(root)
    experiment = c.get_experiment_by_name("dpgrid")
    return list(c.search_runs([experiment.experiment_id], max_results=1000))


def kinds(runs) -> dict:
    found = {}
    for run in runs:
        found.setdefault(run.data.tags.get("dpgrid.kind"), []).append(run)
    return found


def steps_of(curves: dict, config_id: str, seed: int) -> list:
    return sorted(step for (config, run_seed, step) in curves if (config, run_seed) == (config_id, seed))


def curves_of(out) -> dict:
    curves = pd.read_csv(out / "curves.csv")
    return {(r.config_id, int(r.seed), int(r.step)): r for r in curves.itertuples()}


# --- what may be logged: the rule, enumerated -----------------------------------------------------------------------

def test_a_tracker_changes_no_grid_identity():
    from dpgrid.config import compile

    hashes = {compile(load_cfg("digits", "online", **extra), plan=False).config_hash
              for extra in ({}, {"tracker": "mlflow"}, {"tracker": "mlflow", "tracker.uri": "http://localhost:1"},
                            {"tracker": "tensorboard", "tracker.dir": "/elsewhere"})}
    assert len(hashes) == 1


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("mlflow", "tensorboard")
                        else real(name, *a))
    for tracker in ("mlflow", "tensorboard"):
        r = dpgrid("plan", f"tracker={tracker}")
        assert r.returncode == 2 and one_line(r.stderr), r.stderr
        assert f'pip install "dpgrid[{tracker}]"' in r.stderr and f"tracker={tracker}" in r.stderr


def test_a_misspelt_tracker_key_is_refused_naming_the_closest():
    r = dpgrid("plan", "tracker=mlflow", "tracker.experimnt=x")
    assert r.returncode == 2 and "did you mean tracker.experiment?" in r.stderr, r.stderr


FILE_DATASET = '''
from pathlib import Path

import numpy as np
import torch
from dpgrid import Data


def digits_file(root=None):
    """scikit-learn's digits read from a file under root: a dataset whose files dpgrid fingerprints."""
    path = Path(root) / "digits.npz"
    found = np.load(path)
    x, y = torch.tensor(found["x"] / 16, dtype=torch.float32), torch.tensor(found["y"], dtype=torch.int64)
    return Data(x[300:], y[300:], x[:300], y[:300], "classification", {"digits.npz": path})
'''


@pytest.fixture
def file_dataset(tmp_path, monkeypatch):
    """(the dataset's overrides, its file's SHA-256 and size): a plugin dataset read from a file."""
    from sklearn.datasets import load_digits

    package = tmp_path / "plugin"
    (package / "filed" / "conf" / "dataset").mkdir(parents=True)
    (package / "filed" / "__init__.py").write_text(FILE_DATASET)
    (package / "filed" / "conf" / "__init__.py").write_text("")
    (package / "filed" / "conf" / "dataset" / "digits_file.yaml").write_text(
        "name: digits_file\ntask: classification\nclasses: 10\nload:\n  _target_: filed.digits_file\n"
        "defaults:\n  - /model@_global_.model: mlp\n")
    monkeypatch.syspath_prepend(str(package))
    data = tmp_path / "data"
    data.mkdir()
    x, y = load_digits(return_X_y=True)
    np.savez(data / "digits.npz", x=x, y=y)
    content = (data / "digits.npz").read_bytes()
    overrides = {"hydra.searchpath": f"[file://{package / 'filed' / 'conf'}]", "data.root": str(data)}
    return overrides, hashlib.sha256(content).hexdigest(), len(content)


@pytest.mark.slow  # MLflow's import and a fresh store: a few seconds
def test_the_rule_on_every_key_and_value_mlflow_logs(tmp_path, file_dataset):
    """Every parameter, metric (each step), tag and artifact byte of every run, each traced to what dpgrid publishes:
    the plan (plan.json), the configuration, the test set's curves (curves.csv), the runs' ends (runs.csv), the
    summary and the release (model.json); never the data files' fingerprint, nor anything of the training data."""
    pytest.importorskip("mlflow")
    overrides, digest, size = file_dataset
    spec, out, root = tracked(tmp_path, "mlflow", dataset="digits_file", **overrides)
    plan, runs = json.loads((out / "plan.json").read_text()), pd.read_csv(out / "runs.csv")
    assert digest in json.dumps(plan)  # the fingerprint is there, in a private file, to be kept out of the tracker
    curves, summary = curves_of(out), pd.read_csv(out / "summary.csv")
    c, found = client(root), kinds(all_runs(root))
    assert set(found) == {"grid", "run"} and len(found["grid"]) == 1 and len(found["run"]) == len(runs)
    grid = found["grid"][0]
    said = []  # every value, as text, for the fingerprint check
    for key, value in grid.data.params.items():
        said.append(value)
        if key in PLAN_KEYS:
            assert value == str(plan[key]), key
        elif key in spec.plan.per_query:
            assert float(value) == pytest.approx(spec.plan.per_query[key]), key
        elif key in CONFIG_KEYS:
            assert value == str({"model": spec.model.target, "protocol": spec.protocol, "axes": "lr,clip",
                                 "eval_every": spec.train.eval_every, "momentum": spec.train.momentum,
                                 "secure_rng": spec.train.secure_rng, "config_hash": spec.config_hash}[key]), key
        elif key.startswith("release."):
            pass  # checked with the statement below
        else:
            raise AssertionError(f"the grid logs a parameter {key!r} that is not published")
    statement = json.loads((out / "model" / "model.json").read_text()) if (out / "model" / "model.json").exists() else None
    best = summary[summary.best].iloc[0]
    for key, value in grid.data.metrics.items():
        history = c.get_metric_history(grid.info.run_id, key)
        said += [str(m.value) for m in history]
        if key in ("best.mean", "best.std"):
            assert value == pytest.approx(best[key.partition(".")[2]]), key
        elif key == "seconds":
            assert 0 < value < 600
        elif key in ("release.epsilon", "release.delta"):
            assert value == pytest.approx(statement["covered_by"][key.partition(".")[2]]), key
        elif key == "release.score":
            assert value == pytest.approx(statement["score"]["value"])
        elif key.startswith("release.test_value.seed"):
            seed = int(key.rpartition("seed")[2])
            assert value == pytest.approx(next(m["test_value"] for m in statement["models"] if m["seed"] == seed))
        else:
            raise AssertionError(f"the grid logs a metric {key!r} that is not published")
    for run in found["run"]:
        config_id, seed = run.data.tags["dpgrid.config_id"], int(run.data.tags["dpgrid.seed"])
        row = runs[(runs.config_id == config_id) & (runs.seed == seed)].iloc[0]
        assert run.data.tags["mlflow.parentRunId"] == grid.info.run_id and run.info.status == "FINISHED"
        for key, value in run.data.params.items():
            said.append(value)
            assert key in RUN_PARAMS, f"a run logs a parameter {key!r} that is not published"
            assert value == str(row[key]) or float(value) == pytest.approx(float(row[key])), key
        for key in run.data.metrics:
            history = c.get_metric_history(run.info.run_id, key)
            said += [str(m.value) for m in history]
            if key in CURVE_METRICS:  # every validation, at its step, as curves.csv holds it (the public test set)
                column = {"test_accuracy": "value"}.get(key, key)
                assert sorted(m.step for m in history) == steps_of(curves, config_id, seed)
                for m in history:
                    assert m.value == pytest.approx(getattr(curves[(config_id, seed, m.step)], column)), (key, m.step)
            elif key in RUN_METRICS:
                assert history[-1].value == pytest.approx(float(row[RUN_METRICS[key]])), key
            else:
                raise AssertionError(f"a run logs a metric {key!r} that is not published")
    for run in [grid, *found["run"]]:
        for key, value in run.data.tags.items():
            assert key in TAG_KEYS, f"a run logs a tag {key!r} that is not published"
            said.append(value)
    artifacts = c.download_artifacts(grid.info.run_id, "", str(tmp_path / "downloaded")) if \
        c.list_artifacts(grid.info.run_id) else None
    blobs = [p.read_bytes() for p in Path(artifacts).rglob("*") if p.is_file()] if artifacts else []
    from dpgrid.tracking.published import release_of

    if release_of(out / "model" / "model.json").folder is None:  # a release that carries the fingerprint: model/ withheld, and said
        assert not blobs and grid.data.tags["dpgrid.release.model"].startswith("model/ not logged")
    else:
        assert blobs, "a release without the data's fingerprint is logged as the model folder"
    text = "\n".join(said)
    assert digest not in text and not any(digest.encode() in blob for blob in blobs)
    assert str(size) not in [value.split(".")[0] for value in said]  # the file's size is no logged number
    assert not any("train" in key and "loss" in key for run in [grid, *found["run"]] for key in run.data.metrics)


def test_the_rule_on_every_tag_tensorboard_writes(tmp_path, file_dataset):
    """TensorBoard's event files, read back with its own reader: every scalar and text of every folder is a published
    figure (the curves at their steps, the runs' ends, the release), and no text holds the data's fingerprint."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides, digest, _ = file_dataset
    spec, out, root = tracked(tmp_path, "tensorboard", dataset="digits_file", **overrides)
    runs, curves = pd.read_csv(out / "runs.csv"), curves_of(out)
    logdir = root / "tensorboard" / "digits_file" / "grid"
    folders = sorted({p.parent for p in logdir.rglob("events.out.tfevents.*")})
    assert len(folders) == 1 + len(runs) and not list(logdir.rglob(".*partial*"))
    texts = []
    for folder in folders:
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        tags = events.Tags()
        for tag in tags["tensors"]:
            texts += [t.tensor_proto.string_val[0].decode() for t in events.Tensors(tag) if t.tensor_proto.string_val]
        if folder == logdir:  # the grid's own: its plan, what it released, its best configuration
            assert {t.partition("/")[0] for t in tags["tensors"]} <= {"plan", "covers", "status", "best_config", "release"}
            assert set(tags["scalars"]) <= {"grid/best.mean", "grid/best.std", "grid/seconds", "release/epsilon",
                                            "release/delta", "release/score"} | {
                f"release/test_value.seed{j}" for j in range(spec.plan.seeds)}
            continue
        config_id, seed = folder.parent.name, int(folder.name[len("seed"):])
        row = runs[(runs.config_id == config_id) & (runs.seed == seed)].iloc[0]
        for tag in tags["scalars"]:
            points = events.Scalars(tag)
            group, _, name = tag.partition("/")
            if group in ("test", "state"):
                column = {"accuracy": "value", "loss": "test_loss"}.get(name, name)
                assert sorted(p.step for p in points) == steps_of(curves, config_id, seed)
                for p in points:
                    assert p.value == pytest.approx(getattr(curves[(config_id, seed, p.step)], column), rel=1e-6), tag
            elif group == "run" and name == "diverged":
                assert points[-1].value == float(bool(row.diverged))
            elif group == "run":
                assert points[-1].value == pytest.approx(float(row[RUN_METRICS[name]]), rel=1e-6), tag
            else:
                raise AssertionError(f"a run's events hold a scalar {tag!r} that is not published")
        hparams = events.PluginTagToContent("hparams")
        assert set(hparams) == {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"}
        from tensorboard.plugins.hparams import plugin_data_pb2

        start = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
        logged = {k: v.string_value or v.number_value for k, v in start.session_start_info.hparams.items()}
        assert set(logged) == RUN_PARAMS and logged["config_id"] == config_id and logged["seed"] == seed
    assert texts and not any(digest in text for text in texts)
    assert any("noise_multiplier" in text for text in texts)  # the privacy plan is there, beside the curves


# --- the structure, read back ----------------------------------------------------------------------------------------

@pytest.mark.slow  # MLflow's import and a fresh store: a few seconds
def test_mlflow_logs_a_grid_run_with_nested_runs_steps_and_its_model(tmp_path):
    pytest.importorskip("mlflow")
    spec, out, root = tracked(tmp_path, "mlflow")
    c, found = client(root), kinds(all_runs(root))
    grid, runs = found["grid"][0], pd.read_csv(out / "runs.csv")
    assert grid.info.status == "FINISHED" and grid.info.run_name == "digits/grid"
    assert grid.data.params["noise_multiplier"] == str(spec.plan.noise_multiplier)
    assert grid.data.tags["dpgrid.folder"] == str(out) and grid.data.tags["dpgrid.config_hash"] == spec.config_hash
    assert sorted((r.data.params["config_id"], r.data.params["seed"]) for r in found["run"]) == \
        sorted((r.config_id, str(r.seed)) for r in runs.itertuples())
    history = c.get_metric_history(found["run"][0].info.run_id, "test_accuracy")
    assert sorted(m.step for m in history) == [4, 8, 12]
    listed = {f.path for f in c.list_artifacts(grid.info.run_id, "model")}
    assert listed == {f"model/{p.name}" for p in (out / "model").iterdir()}
    here = Path(c.download_artifacts(grid.info.run_id, "model/model.json", str(tmp_path / "d")))
    assert here.read_bytes() == (out / "model" / "model.json").read_bytes()
    import dpgrid

    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(out, copy)
    shutil.rmtree(copy / "model")
    c.download_artifacts(grid.info.run_id, "model", str(copy))
    assert dpgrid.load_model(copy).statement["covered_by"]["epsilon"] == pytest.approx(spec.plan.epsilon_with_seeds)


def test_tensorboard_logs_each_run_in_its_folder_and_a_resume_logs_only_what_it_lacks(tmp_path):
    pytest.importorskip("tensorboard")
    spec, out, root = tracked(tmp_path, "tensorboard")
    logdir = root / "tensorboard" / "digits" / "grid"
    first = sorted(p.relative_to(logdir) for p in logdir.rglob("events.out.tfevents.*") if p.parent != logdir)
    assert len(first) == 8
    shutil_rmtree(logdir / "lr0_clip0" / "seed1")                    # a run whose log was lost
    (logdir / "lr1_clip1" / ".seed0.partial-1").mkdir()              # a kill's half-written run
    from dpgrid.config import compile
    from dpgrid.runner import train
    from dpgrid.tracking import Place

    train(compile(load_cfg("digits", "fixed_threshold", tracker="tensorboard", **GRID)), out, progress=False,
          tracked_from=Place(root, inline=True))
    again = sorted(p.relative_to(logdir) for p in logdir.rglob("events.out.tfevents.*") if p.parent != logdir)
    assert len(again) == 8 and not (logdir / "lr1_clip1" / ".seed0.partial-1").exists()
    assert [p for p in again if p not in first] == [p for p in again if p.parts[:2] == ("lr0_clip0", "seed1")]


def shutil_rmtree(path):
    import shutil

    shutil.rmtree(path)


@pytest.mark.slow  # MLflow's import and a fresh store
def test_a_selection_logs_its_release_and_no_run(tmp_path):
    """Random stopping publishes its chosen candidate's release only: its grid logs no run, nor how many there were."""
    pytest.importorskip("mlflow")
    spec, out, root = tracked(tmp_path, "mlflow", **{"privacy/selection": "random_stopping",
                                                     "privacy.selection.stopping_mean": 3})
    found = kinds(all_runs(root))
    assert set(found) == {"grid"}
    grid = found["grid"][0]
    assert not any(key.startswith("best.") for key in grid.data.metrics)
    assert "release.epsilon" in grid.data.metrics and grid.info.status == "FINISHED"


# --- the command line: worker processes, kills, sweeps ---------------------------------------------------------------

def worker_of(pid: int) -> int:
    """The tracker's worker process of dpgrid process `pid` (its child running dpgrid.tracking.worker)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == pid and b"dpgrid.tracking.worker" in command:
                return int(entry.name)
    raise AssertionError(f"no tracker worker under process {pid}")


def grid_opened(root) -> bool:
    """Whether the store holds a grid's run, read without MLflow (which would set up a store a worker is making)."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{root / 'mlflow.db'}?mode=ro", uri=True) as db:
            return bool(db.execute("select count(*) from tags where key = 'dpgrid.kind' and value = 'grid'").fetchone()[0])
    except sqlite3.Error:
        return False


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not end")


def paused_grid(tmp_path, after: int) -> tuple:
    """(its arguments, run directory, outputs' root, process, its tracker's worker): `dpgrid run tracker=mlflow` in a
    real process, paused once it has committed `after` runs (tests/paused.py)."""
    pytest.importorskip("mlflow")
    out, root = tmp_path / "outputs" / "grid", tmp_path / "outputs"
    args = ["run", *ARGS, "tracker=mlflow", f"hydra.run.dir={out}", f"hydra.sweep.dir={root}"]
    proc, _ = start_paused(args, after=after, folder=tmp_path)
    return args, out, root, proc, worker_of(proc.pid)


@pytest.mark.slow
def test_kill_9_ends_the_grid_run_failed_and_the_same_command_takes_it_up(tmp_path):
    args, out, root, proc, worker = paused_grid(tmp_path, after=3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_gone(worker)  # its input ended: it logs what it was sent and ends the grid's run
    found = kinds(all_runs(root))
    assert [r.info.status for r in found["grid"]] == ["FAILED"]
    assert {r.info.status for r in found["run"]} == {"FINISHED"} and len(found["run"]) == 2  # the third: not sent
    r = dpgrid(*args)
    assert r.returncode == 0, r.stderr
    again = kinds(all_runs(root))
    assert [r.info.run_id for r in again["grid"]] == [found["grid"][0].info.run_id]  # taken up, not a new one
    assert again["grid"][0].info.status == "FINISHED"
    keys = sorted((r.data.tags["dpgrid.config_id"], r.data.tags["dpgrid.seed"]) for r in again["run"])
    assert len(keys) == 8 and len(set(keys)) == 8


@pytest.mark.slow
def test_a_grid_killed_with_its_worker_is_ended_failed_by_the_next_command(tmp_path):
    args, out, root, proc, worker = paused_grid(tmp_path, after=2)
    deadline = time.monotonic() + 300
    while not grid_opened(root) and time.monotonic() < deadline:  # the worker has opened the grid's run
        time.sleep(0.05)
    for pid in (worker, proc.pid):
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    wait_gone(worker)
    assert [r.info.status for r in kinds(all_runs(root))["grid"]] == ["RUNNING"]
    other = dpgrid("run", *ARGS, "tracker=mlflow", "train.seeds=1", f"hydra.run.dir={root / 'other'}",
                   f"hydra.sweep.dir={root}")
    assert other.returncode == 0, other.stderr
    grids = {r.data.tags["dpgrid.folder"]: r.info.status for r in kinds(all_runs(root))["grid"]}
    assert grids == {str(out): "FAILED", str(root / "other"): "FINISHED"}


@pytest.mark.slow
def test_a_sweep_is_a_parent_run_with_a_child_per_grid(tmp_path):
    pytest.importorskip("mlflow")
    root = tmp_path / "sweep"
    r = dpgrid("run", "-m", *ARGS, "tracker=mlflow", "privacy.epsilon=3,5", f"hydra.sweep.dir={root}")
    assert r.returncode == 0, r.stderr
    found = kinds(all_runs(root))
    assert len(found["sweep"]) == 1 and found["sweep"][0].info.status == "FINISHED"
    sweep = found["sweep"][0].info.run_id
    assert sorted(g.info.run_name for g in found["grid"]) == ["digits/fixed_threshold/eps3/k2",
                                                              "digits/fixed_threshold/eps5/k2"]
    assert {g.data.tags["mlflow.parentRunId"] for g in found["grid"]} == {sweep}
    assert {g.info.status for g in found["grid"]} == {"FINISHED"}
    by_grid = {g.info.run_id: 0 for g in found["grid"]}
    for run in found["run"]:
        by_grid[run.data.tags["mlflow.parentRunId"]] += 1
    assert list(by_grid.values()) == [8, 8]
    again = dpgrid("run", "-m", *ARGS, "tracker=mlflow", "privacy.epsilon=3,5", f"hydra.sweep.dir={root}")
    assert again.returncode == 0, again.stderr
    rerun = kinds(all_runs(root))
    assert [s.info.run_id for s in rerun["sweep"]] == [sweep] and len(rerun["run"]) == 16  # nothing logged twice


@pytest.mark.slow
def test_a_joblib_sweep_logs_from_its_workers_without_a_race(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    root = tmp_path / "sweep"
    r = dpgrid("run", "-m", *ARGS, "tracker=mlflow", "hydra/launcher=local", "hydra.launcher.n_jobs=2",
               "privacy.epsilon=3,5", f"hydra.sweep.dir={root}")
    assert r.returncode == 0, r.stderr
    found = kinds(all_runs(root))
    assert len(found["sweep"]) == 1 and len(found["grid"]) == 2
    assert {g.data.tags["mlflow.parentRunId"] for g in found["grid"]} == {found["sweep"][0].info.run_id}
    keys = [(r.data.tags["mlflow.parentRunId"], r.data.tags["dpgrid.config_id"], r.data.tags["dpgrid.seed"])
            for r in found["run"]]
    assert len(keys) == 16 and len(set(keys)) == 16
    assert {r.info.status for r in all_runs(root)} == {"FINISHED"}


@pytest.mark.slow
def test_an_audit_logs_its_bound_and_verdict_to_its_grid_run(tmp_path):
    pytest.importorskip("mlflow")
    out = tmp_path / "audit"
    r = dpgrid("audit", "--canaries", "40", "strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=1",
               "train.eval_every=4", "tracker=mlflow", f"hydra.run.dir={out}", f"hydra.sweep.dir={tmp_path / 'outputs'}")
    assert r.returncode in (0, 1), r.stderr
    record = json.loads((out / "audit.json").read_text())
    grid = kinds(all_runs(tmp_path / "outputs"))["grid"][0]
    assert grid.data.metrics["audit.epsilon_lower_bound"] == pytest.approx(record["epsilon_lower_bound"])
    assert grid.data.params["audit.threat_model"] == "white_box"
    assert grid.data.tags["dpgrid.audit.mechanism"] == record["mechanism"]["verdict"]


@pytest.mark.slow  # MLflow's import
def test_a_tracker_that_fails_is_one_warning_and_the_grid_goes_on(tmp_path, monkeypatch, recwarn):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    spec, out, root = tracked(tmp_path, "mlflow", **{"tracker.uri": "http://127.0.0.1:9"})  # nothing listens there
    assert len(pd.read_csv(out / "runs.csv")) == 8 and (out / "model" / "model.json").exists()
    said = [str(w.message) for w in recwarn if str(w.message).startswith("tracker:")]
    assert len(said) == 1 and "could not start" in said[0] and "the grid goes on without it" in said[0], said


@pytest.mark.slow  # a worker process
def test_a_refused_grid_leaves_no_store_and_no_worker(tmp_path):
    pytest.importorskip("mlflow")
    root = tmp_path / "outputs"
    r = dpgrid("run", *ARGS, "tracker=mlflow", "model=cnn", f"hydra.run.dir={root / 'grid'}",
               f"hydra.sweep.dir={root}")  # the CNN does not fit digits: refused once the data is loaded
    assert r.returncode == 2 and one_line(r.stderr) and "does not fit" in r.stderr, r.stderr
    assert not root.exists()
    with pytest.raises(AssertionError, match="no tracker worker"):  # stopped as the grid was refused
        worker_of(os.getpid())
