"""What a user takes away: the released model (model/), loadable, with the statement of what covers it; never a
model of an unfinished run, and by default none of a run that is not released."""

import json

import pytest
import torch
from safetensors.torch import load

import dpgrid
from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.data import load as load_data
from dpgrid.results.files import read_frame
from dpgrid.runner import train
from dpgrid.training.train import evaluate

from .command import dpgrid as run_dpgrid, one_line
from .conftest import load_cfg, trained_grid

SMALL = {"grid.k": 2, "train.seeds": 2, "train.epochs": 1, "train.eval_every": 4}


def grid(tmp_path, name="grid", strategy="fixed_threshold", **overrides):
    spec, out = trained_grid(tmp_path / name, strategy, **{**SMALL, **overrides})
    return spec, out, read_frame(out / "summary.csv")


def test_the_released_model_reproduces_its_runs_last_test_value(tmp_path):
    spec, out, summary = grid(tmp_path)
    best = summary[summary.best].iloc[0].config_id
    record = json.loads((out / "model" / "model.json").read_text())
    assert record["configuration"]["config_id"] == best and [m["seed"] for m in record["models"]] == [0, 1]
    data = load_data(spec.dataset, spec.data_root)
    curves = read_frame(out / "curves.csv")
    for seed in (0, 1):
        model = dpgrid.load_model(out, seed=seed)
        value, loss = evaluate(model, data.x_test, data.y_test, data.task)
        last = curves[(curves.config_id == best) & (curves.seed == seed)].sort_values("step").iloc[-1]
        # the same weights on the same public test set: the same predictions (one example is 0.28 % of digits' 360)
        assert value == pytest.approx(last.value, abs=1e-6) and loss == pytest.approx(last.test_loss, rel=1e-5)
    assert not (out / "weights").exists()  # the default keeps only what is released


def test_the_statement_says_what_covers_the_release(tmp_path):
    spec, out, _ = grid(tmp_path)
    record = json.loads((out / "model" / "model.json").read_text())
    plan = spec.plan
    assert record["covered_by"] == {"epsilon": plan.epsilon_with_seeds, "delta": plan.delta}
    assert plan.epsilon_with_seeds > plan.epsilon  # the choice read every seed of every configuration
    assert "(the epsilon with seeds)" in record["why"] and record["randomness"].startswith("seeded:")
    assert record["privacy"]["noise_multiplier"] == plan.noise_multiplier and record["config_hash"] == spec.config_hash
    accounted = grid(tmp_path, "accounted", **{"privacy.account_seeds": True})[0].plan
    record = json.loads((tmp_path / "accounted" / "model" / "model.json").read_text())
    assert record["covered_by"]["epsilon"] == accounted.epsilon_spent and "every run it read is accounted" in record["why"]
    nodp = json.loads(json.dumps(grid(tmp_path, "nodp", "nodp")[0].plan.to_dict()))
    record = json.loads((tmp_path / "nodp" / "model" / "model.json").read_text())
    assert record["covered_by"] is None and record["why"].startswith("non-private") and nodp["private"] is False


@pytest.mark.parametrize("save", ["all", "none"])
def test_all_keeps_every_runs_model_apart_and_none_keeps_nothing(tmp_path, save):
    spec, out, _ = grid(tmp_path, **{"train.save_models": save})
    kept = sorted(p.name for p in (out / "weights").glob("*")) if (out / "weights").exists() else []
    if save == "all":
        assert kept == sorted(f"{c['config_id']}_seed{s}.safetensors" for c in spec.plan.configurations for s in (0, 1))
        assert (out / "model" / "model.json").exists()
    else:
        assert kept == [] and not (out / "model").exists()


def test_a_partial_grid_releases_nothing_until_every_run_has_finished(tmp_path):
    spec = compile(load_cfg("digits", "fixed_threshold", **{**SMALL, "grid.only": "[lr0_clip0]"}))
    trained = train(spec, tmp_path / "grid", progress=False)
    out = tmp_path / "grid"
    assert not (out / "model").exists() and "released once every run of the grid has finished" in trained.release
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["lr0_clip0_seed0.safetensors",
                                                                   "lr0_clip0_seed1.safetensors"]
    spec = compile(load_cfg("digits", "fixed_threshold", **SMALL))
    train(spec, out, progress=False)  # the rest of the grid, in the same directory
    assert (out / "model" / "model.json").exists() and not (out / "weights").exists()


def test_a_diverged_run_keeps_no_model(tmp_path):
    spec, out, _ = grid(tmp_path, **{"train.save_models": "all", "grid.lr_range": "[0,10]", "grid.clip_range": "[0,10]"})
    runs = read_frame(out / "runs.csv")
    diverged = runs[runs.diverged]
    assert len(diverged)
    for row in diverged.itertuples():
        assert not (out / "weights" / f"{row.config_id}_seed{row.seed}.safetensors").exists()


