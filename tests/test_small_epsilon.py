"""Every epsilon that composition alone can calibrate trains: a side analysis (Liu-Talwar's cost, the plan's
comparisons under other accountants and selections) that cannot reach the target is reported as unavailable, never a
refusal of the grid; a refusal names the settings the user can change, never a number derived from them."""

import json

import pytest

from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.privacy import calibrate

from .command import dpgrid, one_line
from .conftest import fast_layer_runs, load_cfg

N = 1437  # digits' training split
ONE_EPOCH = {"train.epochs": 1}

STRATEGIES = ["online", "fixed_threshold", "adamwosm", "dpadam"]
CASES = [(s, a) for s in STRATEGIES for a in ("rdp", "pld", "prv")]


@pytest.mark.parametrize("strategy, accountant", fast_layer_runs(CASES, ("online", "rdp"), ("fixed_threshold", "pld")))
def test_a_small_epsilon_composition_reaches_is_planned_whatever_liu_talwar_needs(strategy, accountant):
    # the issue's case: epsilon = 0.1 at one epoch, where Liu-Talwar's per-candidate (eps_1, delta_1) = (0.033, 5e-16)
    # is out of any noise's reach; composition alone needs nu = 27.9 for online's 7 runs under RDP
    plan = compile(load_cfg("digits", strategy, **ONE_EPOCH, **{"privacy.epsilon": 0.1,
                                                                "privacy.accountant": accountant}), N).plan
    assert plan.noise_multiplier == calibrate(0.1, plan.sample_rate, plan.n_configs * plan.steps, plan.delta,
                                              accountant=accountant)
    assert plan.epsilon_spent <= 0.1
    liu_talwar = plan.record.liu_talwar
    assert liu_talwar["noise_multiplier"] is None  # unavailable: recorded as such
    assert liu_talwar["epsilon_with_composition_nu"] > 0.1  # the other direction of the comparison still holds
    assert json.loads(json.dumps(plan.to_dict()))["liu_talwar"]["noise_multiplier"] is None  # plan.json's null


@pytest.mark.parametrize("selection", fast_layer_runs([
    "privacy.selection=random_stopping",
    "privacy.selection=random_stopping privacy.accountant=pld privacy.selection.selection_accountant=profile",
    "privacy.selection=subsample_tuning",
], "privacy.selection=random_stopping"))
def test_a_small_epsilon_a_selection_reaches_is_planned(selection):
    overrides = dict(s.split("=") for s in selection.split())
    plan = compile(load_cfg("digits", "online", **ONE_EPOCH, **{"privacy.epsilon": 0.05}, **overrides), N).plan
    assert plan.epsilon_spent <= 0.05 and plan.noise_multiplier > 1


def test_an_unreachable_epsilon_is_refused_naming_what_the_user_set():
    cfg = load_cfg("digits", "online", **ONE_EPOCH, **{"privacy.epsilon": 0.003})  # RDP's conversion floor: 0.008
    with pytest.raises(DpgridError) as refused:
        compile(cfg, N)
    message = str(refused.value)
    assert message.startswith("privacy.epsilon=0.003 is unreachable"), message
    assert "delta=1e-05" in message and "e-16" not in message  # the user's delta, not Liu-Talwar's delta_1
    assert "raise privacy.epsilon above that" in message and "grid.k" in message
    assert message.endswith("or privacy.accountant=pld, which reaches it")  # and it does:
    pld = compile(load_cfg("digits", "online", **ONE_EPOCH, **{"privacy.epsilon": 0.003, "privacy.accountant": "pld"}),
                  N).plan
    assert pld.epsilon_spent <= 0.003
    with pytest.raises(DpgridError) as refused:  # beyond PLD's reach too: no such advice
        compile(load_cfg("digits", "online", **ONE_EPOCH, **{"privacy.epsilon": 1e-4, "privacy.accountant": "pld"}), N)
    assert str(refused.value).startswith("privacy.epsilon=0.0001 is unreachable") and "accountant" not in str(refused.value)


def test_a_share_of_epsilon_is_refused_naming_the_share_and_the_epsilon():
    cfg = load_cfg("digits", "online", **ONE_EPOCH, **{"privacy.epsilon": 0.05, "privacy.selection": "subsample_tuning",
                                                       "privacy.selection.tuning_split": 0.5})
    with pytest.raises(DpgridError) as refused:
        compile(cfg, N)
    message = str(refused.value)
    assert message.startswith("privacy.selection.tuning_split=0.5 of privacy.epsilon=0.05 is unreachable for the "
                              "tuning phase alone"), message
    assert "privacy.selection.tuning_rate=0.1" in message


@pytest.mark.slow  # four accountants' and three stopping rules' calibrations: seconds
def test_plan_compare_says_unreachable_where_another_analysis_cannot_reach_it():
    r = dpgrid("plan", "--compare", "privacy.epsilon=0.003", "privacy.accountant=pld", "train.epochs=1")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in r.stdout.splitlines()
            if line.strip().split()[:1] in (["rdp"], ["pld"], ["prv"])}
    assert rows["rdp"] == ["unreachable", "unreachable"] and rows["prv"] == ["unreachable", "unreachable"]
    assert float(rows["pld"][0]) > 100
    # the side-by-side composition line is the plan's own accountant's, not RDP's
    composition = next(line for line in r.stdout.splitlines() if line.strip().startswith("composition, 7 runs"))
    plan = compile(load_cfg("digits", "online", **ONE_EPOCH, **{"privacy.epsilon": 0.003,
                                                                "privacy.accountant": "pld"}), N).plan
    assert float(composition.split()[-1]) == pytest.approx(plan.noise_multiplier, abs=1e-4)


@pytest.mark.slow  # trains a grid
def test_the_issues_command_trains_and_releases(tmp_path):
    r = dpgrid("run", "strategy=online", "privacy.epsilon=0.1", "train.epochs=1", "grid.k=3", "train.seeds=2",
               f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 0, r.stderr
    assert "covered by epsilon = " in r.stdout
    statement = json.loads((tmp_path / "grid" / "model" / "model.json").read_text())
    assert statement["covered_by"]["epsilon"] <= json.loads((tmp_path / "grid" / "plan.json").read_text())[
        "epsilon_with_seeds"] + 1e-12


def test_a_refusal_a_noise_split_makes_names_settings_the_user_can_change():
    # fixed_quantile's count query needs nu < 2 sigma_b: a refusal of the strategy itself, in its own keys
    r = dpgrid("plan", "strategy=fixed_quantile", "privacy.epsilon=0.1", "train.epochs=1")
    assert r.returncode == 2 and one_line(r.stderr)
    assert "raise privacy.epsilon or train.batch_size" in r.stderr
    divisor = float(r.stderr.rstrip().rpartition("strategy.count_noise_divisor below ")[2])
    lower = dpgrid("plan", "strategy=fixed_quantile", "privacy.epsilon=0.1", "train.epochs=1",
                   f"strategy.count_noise_divisor={divisor * 0.99:.3g}")  # the advice, followed, plans
    assert lower.returncode == 0, lower.stderr
