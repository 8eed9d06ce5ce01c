"""Random stopping accounted by privacy profiles (privacy.selection_accountant=profile): what it buys on the
paper's plans, the binomial rule, and what stays as it was. The bound itself is attacked in test_selection_toys."""


import numpy as np
import pytest

from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.privacy.random_stopping import parameters, selection_epsilon
from dpgrid.privacy.selection_profiles import PROFILE_GRID, CandidateProfile, selection_delta
from dpgrid.privacy.selection_profiles import selection_epsilon as profile_epsilon
from dpgrid.results.draws import draw_count

from .conftest import load_cfg

PROFILE = {"privacy.selection": "random_stopping", "privacy.selection_accountant": "profile",
           "privacy.accountant": "pld"}


@pytest.mark.slow  # 18 candidate profiles of thousands of steps
@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist", "ag_news"])
def test_the_profile_bound_is_tighter_than_renyi_on_the_papers_plans(dataset):
    """At the nu the RDP analysis calibrates for (eps, delta) = (3, 1e-5), with E[K] in {7, 25, 49} candidates of
    5 runs: the profile bound's epsilon is below the RDP one for the truncated negative binomial and Poisson."""
    from dpgrid.privacy.random_stopping import selection_noise

    plan = compile(load_cfg(dataset, "online", **{"privacy.selection": "random_stopping",
                                                  "privacy.stopping_mean": 7})).plan
    assert plan.record.epsilon_by_analysis["rdp"] == pytest.approx(plan.epsilon_spent)
    assert plan.record.epsilon_by_analysis["profile"] < plan.epsilon_spent
    steps = plan.seeds * plan.steps
    for mean in (7, 25, 49):
        for stopping in (parameters("truncated_negative_binomial", 0.0, mean, plan.delta),
                         parameters("poisson", 0.0, mean, plan.delta)):
            nu = selection_noise(plan.sample_rate, steps, 3.0, plan.delta, stopping, "rdp")
            rdp = selection_epsilon(plan.sample_rate, nu, steps, plan.delta, stopping)
            profile = profile_epsilon(plan.sample_rate, nu, steps, plan.delta, stopping)
            assert profile < rdp <= 3, (dataset, mean, stopping["rule"], profile, rdp)


def test_the_selection_epsilon_is_where_the_delta_bound_meets_delta():
    """selection_epsilon's closed form eps_M(delta / E[K]) + min log R and selection_delta agree, to the profile
    grid's step: the closed form reads eps_M exactly, selection_delta reads delta_M at the grid point below."""
    profile = CandidateProfile(0.09, 5.0, 225)
    stopping = parameters("truncated_negative_binomial", 0.0, 7, 1e-5)
    epsilon = profile_epsilon(0.09, 5.0, 225, 1e-5, stopping)
    step = PROFILE_GRID[1] - PROFILE_GRID[0]
    assert selection_delta(profile.delta, stopping, epsilon + step) <= 1e-5 < selection_delta(
        profile.delta, stopping, epsilon - 2 * step)


@pytest.mark.slow  # a profile calibration on digits: 15 s
def test_a_profile_plan_needs_less_noise_and_records_both_analyses():
    rdp = compile(load_cfg("digits", "online", **{"privacy.selection": "random_stopping"})).plan
    profile = compile(load_cfg("digits", "online", **PROFILE)).plan
    assert (rdp.record.selection_accountant, profile.record.selection_accountant) == ("rdp", "profile")
    assert profile.noise_multiplier < rdp.noise_multiplier
    assert profile.epsilon_spent == pytest.approx(profile.record.epsilon_by_analysis["profile"])
    assert profile.epsilon_spent <= 3
    assert profile.record.epsilon_by_analysis["rdp"] > 3  # the RDP analysis would not cover this nu
    assert set(rdp.record.epsilon_by_analysis) == {"rdp", "profile"}


@pytest.mark.slow  # a profile calibration on digits
def test_binomial_candidates_follow_their_distribution():
    stopping = parameters("binomial", 0.0, 7, 1e-5, rounds=14)
    draws = [draw_count(stopping, u) for u in (np.arange(20000) + 0.5) / 20000]
    assert np.mean(draws) == pytest.approx(7, rel=1e-3) and np.var(draws) == pytest.approx(14 * 0.5 * 0.5, rel=1e-2)
    assert min(draws) == 0 and max(draws) <= 14
    plan = compile(load_cfg("digits", "online", **PROFILE, **{"privacy.stopping": "binomial",
                                                               "privacy.stopping_rounds": 14})).plan
    assert plan.record.stopping == {"rule": "binomial", "mean": 7.0, "rounds": 14, "p": 0.5}
    assert set(plan.record.epsilon_by_analysis) == {"profile"} and plan.epsilon_spent <= 3


