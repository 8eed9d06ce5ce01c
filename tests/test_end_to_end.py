"""`dpgrid` as a user runs it on the embedded digits set: a grid and a sweep in real processes, the rest
through the command line's own main() in this process (tests/command.py)."""

import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from dpgrid.privacy import calibrate

from .command import dpgrid

pytestmark = pytest.mark.slow  # every test here trains grids or starts processes

SMALL = ["grid.k=2", "train.epochs=2", "train.seeds=2", "train.eval_every=5"]


def process(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dpgrid.commands.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_run_writes_plan_and_three_csvs(tmp_path):
    out = tmp_path / "grid"
    r = process("run", "strategy=fixed_threshold", *SMALL, f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    assert "best configuration" in r.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert plan["n_configs"] == 4 and plan["steps"] == math.ceil(2 * 1437 / 128)
    assert (out / "config.yaml").exists()

    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 * 2
    for column in ["dataset", "strategy", "epsilon", "delta", "k", "config_id", "lr", "clip", "seed",
                   "noise_multiplier", "epsilon_spent", "steps", "best_value", "best_step", "diverged", "seconds"]:
        assert column in runs.columns, column
    assert "quantile" not in runs.columns and "final_clip" not in runs.columns  # fixed_threshold adapts nothing
    assert set(runs.config_id) == {"lr0_clip0", "lr0_clip1", "lr1_clip0", "lr1_clip1"}
    assert (runs.noise_multiplier == plan["noise_multiplier"]).all()
    assert (runs.epsilon_spent <= 3.0).all() and (runs.steps == plan["steps"]).all()
    assert runs.best_value.between(0, 100).all()

    curves = pd.read_csv(out / "curves.csv")
    assert list(curves.columns) == ["config_id", "seed", "step", "value", "clip", "lr", "test_loss"]
    assert sorted(curves[(curves.config_id == "lr0_clip0") & (curves.seed == 0)].step) == [5, 10, 15, 20, 23]
    # each run's best value is the best of its validations
    best = curves.groupby(["config_id", "seed"]).value.max()
    for row in runs.itertuples():
        assert row.best_value == pytest.approx(best[(row.config_id, row.seed)])

    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4 and summary.best.sum() == 1 and (summary.n_seeds == 2).all()
    means = runs.groupby("config_id").best_value.mean()
    assert summary.set_index("config_id")["mean"].to_dict() == pytest.approx(means.to_dict())
    assert summary.loc[summary.best, "mean"].item() == summary["mean"].max()


def test_online_run_records_adaptive_columns_and_resumes(tmp_path):
    out = tmp_path / "grid"
    args = ["run", "strategy=online", *SMALL, f"hydra.run.dir={out}"]
    assert dpgrid(*args).returncode == 0
    runs = pd.read_csv(out / "runs.csv")
    assert {"noise_multiplier_g", "noise_multiplier_q", "final_clip", "final_lr"} <= set(runs.columns)
    assert (runs.final_clip != 0.1).any()  # C adapted
    first = (out / "runs.csv").read_text()
    assert dpgrid(*args).returncode == 0  # everything finished: nothing is run again
    assert (out / "runs.csv").read_text() == first


def test_grid_only_runs_a_subset_with_the_whole_grids_noise(tmp_path):
    out = tmp_path / "grid"
    r = dpgrid("run", "strategy=online", *SMALL, "grid.only=[lr1]", f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs.config_id) == {"lr1"}
    plan = json.loads((out / "plan.json").read_text())
    assert plan["n_configs"] == 2 and runs.noise_multiplier.iloc[0] == plan["noise_multiplier"]


def test_multirun_sweeps_into_the_deterministic_tree(tmp_path):
    r = process("run", "-m", "strategy=online,nodp", *SMALL, "train.seeds=1", f"hydra.sweep.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    for strategy in ("online", "nodp"):
        assert len(pd.read_csv(tmp_path / "digits" / strategy / ("eps3" if strategy != "nodp" else "nonprivate") / "k2" / "runs.csv")) == 2


def test_plan_json_for_the_paper_grid():
    r = dpgrid("plan", "--json", "strategy=fixed_threshold", "dataset=mnist", "privacy.epsilon=3", "grid.k=7")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["n_configs"] == 49 and len(plan["configurations"]) == 49
    assert plan["model_parameters"] == 551322 and plan["steps"] == 1172
    expected = calibrate(3, 512 / 60000, 49 * 1172, 1e-5)
    assert plan["noise_multiplier"] == pytest.approx(expected, rel=0.01)
    for key in ("dataset", "strategy", "k", "sample_rate", "epsilon", "delta", "epsilon_spent"):
        assert key in plan


def test_plan_json_reports_per_query_multipliers():
    online = json.loads(dpgrid("plan", "--json", "dataset=mnist").stdout)
    assert online["noise_multiplier_q"] == pytest.approx(7.124 * online["noise_multiplier"], rel=1e-3)
    quantile = json.loads(dpgrid("plan", "--json", "dataset=mnist", "strategy=fixed_quantile").stdout)
    assert quantile["count_noise_std"] == 512 / 20 and quantile["noise_multiplier_grad"] > quantile["noise_multiplier"]


@pytest.mark.parametrize("args, message", [
    (["run", "strategy=bogus"], "strategy"),
    (["plan", "dataset=bogus"], "dataset"),
    (["plan", "privacy.epsilon=0"], "privacy.epsilon must be in (0, 100]"),
    (["plan", "grid.k=1"], "grid.k must be a whole number >= 2"),
    (["frobnicate"], "unknown command"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    r = dpgrid(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "outputs").exists()


def test_every_finished_run_is_one_line_in_cli_log_and_on_a_non_terminal_stderr(tmp_path):
    out = tmp_path / "grid"
    r = dpgrid("run", "strategy=nodp", "grid.k=2", "train.seeds=1", "train.epochs=1", f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if ": run " in line]
    assert [line.split(": run ")[1].split(":")[0] for line in lines] == ["1/2 lr0 seed 0", "2/2 lr1 seed 0"]
    assert all(line in (out / "cli.log").read_text() for line in lines)


def test_the_non_private_baseline_does_not_depend_on_epsilon(tmp_path):
    """Its seeds and folder leave epsilon out: a sweep over epsilon trains it once."""
    r = dpgrid("run", "-m", "strategy=nodp", "privacy.epsilon=3,9", "grid.k=2", "train.seeds=1", "train.epochs=1",
               f"hydra.sweep.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    folders = [p.parent for p in tmp_path.rglob("runs.csv")]
    assert [f.relative_to(tmp_path).as_posix() for f in folders] == ["digits/nodp/nonprivate/k2"]
    assert len([line for line in r.stderr.splitlines() if ": run " in line]) == 2  # 2 runs, trained once
    tables = dpgrid("tables", tmp_path)  # plan.json says the last epsilon, the rows the first: one grid all the same
    assert tables.returncode == 0 and "skipped" not in tables.stderr, tables.stderr


def test_the_engine_fallback_is_announced_once_per_grid(tmp_path, monkeypatch):
    from dpgrid.training import persample

    monkeypatch.setattr(persample, "why_unserved", lambda module: "no fast per-sample rule (test)")
    r = dpgrid("run", "strategy=fixed_threshold", "grid.k=2", "train.seeds=2", "train.epochs=1",
               f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("falling back to the slower torch.func engine") == 1, r.stderr


def test_plan_into_a_closed_pipe_ends_quietly():
    """`dpgrid plan ... | head -1`: the plan's 3,600 configuration lines overflow the pipe, its reader leaves."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "dpgrid.commands.cli", "plan", "strategy=fixed_threshold", "grid.k=60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("fixed_threshold on digits")
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait() == 141 and stderr == "", stderr


def test_tables_help_is_usage_and_exit_0():
    r = dpgrid("tables", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: dpgrid tables") and r.stderr == ""