def test_a_changed_model_file_is_refused_by_its_checksum(tmp_path):
    _, out, _ = grid(tmp_path)
    path = out / "model" / "seed0.safetensors"
    released = path.read_bytes()
    tensors = load(released)
    from safetensors.torch import save
    path.write_bytes(save({k: v + 1 for k, v in tensors.items()}))
    with pytest.raises(DpgridError, match="does not match the checksum model.json records"):
        dpgrid.load_model(out, seed=1)  # the whole release is checked, whichever seed is asked for
    path.write_bytes(released)
    with pytest.raises(DpgridError, match="holds no model of seed 7"):
        dpgrid.load_model(out, seed=7)
    with pytest.raises(DpgridError, match="is not a run directory .* run directories under it that released a model: "):
        dpgrid.load_model(tmp_path)
    (out / "model").rename(out / "elsewhere")
    with pytest.raises(DpgridError, match="this run directory released no model"):
        dpgrid.load_model(out)
    with pytest.raises(DpgridError, match="is a release's model/ folder: give the run directory that holds it"):
        dpgrid.load_model(out / "elsewhere")
    with pytest.raises(DpgridError, match="no run directory"):
        dpgrid.load_model(tmp_path / "missing")


@pytest.mark.slow
def test_the_command_line_says_what_covers_the_model_and_copies_it(tmp_path):
    _, out, _ = grid(tmp_path)
    r = run_dpgrid("model", out, "--out", tmp_path / "mine.safetensors")
    assert r.returncode == 0, r.stderr
    assert "covered by: epsilon = " in r.stdout and "dpgrid.load_model(" in r.stdout and "randomness: seeded" in r.stdout
    from safetensors import safe_open
    with safe_open(str(tmp_path / "mine.safetensors"), framework="pt") as f:
        meta = json.loads(f.metadata()["dpgrid"])
        assert meta["covered_by"] == json.loads((out / "model" / "model.json").read_text())["covered_by"]
    for args in ((), (out, "--seed"), (out, "--seed", "x"), (out, out)):
        r = run_dpgrid("model", *args)
        assert r.returncode == 2 and one_line(r.stderr) and "usage: dpgrid model" in r.stderr, r.stderr


def test_a_selection_releases_its_chosen_candidates_models_only(tmp_path, monkeypatch):
    from dpgrid.results import selection

    monkeypatch.setattr(selection, "draw_candidates", lambda stopping, ids, source: ["lr1_clip1", "lr0_clip0", "lr1_clip1"])
    spec, out, summary = grid(tmp_path, **{"privacy.selection": "random_stopping"})
    released = json.loads((out / "selection.json").read_text())["chosen"]
    record = json.loads((out / "model" / "model.json").read_text())
    assert record["configuration"]["config_id"] == released["config_id"]
    assert [m["seed"] for m in record["models"]] == [0, 1]  # the candidate's own seeds, never its index
    assert record["covered_by"]["epsilon"] == spec.plan.epsilon_spent and "random-stopping" in record["why"]
    assert not (out / "weights").exists()
    assert sorted(p.name for p in (out / "model").iterdir()) == ["model.json", "seed0.safetensors", "seed1.safetensors"]


def test_models_train_in_float64_and_load_so(tmp_path):
    _, out, _ = grid(tmp_path, **{"train.float64": True})
    model = dpgrid.load_model(out)
    assert {p.dtype for p in model.parameters()} == {torch.float64} and not model.training


@pytest.mark.slow  # a fresh Python that imports torch without dpgrid (3-5 s): it must be a process of its own
def test_the_readmes_plain_pytorch_load_scores_as_the_statement_says(tmp_path):
    """The README's load without dpgrid, run in a process that never imports it: the released model of the default
    job's model and data scores what model.json says (its architecture and split are stated there)."""
    import re
    import subprocess
    import sys

    from .conftest import ROOT

    _, out = trained_grid(tmp_path / "outputs" / "digits" / "online" / "eps3" / "k7", "online",
                          **{"grid.k": 2, "train.seeds": 1, "train.epochs": 1})
    code = re.search(r"<!-- plain-load -->\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    code = code.replace('"outputs/digits/online/eps3/k7"', repr(str(out)))
    code += "\nimport sys\nassert 'dpgrid' not in sys.modules\nprint(accuracy)\n"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    statement = json.loads((out / "model" / "model.json").read_text())
    seed0 = next(m for m in statement["models"] if m["seed"] == 0)
    assert float(found.stdout.strip().splitlines()[-1]) == pytest.approx(seed0["test_value"], abs=1e-6)
    assert statement["architecture"]["tensors"] == {"0.weight": [32, 64], "0.bias": [32], "2.weight": [10, 32],
                                                    "2.bias": [10]}


def test_load_model_takes_its_arguments_in_every_form_the_hints_give(tmp_path):
    """searchpath as Hydra's text or a list of its entries; trust as a name or a list (the CLI's hint shows both)."""
    _, out, _ = grid(tmp_path)
    for searchpath in ("[pkg://dpgrid.conf]", ["pkg://dpgrid.conf"], ("file:///nowhere",)):
        assert dpgrid.load_model(out, seed=0, searchpath=searchpath).statement["covered_by"]
    for trust in ("dpgrid.models.mlp", ["dpgrid.models.mlp"]):
        assert dpgrid.load_model(out, seed=0, trust=trust) is not None
