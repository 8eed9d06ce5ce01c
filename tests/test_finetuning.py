"""Private fine-tuning (dpgrid.models.finetuning): a grid starts every run from a checkpoint (model.init), trains the part
train.trainable names, or LoRA adapters (model.lora); the checkpoint is the grid's identity by its checksum and is
named, outside epsilon, in plan.json and model.json; bad input is one line."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import dpgrid
from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.models.finetuning import LoRALinear, merged_state
from dpgrid.runner import initial_model, train

from .conftest import load_cfg

SMALL = {"grid.k": 2, "train.seeds": 1, "train.epochs": 1, "train.eval_every": 4}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A public model: the digits MLP's weights saved by hand (no statement in its metadata: public by assumption; a
    model dpgrid released is not public, tests/test_provenance.py)."""
    from dpgrid.models import mlp

    path = tmp_path_factory.mktemp("public") / "start.safetensors"
    torch.manual_seed(11)
    save_file({name: t.contiguous() for name, t in mlp().state_dict().items()}, str(path))
    return path


def grid(tmp_path, name="grid", strategy="fixed_threshold", **overrides):
    spec = compile(load_cfg("digits", strategy, **{**SMALL, **overrides}))
    return spec, tmp_path / name, train(spec, tmp_path / name, progress=False)


def test_every_run_starts_from_the_checkpoint_and_the_grid_says_so(tmp_path, checkpoint):
    spec, out, _ = grid(tmp_path, **{"model.init": str(checkpoint)})
    start = load_file(str(checkpoint))
    for seed in (0, 3):  # every seed (and candidate) starts from it
        model = initial_model(spec, seed, "cpu")
        assert all(torch.equal(p, start[name]) for name, p in model.state_dict().items())
    plan = json.loads((out / "plan.json").read_text())
    assert plan["start"]["init"]["path"] == str(checkpoint) and len(plan["start"]["init"]["sha256"]) == 64
    statement = json.loads((out / "model" / "model.json").read_text())
    assert statement["start"]["init"]["sha256"] == plan["start"]["init"]["sha256"]
    assert statement["start"]["init"]["covered"].startswith("public: assumed public: its file carries no privacy")
    released = dpgrid.load_model(out, seed=0)
    assert any(not torch.equal(p, start[name]) for name, p in released.state_dict().items())  # it trained


def test_the_checkpoint_is_the_grids_identity_by_its_content(tmp_path, checkpoint):
    mine = tmp_path / "start.safetensors"
    shutil.copy(checkpoint, mine)
    spec, out, _ = grid(tmp_path, **{"model.init": str(mine)})
    moved = tmp_path / "moved.safetensors"
    shutil.copy(mine, moved)  # the same file elsewhere: the same grid, which resumes
    assert compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"model.init": str(moved)})).config_hash == \
        spec.config_hash
    tensors = load_file(str(mine))
    save_file({k: v + 1 for k, v in tensors.items()}, str(mine))  # another checkpoint at the same path
    other = compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"model.init": str(mine)}))
    assert other.config_hash != spec.config_hash
    with pytest.raises(DpgridError, match="was trained from another checkpoint: model.init=.* is not the file"):
        train(other, out, progress=False)
    assert compile(load_cfg("digits", "fixed_threshold", **SMALL)).config_hash != spec.config_hash
    with pytest.raises(DpgridError, match="changed since the grid was planned"):  # edited while the grid runs
        initial_model(spec, 1, "cpu")


def test_frozen_parameters_stay_as_they_start_and_get_no_noise(tmp_path, checkpoint):
    spec, out, _ = grid(tmp_path, **{"model.init": str(checkpoint), "train.trainable": '["2.*"]',
                                     "train.save_models": "all"})
    assert spec.start.trainable_parameters == 32 * 10 + 10
    start = load_file(str(checkpoint))
    for path in (out / "weights").glob("*.safetensors"):
        final = load_file(str(path))
        assert torch.equal(final["0.weight"], start["0.weight"]) and torch.equal(final["0.bias"], start["0.bias"])
        assert not torch.equal(final["2.weight"], start["2.weight"])


def test_lora_trains_adapters_and_releases_them_merged(tmp_path, checkpoint):
    spec, out, trained = grid(tmp_path, **{"model.init": str(checkpoint), "model.lora.rank": 2,
                                           "model.lora.targets": '["0"]'})
    model = initial_model(spec, 0, "cpu")
    assert isinstance(model[0], LoRALinear) and not model[0].base.weight.requires_grad
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["0.down.weight", "0.up.weight", "2.weight",
                                                                           "2.bias"]
    statement = json.loads((out / "model" / "model.json").read_text())
    assert statement["start"]["lora"] == {"rank": 2, "alpha": 8.0, "targets": ["0"], "merged": True}
    released = dpgrid.load_model(out, seed=0)  # the base architecture: adapters merged into its weights
    assert isinstance(released[0], torch.nn.Linear)


