"""A strategy that is not in dpgrid (automatic clipping, examples/) plugs in from its own folder."""

import json

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from .plugin import EXAMPLES, SEARCHPATH, dpgrid

pytestmark = pytest.mark.slow  # every test here starts dpgrid processes

GRID = ["strategy=automatic", "grid.k=3", "train.epochs=1", "train.seeds=1", SEARCHPATH]


def test_automatic_clipping_plans_k_configurations_and_appears_in_the_tables(tmp_path):
    plan = dpgrid("plan", "--json", *GRID)
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert planned["n_configs"] == 3 and planned["label"] == "Automatic (AUTO-S)" and planned["axes"] == ["lr"]
    r = dpgrid("run", *GRID, f"hydra.run.dir={tmp_path / 'results' / 'automatic'}")
    assert r.returncode == 0, r.stderr
    runs = pd.read_csv(tmp_path / "results" / "automatic" / "runs.csv")
    assert len(runs) == 3 and (runs.noise_multiplier == planned["noise_multiplier"]).all()
    t = dpgrid("tables", str(tmp_path / "results"))
    assert t.returncode == 0, t.stderr
    assert "Automatic (AUTO-S) ρ" in (tmp_path / "results" / "tables" / "digits_k3.md").read_text()


def test_unknown_options_list_the_plugins_too():
    r = dpgrid("plan", "strategy=automatc", SEARCHPATH)
    assert r.returncode == 2 and "did you mean strategy=automatic?" in r.stderr and "online" in r.stderr


def test_the_update_rule_normalises_per_sample_gradients(tmp_path):
    import sys
    sys.path.insert(0, str(EXAMPLES))
    try:
        from dpgrid_example.automatic import AutomaticClipping
    finally:
        sys.path.remove(str(EXAMPLES))
    from dpgrid.strategies.base import Noise

    from .test_strategies import grads_from

    param = torch.zeros(2, dtype=torch.float64)
    s = AutomaticClipping([param], hp={"lr": 1.0}, noise=Noise(0.0), batch_size=4,
                          options=dict(OmegaConf.load(EXAMPLES / "dpgrid_example" / "conf" / "strategy" / "automatic.yaml")),
                          generator=torch.Generator().manual_seed(0))
    s.step(grads_from(torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)))
    assert param.tolist() == pytest.approx([-3 / 5.01 / 4, -4 / 5.01 / 4])  # -(g / (||g|| + 0.01)) / B


def test_a_target_that_is_not_a_strategy_is_refused(tmp_path):
    conf = tmp_path / "conf" / "strategy"
    conf.mkdir(parents=True)
    (conf / "wrong.yaml").write_text("_target_: torch.nn.Linear\nname: wrong\ngrid: [lr]\n")
    (conf / "missing.yaml").write_text("_target_: nowhere.Nothing\nname: missing\ngrid: [lr]\n")
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    r = dpgrid("plan", "strategy=wrong", search)
    assert r.returncode == 2 and "is not a subclass of dpgrid.Strategy" in r.stderr, r.stderr
    r = dpgrid("plan", "strategy=missing", search)
    assert r.returncode == 2 and "strategy=missing: cannot import _target_ nowhere.Nothing" in r.stderr, r.stderr


def test_a_clip_schedule_reads_the_runs_progress(tmp_path):
    """examples/'s clip_decay: C_t = C (1 - 0.9 t / T) from Strategy.progress, one run at a time and stacked, with the
    same numbers both ways (float64), each row saying the group it trained in; the plan's noise is fixed_threshold's
    (the schedule changes the sensitivity and the noise together)."""
    grid = ["strategy=clip_decay", "grid.k=2", "train.epochs=1", "train.seeds=2", "train.eval_every=3", "train.float64=true",
            SEARCHPATH]
    found = {}
    for parallel_runs in ("1", "auto"):
        out = tmp_path / f"decay{parallel_runs}"
        r = dpgrid("run", *grid, f"train.parallel_runs={parallel_runs}", f"hydra.run.dir={out}")
        assert r.returncode == 0, r.stderr
        runs, curves = pd.read_csv(out / "runs.csv"), pd.read_csv(out / "curves.csv")
        plan = json.loads((out / "plan.json").read_text())
        assert len(runs) == 8 and (runs.steps == plan["steps"]).all()
        assert runs.final_clip.to_numpy() == pytest.approx(0.1 * runs["clip"].to_numpy(), rel=1e-5)
        for (config_id, seed), curve in curves.groupby(["config_id", "seed"]):
            clip = float(runs[runs.config_id == config_id]["clip"].iloc[0])
            expected = [clip * (1 - 0.9 * t / plan["steps"]) for t in curve.step]
            assert curve["clip"].to_numpy() == pytest.approx(expected, rel=1e-5), (config_id, seed)
        found[parallel_runs] = runs.sort_values(["config_id", "seed"]).reset_index(drop=True)
    alone, stacked = found["1"], found["auto"]
    assert set(alone.group_size) == {1} and set(stacked.group_size) == {8}
    for column in ("best_value", "final_clip", "best_step"):
        assert stacked[column].tolist() == pytest.approx(alone[column].tolist(), rel=1e-9), column
    fixed = json.loads(dpgrid("plan", "--json", "strategy=fixed_threshold", *grid[1:]).stdout)
    assert plan["noise_multiplier"] == fixed["noise_multiplier"]
