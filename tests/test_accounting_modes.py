"""privacy.budget, privacy.accountant and the Liu-Talwar cost (issue: accounting modes)."""

import functools
import math

import pytest

from dpgrid import DpgridError
from dpgrid.privacy import calibrate, epsilon_of, liu_talwar_parameters, pld_epsilon
from dpgrid.config import compile

from .conftest import load_cfg

Q, T = 512 / 60000, 1172


def plan(strategy="fixed_threshold", **overrides):
    cfg = load_cfg("mnist", strategy, **{"grid.k": 7, **overrides})
    return compile(cfg, 60000).plan  # validated, as `dpgrid plan` and `dpgrid run` make it


def test_per_run_and_per_grid_differ_exactly_by_the_k_fold_composition():
    grid, run = plan(), plan(**{"privacy.budget": "per_run"})
    assert grid.noise_multiplier == pytest.approx(calibrate(3, Q, 49 * T, 1e-5))
    assert run.noise_multiplier == pytest.approx(calibrate(3, Q, T, 1e-5))
    assert run.noise_multiplier == pytest.approx(0.837, abs=2e-3)  # docs/protocol.md's K = 1 figure
    # per_run: each run spends epsilon; the grid's true cost is the 49-fold composition of that nu
    assert run.epsilon_spent <= 3 and run.epsilon_per_run == run.epsilon_spent
    assert run.epsilon_grid == pytest.approx(epsilon_of("rdp", Q, run.noise_multiplier, 49 * T, 1e-5))
    assert run.epsilon_grid > 5 * 3
    # per_grid: the grid spends epsilon; one run of it spends far less
    assert grid.epsilon_grid == grid.epsilon_spent <= 3
    assert grid.epsilon_per_run == pytest.approx(epsilon_of("rdp", Q, grid.noise_multiplier, T, 1e-5))


@pytest.mark.slow  # PLD calibrations take seconds each
@pytest.mark.parametrize("accountant, expected_nu", [("pld", 1.285), ("prv", None)])
def test_tighter_accountants_reach_the_target_under_dp_accounting(accountant, expected_nu):
    p = plan("online", **{"privacy.accountant": accountant})  # K = 7
    rdp = plan("online")
    assert p.noise_multiplier < rdp.noise_multiplier  # less noise for the same guarantee
    if expected_nu:
        assert p.noise_multiplier == pytest.approx(expected_nu, abs=2e-3)  # issue's measurement
    assert p.epsilon_spent <= 3
    # dp-accounting's PLD, independently: the calibrated nu spends the target within 1 %
    assert pld_epsilon(Q, p.noise_multiplier, 7 * T, 1e-5) == pytest.approx(3, rel=0.01)


def test_liu_talwar_matches_theorem_1_by_hand():
    # K = 49, eps_f = 3, delta_f = 1e-5, delta_2 = 1e-20: gamma = 1/49, Upsilon = 49 ln(1e20)
    eps1, delta1, upsilon = liu_talwar_parameters(3.0, 1e-5, 49)
    assert upsilon == pytest.approx(49 * 20 * math.log(10))
    root = (1e-5 - 1e-20) / upsilon
    assert delta1 == pytest.approx(root ** 2 / 2)
    assert eps1 == pytest.approx(1 - root)
    # and back: the candidate's (eps1, delta1) give the final guarantee of Theorem 1
    assert 3 * eps1 + 3 * math.sqrt(2 * delta1) == pytest.approx(3.0)
    assert math.sqrt(2 * delta1) * upsilon + 1e-20 == pytest.approx(1e-5)
    # one candidate (gamma = 1): Upsilon = ln(1/delta_2)
    eps1, delta1, upsilon = liu_talwar_parameters(1.0, 1e-6, 1)
    assert upsilon == pytest.approx(math.log(1e20)) and eps1 == pytest.approx((1 - 3 * (1e-6 - 1e-20) / upsilon) / 3)


def test_plan_reports_liu_talwar_both_ways():
    small, large = plan("online"), plan("fixed_threshold")  # K = 7 and K = 49
    assert small.record.liu_talwar["noise_multiplier"] > small.noise_multiplier  # composition cheaper for few runs
    assert large.record.liu_talwar["noise_multiplier"] < large.noise_multiplier  # LT cheaper for many
    assert large.record.liu_talwar["epsilon_with_composition_nu"] < 3 < small.record.liu_talwar["epsilon_with_composition_nu"]


@pytest.mark.parametrize("key, value, message", [("privacy.budget", "per_epoch", "privacy.budget"),
                                                 ("privacy.accountant", "gdp", "privacy.accountant"),
                                                 ("privacy.selection", "liu_talwar", "no privacy.selection named 'liu_talwar'; available: composition, random_stopping")])
def test_invalid_modes_are_refused(key, value, message):
    with pytest.raises(DpgridError, match=message):
        plan(**{key: value})


def test_plan_compare_agrees_with_the_plan_it_compares(capsys, monkeypatch):
    """`dpgrid plan --compare`: every accountant is asked for the grid's K * T and one run's T compositions,
    and the rdp per_grid column is the plan's own nu. (That pld and prv need less noise is
    test_tighter_accountants_reach_the_target_under_dp_accounting; their calibrations take seconds each,
    so this test answers them with RDP's figure and checks what is asked and printed.)"""
    import dpgrid.privacy as privacy
    from dpgrid.reporting.describe import print_comparison

    cfg = load_cfg("digits", "online", **{"grid.k": 2, "train.epochs": 2})
    p = compile(cfg, 1437).plan  # K = 2, T = 23
    asked, rdp = [], functools.cache(calibrate)  # each accountant asks the same two questions

    def recording(epsilon, sample_rate, steps, delta, accountant="rdp"):  # the real RDP figure, scaled
        asked.append((accountant, steps))
        return rdp(epsilon, sample_rate, steps, delta) * {"rdp": 1, "pld": 0.9, "prv": 0.8}[accountant]

    monkeypatch.setattr(privacy, "calibrate", recording)
    print_comparison(p)
    out, err = capsys.readouterr()
    rows = {line.split()[0]: [float(v) for v in line.split()[1:3]] for line in out.splitlines()[1:]}
    assert err.splitlines() == [f"  ({a}: calibrating...)" for a in ("rdp", "pld", "prv")]  # said while it works
    assert all(line.endswith(" s)") for line in out.splitlines()[1:])  # each accountant's own time
    assert asked == [(a, runs * p.steps) for a in ("rdp", "pld", "prv") for runs in (p.composed_runs, 1)]
    assert rows["rdp"][0] == pytest.approx(p.noise_multiplier, abs=1e-4)
    assert rows["rdp"][1] == pytest.approx(rdp(3, p.sample_rate, p.steps, 1e-5), abs=1e-4)
    assert rows["rdp"][1] < rows["rdp"][0]  # one run needs less noise than the grid
    for accountant, factor in (("pld", 0.9), ("prv", 0.8)):  # each row prints its own accountant's answers
        assert rows[accountant] == pytest.approx([factor * nu for nu in rows["rdp"]], abs=1e-4)
