"""An accounting method that is not in dpgrid (a stated noise multiplier, examples/) plugs in as one module plus one
config of privacy/selection, on its own search path; its keys are typed and checked like a built-in's."""

import json
import re

import pandas as pd
import pytest

from dpgrid import DpgridError, compose
from dpgrid.config import compile
from dpgrid.privacy.accountants import epsilon_of

from .plugin import EXAMPLES, SEARCHPATH, dpgrid

GRID = ["privacy.selection=fixed_noise", "privacy.selection.noise_multiplier=2.5", "grid.k=2", "train.epochs=1",
        "train.seeds=1", "privacy.epsilon=8", SEARCHPATH]


@pytest.fixture
def example_package(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_a_stated_noise_spends_what_its_runs_compose_to(example_package):
    plan = compile(compose(GRID)).plan
    assert plan.noise_multiplier == 2.5 and plan.method.name == "fixed_noise"
    composed = epsilon_of("rdp", plan.sample_rate, 2.5, plan.n_configs * plan.steps, plan.delta)
    assert plan.epsilon_spent == pytest.approx(composed, rel=1e-9) and plan.epsilon_spent < 8
    calibrated = compile(compose(GRID[2:])).plan  # composition calibrates to the whole target: less noise
    assert calibrated.noise_multiplier < 2.5 and calibrated.epsilon_spent > plan.epsilon_spent


@pytest.mark.parametrize("override, message", [
    ("privacy.selection.noise_multiplier=0.01", "privacy.selection.noise_multiplier must be a number in [0.1, 1000]"),
    ("privacy.selection.noise_multipler=2", "did you mean privacy.selection.noise_multiplier?"),
    ("privacy.selection.noise_multiplier=loud", "privacy.selection.noise_multiplier"),
    ("privacy.epsilon=0.5", "spends epsilon"),
])
def test_its_keys_are_typed_and_checked(example_package, override, message):
    with pytest.raises(DpgridError, match=re.escape(message)) as refused:
        compile(compose([*GRID, override]))
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_it_runs_plans_and_tables_as_a_built_in_method(tmp_path):
    """It overrides the maths alone (calibrate) and trains, releases and is described by composition's procedure;
    what leaves the grid names it, not composition: plan.json, model.json, `dpgrid plan`, `dpgrid model`, the
    tables, and a table read where its package is not importable."""
    planned = dpgrid("plan", *GRID)
    assert planned.returncode == 0 and "accounted by fixed_noise" in planned.stdout, planned.stderr
    assert "noise multiplier nu = 2.5" in planned.stdout
    out = tmp_path / "results" / "fixed"
    r = dpgrid("run", *GRID, f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    runs = pd.read_csv(out / "runs.csv")
    plan = json.loads((out / "plan.json").read_text())
    assert len(runs) == 2 and (runs.noise_multiplier == 2.5).all() and plan["noise_multiplier"] == 2.5
    assert (runs.epsilon_spent == plan["epsilon_spent"]).all()
    assert plan["selection"] == "fixed_noise" and plan["method"] == "dpgrid_example.fixed_noise.FixedNoise"
    statement = json.loads((out / "model" / "model.json").read_text())
    assert statement["privacy"]["selection"] == statement["privacy"]["method"] == "fixed_noise"
    assert "accounted by fixed_noise" in dpgrid("model", out).stdout
    assert dpgrid("tables", str(tmp_path / "results")).returncode == 0
    assert set(pd.read_csv(tmp_path / "results" / "tables" / "results.csv").selection) == {"fixed_noise"}
    # read back where the plugin is not installed: its recorded name and figures, never composition's name
    from dpgrid.reporting.tables import write_tables

    written = write_tables(tmp_path / "results", figures=False, out=tmp_path / "elsewhere", report=pytest.fail)
    assert written and set(pd.read_csv(tmp_path / "elsewhere" / "results.csv").selection) == {"fixed_noise"}


@pytest.mark.parametrize("overrides, message", [
    (["privacy.stoping=poisson"], "no setting 'privacy.stoping'; did you mean privacy.selection.stopping?"),
    (["privacy.selection.stopping_seed=2"], "privacy.selection.stopping_seed is a key of privacy.selection=random_stopping"
                                            " and privacy.selection=subsample_tuning; this grid's is privacy.selection=composition"),
    (["privacy.selection=random_stopping", "privacy.selection.stoping=poisson"], "did you mean privacy.selection.stopping?"),
    (["privacy.selection=random_stoping"], "no privacy.selection named 'random_stoping' (did you mean privacy.selection=random_stopping?)"),
])
def test_a_selection_key_set_where_it_is_not_read_is_named_with_its_owner(overrides, message):
    with pytest.raises(DpgridError, match=re.escape(message)):
        compose(overrides)


def test_the_older_spellings_set_the_same_keys():
    older = compile(compose(["privacy.selection=random_stopping", "privacy.stopping=poisson", "privacy.stopping_mean=4"]))
    newer = compile(compose(["privacy.selection=random_stopping", "privacy.selection.stopping=poisson",
                             "privacy.selection.stopping_mean=4"]))
    assert older.config_hash == newer.config_hash and older.plan == newer.plan
    assert newer.plan.record.stopping["rule"] == "poisson" and newer.plan.record.stopping["mean"] == 4


@pytest.mark.parametrize("overrides, message", [
    (["privacy.selection="], "no privacy.selection named ''; available: composition, random_stopping, subsample_tuning"),
    (["privacy.selection=[1,2]"], "privacy.selection takes one name"),
    (["privacy.selection._target_=nope.Class"], "privacy.selection=composition: cannot import _target_ nope.Class"),
    (["strategy._target_=nope.Class"], "strategy=online: cannot import _target_ nope.Class"),
    (["privacy.selection._target_=dpgrid.strategies.Online"], "is not a subclass of dpgrid.privacy.AccountingMethod"),
    (["privacy.selection.name=x"], "privacy.selection.name=x is not the name of its _target_"),
])
def test_a_broken_selection_is_one_line(overrides, message):
    from .command import dpgrid as run, one_line

    r = run("plan", *overrides)
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr


def _last_releases_method():
    """An accounting plugin written for the previous contract: it overrides `plan`, the hook now called `calibrate`."""
    from dpgrid.privacy.composition import Composition

    def plan(self, plan, strategy_cls, options, privacy, problem):  # asks for half the target
        return Composition.calibrate(self, plan, strategy_cls, options, {**privacy, "epsilon": privacy["epsilon"] / 2},
                                     problem)

    return type("HalfBudget", (Composition,), {"plan": plan, "name": "composition"})


HalfBudget = _last_releases_method()


def test_a_plugin_defining_a_hook_dpgrid_no_longer_calls_is_refused_naming_its_replacement():
    """Silently ignored, its `plan` would let the grid spend the full epsilon instead of the half it asks for."""
    with pytest.raises(DpgridError) as refused:
        compile(compose(["privacy.selection._target_=tests.test_plugin_accounting.HalfBudget"]))
    assert "HalfBudget defines `plan`, which dpgrid no longer calls: rename it `calibrate(" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_layer_rule_defining_a_renamed_hook_is_refused_when_registered(monkeypatch):
    from torch import nn

    from dpgrid.training.rules import LayerRule, register_rule

    monkeypatch.setattr(LayerRule, "_renamed_hooks", {"norms": "it is `sq_norms` now"}, raising=False)
    with pytest.raises(DpgridError, match=r"register_rule\(Bilinear\): Old defines `norms`, which dpgrid no longer "
                                          r"calls: it is `sq_norms` now"):
        register_rule(nn.Bilinear)(type("Old", (LayerRule,), {"norms": lambda self: None}))
