"""A released model never runs code it was not given by the user, and a release survives its own files being edited:
a statement that names a callable, a forged or foreign statement, a damaged file, an --out into the grid's own files,
are each refused in one line, and nothing is presented, exported or trained again."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load

import dpgrid
from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.results.statement import sealed
from dpgrid.runner import train

from .command import dpgrid as run_dpgrid, one_line
from .conftest import load_cfg, trained_grid

SMALL = {"grid.k": 2, "train.seeds": 2, "train.epochs": 1, "train.eval_every": 4}


def grid(tmp_path, name="grid", **overrides):
    return trained_grid(tmp_path / name, **{**SMALL, **overrides})


def statement(out):
    return json.loads((out / "model" / "model.json").read_text())


def rewrite(out, change, reseal: bool):
    """Edit model.json as an adversary would: by hand (its seal no longer matches), or resealing it as dpgrid does."""
    record = statement(out)
    change(record)
    if reseal:
        record = sealed(record)
    (out / "model" / "model.json").write_text(json.dumps(record))


def subprocess_target(record, pwned):
    record["model"] = {"_target_": "subprocess.call", "args": ["touch", str(pwned)]}


@pytest.mark.parametrize("reseal", [False, True], ids=["edited", "resealed"])
def test_a_statement_naming_a_callable_runs_no_code(tmp_path, reseal):
    _, out = grid(tmp_path)
    pwned = tmp_path / "PWNED"
    rewrite(out, lambda r: subprocess_target(r, pwned), reseal)
    message = "no model config provides" if reseal else "was edited after the release"
    with pytest.raises(DpgridError, match=message):
        dpgrid.load_model(out)
    for args in (("model", out), ("model", out, "--out", tmp_path / "copy.safetensors")):
        r = run_dpgrid(*args)
        assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr
    assert not pwned.exists() and not (tmp_path / "copy.safetensors").exists()
    # a callable hidden in the keyword arguments of a model dpgrid provides is refused, not called
    rewrite(out, lambda r: r.update(model={"_target_": "dpgrid.models.mlp", "x": {"_target_": "subprocess.call",
                                                                                  "args": ["touch", str(pwned)]}}), True)
    with pytest.raises(DpgridError, match="not a plain keyword argument"):
        dpgrid.load_model(out)
    assert not pwned.exists()


@pytest.mark.slow
def test_a_plugin_model_is_built_from_its_search_path_or_by_trust_only(tmp_path):
    from .plugin import EXAMPLES, SEARCHPATH

    out = tmp_path / "plugin"
    model = ["model=tabular_mlp", "model.inputs=64", "model.classes=10"]
    r = run_dpgrid("run", "strategy=fixed_threshold", *model, SEARCHPATH, "grid.k=2", "train.seeds=1", "train.epochs=1",
                   f"hydra.run.dir={out}", path=[EXAMPLES])
    assert r.returncode == 0, r.stderr
    r = run_dpgrid("model", out, path=[EXAMPLES])
    assert r.returncode == 2 and one_line(r.stderr) and "dpgrid_example.models.tabular_mlp" in r.stderr, r.stderr
    assert run_dpgrid("model", out, SEARCHPATH, path=[EXAMPLES]).returncode == 0
    assert run_dpgrid("model", out, "--trust", "dpgrid_example.models.tabular_mlp", path=[EXAMPLES]).returncode == 0


@pytest.mark.parametrize("inside", ["runs.csv", "plan.json", "model/seed1.safetensors", "model/model.json",
                                    "model/new.safetensors"])
def test_out_never_writes_inside_a_run_directory(tmp_path, inside):
    _, out = grid(tmp_path)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    r = run_dpgrid("model", out, "--out", out / inside)
    assert r.returncode == 2 and one_line(r.stderr) and "lies inside the run directory" in r.stderr, r.stderr
    assert r.stdout == ""  # refused before anything is said of the model
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    r = run_dpgrid("model", out, "--out", tmp_path / "missing" / "m.safetensors")
    assert r.returncode == 2 and one_line(r.stderr) and "create it first" in r.stderr and r.stdout == ""


def forge_epsilon(record):
    record["covered_by"]["epsilon"] = 0.5


@pytest.mark.parametrize("damage, message", [
    (lambda out: rewrite(out, forge_epsilon, False), "model.json was edited after the release"),
    (lambda out: rewrite(out, forge_epsilon, True), "states an epsilon or delta its plan does not"),
    (lambda out: rewrite(out, lambda r: r["models"][1].pop("file"), True), "is not a model statement dpgrid wrote"),
    (lambda out: rewrite(out, lambda r: r["models"][0].update(test_value="abc"), True), "is not a model statement"),
    (lambda out: rewrite(out, lambda r: r.pop("model"), False), "is not a model statement"),
    (lambda out: (out / "model" / "model.json").write_text("{garbage"), "damaged file"),
    (lambda out: flip_a_byte(out / "model" / "seed1.safetensors"), "does not match the checksum model.json records"),
    (lambda out: (out / "plan.json").write_text(json.dumps({**json.loads((out / "plan.json").read_text()), "k": 9})),
     "is not the release of the grid"),
], ids=["epsilon edited", "epsilon resealed", "a file entry deleted", "a value not a number", "model deleted",
        "garbage", "a flipped byte", "plan.json edited"])
def test_a_forged_or_damaged_release_is_refused_and_never_exported(tmp_path, damage, message):
    _, out = grid(tmp_path)
    damage(out)
    with pytest.raises(DpgridError, match=message):
        dpgrid.load_model(out)
    copy = tmp_path / "copy.safetensors"
    r = run_dpgrid("model", out, "--out", copy)
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr and r.stdout == "", r.stderr
    assert not copy.exists()


def flip_a_byte(path):
    content = bytearray(path.read_bytes())
    content[-1] ^= 1
    path.write_bytes(bytes(content))


def test_a_foreign_model_folder_is_refused(tmp_path):
    _, out = grid(tmp_path)
    _, other = grid(tmp_path, "other", **{"privacy.epsilon": 8})
    shutil.rmtree(out / "model")
    shutil.copytree(other / "model", out / "model")
    with pytest.raises(DpgridError, match="is not the release of the grid in"):
        dpgrid.load_model(out)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(model={"_target_": "dpgrid.models.cnn"}), "does not have the released weights' shapes"),
    (lambda r: None, "is not a safetensors file"),
], ids=["another model", "a pickle for weights"])
def test_weights_that_do_not_load_are_one_line(tmp_path, change, message):
    import hashlib
    import pickle

    _, out = grid(tmp_path)
    record = statement(out)
    change(record)
    if "pickle" in message or "safetensors" in message:
        content = pickle.dumps({"weights": [1, 2, 3]})
        (out / "model" / "seed0.safetensors").write_bytes(content)
        record["models"][0]["sha256"] = hashlib.sha256(content).hexdigest()
    (out / "model" / "model.json").write_text(json.dumps(sealed(record)))
    with pytest.raises(DpgridError, match=message):
        dpgrid.load_model(out, seed=0)


def test_the_grids_command_refuses_a_damaged_release_and_overwrite_makes_the_same_again(tmp_path):
    """No loop: the grid's command names the damage (it does not say "model: ... covered by"), and overwrite=true
    trains the seeded grid anew, releasing the same model."""
    spec, out = grid(tmp_path)
    released = load((out / "model" / "seed0.safetensors").read_bytes())
    flip_a_byte(out / "model" / "seed1.safetensors")
    with pytest.raises(DpgridError, match="does not match the checksum .* overwrite=true"):
        train(spec, out, progress=False)
    again = compile(load_cfg("digits", "fixed_threshold", **SMALL, overwrite=True))
    with pytest.warns(UserWarning, match="trains anew"):
        train(again, out, progress=False)
    model = dpgrid.load_model(out, seed=0)
    for name, tensor in released.items():
        torch.testing.assert_close(model.state_dict()[name], tensor)


def test_settings_that_would_crash_are_one_line():
    for overrides, message in (({"privacy.selection": "random_stopping", "privacy.selection.stopping_eta": -0.999},
                                "cannot give 49 candidates expected"),
                               ({"privacy.selection": "subsample_tuning", "privacy.selection.final_data": "rest",
                                 "privacy.selection.tuning_rate": 0.999999}, "leaves the final model an expected batch")):
        with pytest.raises(DpgridError, match=message):
            compile(load_cfg("digits", "fixed_threshold", **overrides))


def edit_members(out, members):
    path = out / "tuning_set.json"
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({**recorded, "members": members}))


@pytest.mark.slow
@pytest.mark.parametrize("secure", [False, True], ids=["seeded", "secure"])
def test_an_edited_tuning_set_is_never_trained_on(tmp_path, secure):
    """tuning_set.json edited after the draw (every example made a member) is refused: a seeded grid draws it again
    and compares, a secure one compares it with the checksum its ledger recorded when it was drawn."""
    args = ["strategy=fixed_threshold", "grid.k=2", "train.epochs=1", "train.seeds=1", "train.eval_every=4",
            "privacy.selection=subsample_tuning", "privacy.tuning_rate=0.3", f"privacy.secure_rng={str(secure).lower()}",
            f"hydra.run.dir={tmp_path / 'tuned'}"]
    assert run_dpgrid("run", *args).returncode == 0
    out = tmp_path / "tuned"
    edit_members(out, list(range(1437)))
    before = (out / "runs.csv").read_bytes()
    r = run_dpgrid("run", *args)
    assert r.returncode == 2 and one_line(r.stderr) and "tuning_set.json" in r.stderr, r.stderr
    assert (out / "runs.csv").read_bytes() == before