def test_a_merged_adapter_computes_what_the_adapter_did():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()
    adapted = torch.nn.Sequential(LoRALinear(base[0], 2, 4.0), base[1], base[2])
    torch.nn.init.normal_(adapted[0].up.weight)
    x = torch.randn(7, 5, dtype=torch.float64)
    plain = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()
    plain.load_state_dict(merged_state(adapted))
    assert torch.allclose(plain(x), adapted(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("overrides, message", [
    ({"model.init": "/no/such/file.safetensors"}, r"^model.init: no file /no/such/file.safetensors$"),
    ({"train.trainable": '["head.*"]'}, r"^train.trainable: 'head.\*' matches none of its parameters "
                                        r"\(model=dpgrid.models.mlp: 0.weight, 0.bias, 2.weight, 2.bias\)$"),
    ({"train.trainable": "[]"}, r"^train.trainable must be a non-empty list of parameter-name globs"),
    ({"model.lora.rank": 2, "model.lora.targets": '["1"]'}, r"^model.lora.targets: '1' matches 1, a ReLU, not a "
                                                            r"Linear layer$"),
    ({"model.lora.rank": 2, "model.lora.targets": '["9"]'}, r"^model.lora.targets: '9' matches no module"),
    ({"model.lora.rank": 2}, r"^model.lora.targets must be a non-empty list of module-name globs"),
    ({"model.lora.targets": '["0"]'}, r"^model.lora.targets are set but model.lora.rank is 0"),
    ({"model.lora.rank": 2, "model.lora.targets": '["0"]', "train.trainable": '["0.base.weight"]'},
     r"^train.trainable: '0.base.weight' matches none of its parameters other than the adapters and the layers they "
     r"adapt \(model=dpgrid.models.mlp: 2.weight, 2.bias\)$"),
    ({"model.lora.rank": 40, "model.lora.targets": '["0"]'}, r"^model.lora.rank=40 is above the dimensions of 0 "
                                                             r"\(64 -> 32\)"),
    ({"model.init_covered_by": "private"}, r"^model.init_covered_by must be null"),
    ({"model.init_disjoint": True}, r"^model.init_disjoint=true but model.init is null"),
    ({"model.init_disjoint": "yes"}, r"^model.init_disjoint must be true or false"),
])
def test_bad_fine_tuning_input_is_one_line(overrides, message):
    with pytest.raises(DpgridError, match=message) as refusal:
        compile(load_cfg("digits", "fixed_threshold", **SMALL, **overrides))
    assert "\n" not in str(refusal.value)


def test_a_checkpoint_that_is_not_one_or_does_not_fit(tmp_path, checkpoint):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file at all")
    with pytest.raises(DpgridError, match=r"^model.init: .*garbage.safetensors is not a safetensors file \("):
        compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"model.init": str(garbage)}))
    tensors = load_file(str(checkpoint))
    wrong = tmp_path / "wrong.safetensors"
    save_file({**tensors, "2.weight": torch.zeros(5, 32)}, str(wrong))
    with pytest.raises(DpgridError, match=r"^model.init: .*wrong.safetensors does not fit model=dpgrid.models.mlp: "
                                          r"2.weight is \(5, 32\) there, \(10, 32\) in model=dpgrid.models.mlp$"):
        compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"model.init": str(wrong)}))
    save_file({k: v for k, v in tensors.items() if k != "2.bias"}, str(wrong))
    with pytest.raises(DpgridError, match=r"does not fit model=dpgrid.models.mlp: 2.bias is missing from it$"):
        compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"model.init": str(wrong)}))


def test_a_model_with_frozen_parts_trains_one_run_at_a_time():
    from dpgrid.reporting.describe import grouping

    spec = compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"train.trainable": '["2.*"]'}))
    assert grouping(spec, 4) == (1, ": part of the model is frozen (train.trainable): such runs train one at a time")


@pytest.mark.slow
def test_public_pretraining_then_private_fine_tuning_on_real_data(tmp_path, shared_data):
    """The study's path (scripts/finetuning_study.py) in miniature, on the real files: a non-private FashionMNIST grid
    releases the public checkpoint; private MNIST grids start from it, training the classifier alone or LoRA adapters,
    and release models that classify MNIST well above chance."""
    root = shared_data
    public = tmp_path / "public"
    train(compile(load_cfg("fashion_mnist_classes", "nodp", **{"model": "image_mlp", "data.root": str(root),
                                                                "grid.k": 2, "train.seeds": 1, "train.epochs": 1})),
          public, progress=False)
    init = str(public / "model" / "seed0.safetensors")
    for name, extra in (("last", {"train.trainable": '["3.*"]'}),
                        ("lora", {"model.lora.rank": 4, "model.lora.targets": '["1"]'})):
        cfg = load_cfg("mnist", "fixed_threshold", **{"model": "image_mlp", "data.root": str(root), "grid.k": 2,
                                                      "train.seeds": 1, "train.epochs": 1, "privacy.epsilon": 3,
                                                      "model.init": init, "model.init_disjoint": True, **extra})
        spec = compile(cfg)
        train(spec, tmp_path / name, progress=False)
        statement = json.loads((tmp_path / name / "model" / "model.json").read_text())
        assert statement["start"]["init"]["path"] == init and statement["privacy"]["epsilon_target"] == 3
        # FashionMNIST is not MNIST, in the user's word: the checkpoint's (infinite) epsilon is stated apart
        assert statement["covered_by"]["epsilon"] == spec.plan.epsilon_with_seeds and statement["checkpoint"]["declared_disjoint"]
        assert statement["score"]["value"] > 30, statement["score"]  # ten classes: chance is 10 %
