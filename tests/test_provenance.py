"""A checkpoint's privacy travels with it (dpgrid.privacy.provenance): a release fine-tuned from dpgrid's own release on
the same data is covered by both grids together (checked here against dp-accounting's RDP accountant, an
implementation dpgrid did not write); on other data each dataset is named with its epsilon; a file without a
statement is assumed public and says so; a declaration never overrides a file's own statement; adapters always
train, and model.json counts what trained."""

import json
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from safetensors.torch import load_file, save_file

from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.runner import train

from .conftest import load_cfg

SMALL = {"grid.k": 2, "train.seeds": 1, "train.epochs": 1, "train.eval_every": 4}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A digits release (fixed_threshold, epsilon = 2) and its spec."""
    out = tmp_path_factory.mktemp("first") / "grid"
    spec = compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"privacy.epsilon": 2}))
    train(spec, out, progress=False)
    return spec, out


def independent_epsilon(events, delta):
    """dp-accounting's RDP accountant over [(q, nu, steps)]: Google's implementation, not Opacus's or dpgrid's."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    for q, nu, steps in events:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(nu)), steps)
    return accountant.get_epsilon(delta)


def test_fine_tuning_a_release_on_its_own_data_is_covered_by_both(released, tmp_path):
    first, first_out = released
    checkpoint = first_out / "model" / "seed0.safetensors"
    spec = compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"privacy.epsilon": 2,
                                                                     "model.init": str(checkpoint)}))
    out = tmp_path / "again"
    train(spec, out, progress=False)
    plan = json.loads((out / "plan.json").read_text())
    provenance = plan["start"]["init"]["provenance"]
    assert provenance["private"] and provenance["dataset"] == "digits" and provenance["epsilon"] == pytest.approx(
        first.plan.epsilon_with_seeds)
    statement = json.loads((out / "model" / "model.json").read_text())
    events = [(p.sample_rate, p.noise_multiplier, p.n_configs * p.seeds * p.steps) for p in (first.plan, spec.plan)]
    by_hand = independent_epsilon(events, spec.plan.delta)
    total = statement["covered_by"]["epsilon"]
    assert total > max(first.plan.epsilon_with_seeds, spec.plan.epsilon_with_seeds)  # both grids cost
    assert total == pytest.approx(by_hand, rel=0.01)  # two RDP accountants, their own orders
    assert total <= first.plan.epsilon_with_seeds + spec.plan.epsilon_with_seeds  # tighter than adding them
    assert not statement["checkpoint"]["declared_disjoint"] and "both grids together" in statement["why"]
    assert statement["events"] == [list(e) for e in events]  # what the next fine-tuning composes with
    again = load_file(str(out / "model" / "seed0.safetensors"))
    assert again  # the chain goes on: this file carries the composed statement
    from dpgrid.privacy.provenance import checkpoint_provenance

    assert checkpoint_provenance(str(out / "model" / "seed0.safetensors"), None).epsilon == pytest.approx(total)


