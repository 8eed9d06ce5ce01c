"""One neighbouring relation, the same everywhere: zero-out (one training example replaced by a null example that
contributes nothing to any sum or count; N public). Its exact privacy curve on a toy is the add-or-remove curve the
accountants compute at the same sampling rate (checked against dp-accounting, which dpgrid did not write), not the
replace-one curve; and every accounting method, model.json, `dpgrid plan`, the tables' captions and the guarantees
page state it in the same words."""

import json
import math
from pathlib import Path

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from dpgrid.privacy import ACCOUNTING
from dpgrid.privacy.accountants import epsilon_of
from dpgrid.privacy.method import ZERO_OUT, ZERO_OUT_WORDS

ROOT = Path(__file__).resolve().parents[1]


def zero_out_delta(epsilon: float, q: float, sigma: float) -> float:
    """The exact delta(epsilon) of one Poisson-sampled Gaussian sum step on the zero-out pair, both directions.

    Every other example null (the worst case: any other examples add the same independent sum to both outputs,
    post-processing), a clipped example of norm 1 gives P = (1-q) N(0, s^2) + q N(1, s^2), the null one Q = N(0, s^2).
    The privacy loss log(P/Q)(x) = log(1 - q + q exp((2x - 1) / (2 s^2))) grows with x, so each hockey-stick
    divergence is a tail of normal distributions, computed in closed form."""
    s2 = sigma * sigma
    tail = lambda x, mean: norm.sf((x - mean) / sigma)  # noqa: E731
    x = s2 * math.log((math.exp(epsilon) - (1 - q)) / q) + 0.5  # P > e^eps Q beyond x
    with_example = (1 - q) * tail(x, 0) + q * tail(x, 1) - math.exp(epsilon) * tail(x, 0)
    without = 0.0
    if math.exp(-epsilon) > 1 - q:  # Q > e^eps P below y
        y = s2 * math.log((math.exp(-epsilon) - (1 - q)) / q) + 0.5
        without = norm.cdf(y / sigma) - math.exp(epsilon) * ((1 - q) * norm.cdf(y / sigma) + q * norm.cdf((y - 1) / sigma))
    return max(with_example, without)


def exact_epsilon(delta: float, q: float, sigma: float) -> float:
    return brentq(lambda e: zero_out_delta(e, q, sigma) - delta, 1e-6, 50, xtol=1e-10)


def dp_accounting_epsilon(delta: float, q: float, sigma: float, relation: str) -> float:
    from dp_accounting import dp_event
    from dp_accounting import privacy_accountant
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=getattr(privacy_accountant.NeighboringRelation, relation),
        value_discretization_interval=1e-4)
    accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), 1)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("q, sigma, delta", [(0.1, 1.0, 1e-5), (0.01, 0.8, 1e-6), (0.25, 2.0, 1e-5)])
def test_the_zero_out_curve_is_the_add_or_remove_curve_the_accountants_compute(q, sigma, delta):
    exact = exact_epsilon(delta, q, sigma)
    add_or_remove = dp_accounting_epsilon(delta, q, sigma, "ADD_OR_REMOVE_ONE")
    assert add_or_remove == pytest.approx(exact, rel=2e-3)
    # another relation, another curve: replace-one's lies further from the exact zero-out curve than the accountant's
    # own discretisation error, so the comparison tells the two relations apart
    assert dp_accounting_epsilon(delta, q, sigma, "REPLACE_ONE") - exact > 3 * abs(add_or_remove - exact)
    assert epsilon_of("pld", q, sigma, 1, delta) == pytest.approx(exact, rel=1e-2, abs=1e-2)
    assert epsilon_of("rdp", q, sigma, 1, delta) >= exact  # Opacus's RDP: an upper bound on the same curve


def test_every_accounting_method_states_zero_out_in_one_wording():
    assert ACCOUNTING, "the accounting methods are registered"
    for name, method in ACCOUNTING.items():
        assert method.adjacency.name == "zero-out" and method.adjacency.words == ZERO_OUT_WORDS, name
        assert method.adjacency.public == ZERO_OUT.public, name


def test_model_json_plan_tables_and_the_guarantees_page_say_the_same(tmp_path, capsys):
    from dpgrid.api import tables
    from dpgrid.config import compile
    from dpgrid.reporting.describe import print_plan

    from .conftest import load_cfg, trained_grid

    spec, out = trained_grid(tmp_path / "results" / "grid", "fixed_threshold", **{"grid.k": 2, "train.seeds": 1,
                                                                                   "train.epochs": 1})
    statement = json.loads((out / "model" / "model.json").read_text())
    assert statement["privacy"]["adjacency"] == ZERO_OUT.to_dict()
    assert statement["n_train"] == spec.plan.n_train  # public under zero-out, and stated so
    print_plan(compile(load_cfg("digits", "fixed_threshold", **{"grid.k": 2})), False, 0.0)
    assert f"neighbouring datasets: {ZERO_OUT_WORDS}" in capsys.readouterr().out
    written = tables(str(tmp_path / "results"), figures=False, report=lambda line: None)
    markdown = [Path(p).read_text() for p in written if str(p).endswith(".md")]
    assert markdown and all(ZERO_OUT_WORDS in text for text in markdown)
    guarantees = " ".join((ROOT / "docs" / "guarantees.md").read_text().split())
    assert ZERO_OUT_WORDS in guarantees and ZERO_OUT.public in guarantees