@pytest.mark.parametrize("settings, message", [
    ({"privacy.stopping": "binomial"}, "privacy.selection.stopping=binomial is not covered by privacy.selection.selection_accountant=rdp"),
    ({**PROFILE, "privacy.stopping": "binomial"}, "privacy.selection.stopping=binomial needs privacy.selection.stopping_rounds"),
    ({**PROFILE, "privacy.stopping": "binomial", "privacy.selection.stopping_rounds": 7},
     "privacy.selection.stopping_rounds must be a whole number > the expected number of candidates 7"),
    ({**PROFILE, "privacy.accountant": "rdp"}, "privacy.selection.selection_accountant=profile needs privacy.accountant=pld"),
    ({**PROFILE, "privacy.stopping": "liu_talwar"}, "privacy.selection.stopping=liu_talwar is not covered by"),
    ({**PROFILE, "privacy.selection_accountant": "exact"}, "privacy.selection.selection_accountant must be one of"),
])
def test_bad_profile_settings_are_one_line(settings, message):
    with pytest.raises(DpgridError, match=message) as refused:
        compile(load_cfg("digits", "online", **{"privacy.selection": "random_stopping", **settings}))
    assert "\n" not in str(refused.value)


def test_the_new_settings_leave_every_existing_grid_its_hash():
    """Added keys at their defaults are not hashed: grids made before them keep their config hash."""
    from dpgrid.config import settings_of
    from dpgrid.config.identity import config_hash

    for overrides in ({}, {"privacy.selection": "random_stopping"}):
        plain = settings_of(load_cfg("digits", "online", **overrides))
        older = {**plain, "privacy": {k: v for k, v in plain["privacy"].items()
                                      if k not in ("selection_accountant", "stopping_rounds")}}
        assert config_hash(plain) == config_hash(older)
    profile = settings_of(load_cfg("digits", "online", **PROFILE))
    assert config_hash(profile) != config_hash(settings_of(load_cfg("digits", "online", **{
        "privacy.selection": "random_stopping", "privacy.accountant": "pld"})))


def test_plan_compare_shows_random_stopping_under_both_analyses(capsys, monkeypatch):
    """`dpgrid plan --compare`: per stopping rule, nu under the Renyi analysis and the profile bound ('-' where an
    analysis does not cover the rule), each from its own calibration. (The calibrations take seconds each and
    are the plans' own, tested above; here each is answered with a figure naming its question.)"""
    import dpgrid.privacy.random_stopping as random_stopping
    from dpgrid.reporting.describe import print_selection_comparison

    plan = compile(load_cfg("digits", "online", **{"grid.k": 2, "train.epochs": 2}), 1437).plan
    asked = []
    figure = {("truncated_negative_binomial", "rdp"): 1.5, ("truncated_negative_binomial", "profile"): 1.25,
              ("poisson", "rdp"): 2.5, ("poisson", "profile"): 2.25, ("binomial", "profile"): 3.25}

    def answer(sample_rate, steps, epsilon, delta, stopping, analysis="rdp"):
        asked.append((stopping["rule"], analysis, steps, stopping["mean"], stopping.get("rounds")))
        return figure[stopping["rule"], analysis]

    monkeypatch.setattr(random_stopping, "selection_noise", answer)
    print_selection_comparison(plan)
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"  ({rule}: calibrating...)" for rule in ("truncated_negative_binomial", "poisson",
                                                                            "binomial")]
    steps = plan.seeds * plan.steps
    assert [a[:3] for a in asked] == [(rule, analysis, steps) for rule, analysis in figure]
    assert all(a[3] == 2 for a in asked) and asked[-1][4] == 4  # E[K] = K = 2; the binomial's 2 K rounds
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [row[-4:-2] for row in rows] == [["1.5000", "1.2500"], ["2.5000", "2.2500"], ["-", "3.2500"]]
    assert [row[0] for row in rows] == ["truncated", "poisson", "binomial"] and all(row[-1] == "s)" for row in rows)