def test_other_data_is_composed_unless_the_user_declares_it_disjoint(released, tmp_path):
    """Nothing public tells whether two datasets share examples (a digest of the training files would, and is not
    released): a private checkpoint's epsilon is composed with the grid's unless model.init_disjoint=true, and then
    each dataset is named with its own."""
    first, first_out = released
    public = tmp_path / "public.safetensors"
    save_file(load_file(str(first_out / "model" / "seed0.safetensors")), str(public))  # the same weights, no statement
    declared = {"model.init": str(public), "model.init_covered_by": "{epsilon: 1.5, delta: 1e-6, dataset: clinic}"}
    undeclared = compile(load_cfg("digits", "fixed_threshold", **SMALL, **declared))
    train(undeclared, tmp_path / "composed", progress=False)
    statement = json.loads((tmp_path / "composed" / "model" / "model.json").read_text())
    part = statement["checkpoint"]
    assert not part["declared_disjoint"] and "clinic" in part["why"] and "model.init_disjoint=true" in part["why"]
    assert statement["covered_by"]["epsilon"] == pytest.approx(undeclared.plan.epsilon_with_seeds + 1.5)  # basic
    assert statement["covered_by"]["delta"] == pytest.approx(undeclared.plan.delta + 1e-6)
    spec = compile(load_cfg("digits", "fixed_threshold", **SMALL, **declared, **{"model.init_disjoint": True}))
    assert spec.config_hash != undeclared.config_hash  # what the release states is part of the grid's identity
    out = tmp_path / "other"
    train(spec, out, progress=False)
    statement = json.loads((out / "model" / "model.json").read_text())
    part = statement["checkpoint"]
    assert part["declared_disjoint"] and part["checkpoint"]["dataset"] == "clinic" and part["checkpoint"]["epsilon"] == 1.5
    assert statement["covered_by"]["epsilon"] == pytest.approx(spec.plan.epsilon_with_seeds)  # digits' examples
    assert part["composed"]["epsilon"] == pytest.approx(spec.plan.epsilon_with_seeds + 1.5)  # anyone in both
    assert "clinic" in statement["why"] and "declared disjoint" in statement["why"]
    assert statement["start"]["init"]["disjoint"].startswith("declared by the user")
    with pytest.raises(DpgridError, match="carries dpgrid's own statement") as refused:
        compile(load_cfg("digits", "fixed_threshold", **SMALL, **{
            "model.init": str(first_out / "model" / "seed0.safetensors"), "model.init_covered_by": "public"}))
    assert "\n" not in str(refused.value)
    assumed = compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"model.init": str(public)}))
    assert not assumed.start.init_provenance.private and "assumed public" in assumed.start.to_dict()["init"]["covered"]


def test_a_model_trained_without_privacy_is_covered_by_no_epsilon(tmp_path):
    out = tmp_path / "nodp"
    train(compile(load_cfg("digits", "nodp", **SMALL)), out, progress=False)
    spec = compile(load_cfg("digits", "fixed_threshold", **SMALL, **{
        "model.init": str(out / "model" / "seed0.safetensors")}))
    assert math.isinf(spec.start.init_provenance.epsilon)
    train(spec, tmp_path / "tuned", progress=False)
    statement = json.loads((tmp_path / "tuned" / "model" / "model.json").read_text())
    assert statement["covered_by"] is None and "without differential privacy" in statement["checkpoint"]["composed_by"]


def test_adapters_train_and_model_json_counts_what_trained(tmp_path):
    from dpgrid.models import mlp

    start = tmp_path / "start.safetensors"
    torch.manual_seed(3)
    save_file({k: v.contiguous() for k, v in mlp().state_dict().items()}, str(start))
    spec = compile(load_cfg("digits", "fixed_threshold", **SMALL, **{
        "model.init": str(start), "model.lora.rank": 4, "model.lora.targets": '["0"]', "train.trainable": '["2.*"]'}))
    out = tmp_path / "lora"
    train(spec, out, progress=False)
    statement = json.loads((out / "model" / "model.json").read_text())
    trained = statement["start"]["trained"]
    assert trained == ["0.down.weight", "0.up.weight", "2.weight", "2.bias"]
    assert statement["start"]["trainable_parameters"] == 4 * 64 + 32 * 4 + 10 * 32 + 10
    release = load_file(str(out / "model" / "seed0.safetensors"))
    assert not torch.equal(release["0.weight"], load_file(str(start))["0.weight"])  # the adapters moved layer 0


@pytest.mark.parametrize("change, message", [
    (lambda t: {**t, "0.weight": t["0.weight"].to(torch.int32)}, "holds torch.int32 numbers where"),
    (lambda t: {**t, "2.bias": torch.full_like(t["2.bias"], float("nan"))}, "holds NaN or infinite values"),
])
def test_a_checkpoint_of_integers_or_non_finite_values_is_one_line(tmp_path, change, message):
    from dpgrid.models import mlp

    path = tmp_path / "bad.safetensors"
    save_file(change({k: v.contiguous() for k, v in mlp().state_dict().items()}), str(path))
    with pytest.raises(DpgridError, match=message) as refused:
        compile(load_cfg("digits", "fixed_threshold", **SMALL, **{"model.init": str(path)}))
    assert "\n" not in str(refused.value)
