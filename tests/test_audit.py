"""`dpgrid audit`: the one-run bound (dpgrid.audit.bound) against exact toys, and the audit of whole grids: strategies
that forget the noise, add a tenth of it or never clip are caught (a lower bound above their claimed epsilon); the
built-in strategies are not.

Confidence: every bound is stated at 95%. The toys' seeds are fixed, so each outcome is one draw, the same on every
run; the Monte Carlo checks bound the fraction of repetitions in which the bound exceeds the truth, which the theorem
keeps below 5% (a fixed-seed draw of 400 repetitions: at most 5% + 3 standard errors). The grids' audits are single
draws too (fixed --seed): a built-in strategy passes with probability >= 95% for any seed, a broken one is caught by
a margin (the bound, its claim) printed in the assertion."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpgrid.audit.bound import audit_scores, epsilon_lower_bound, fdp_epsilon, fdp_scores, p_value

from .command import dpgrid as run_dpgrid, one_line
from .conftest import ROOT

AUDITED = ROOT / "tests" / "audited"


def test_the_p_value_is_the_binomial_tail_at_delta_0_and_grows_with_delta():
    from scipy.stats import binom

    assert p_value(100, 20, 15, 1.0, 0.0) == pytest.approx(binom.sf(14, 20, math.e / (1 + math.e)), rel=1e-12)
    assert p_value(100, 20, 15, 1.0, 1e-3) > p_value(100, 20, 15, 1.0, 0.0)
    assert p_value(100, 20, 15, 2.0, 0.0) > p_value(100, 20, 15, 1.0, 0.0)  # a larger epsilon explains more


def test_the_binomial_tail_is_scipys_at_every_count_in_and_out_of_range():
    from scipy.stats import binom

    from dpgrid.audit.bound import binomial_tail

    rng = np.random.default_rng(0)
    for _ in range(200):
        n, p = int(rng.integers(1, 5000)), float(rng.uniform(0.001, 0.999))
        k = np.concatenate([[-3, -1, 0, n - 1, n, n + 2], rng.integers(0, n, 30)])
        # below 1e-250 the two special functions underflow at different points: nothing any significance can see
        assert np.allclose(binomial_tail(k, n, p), binom.sf(k, n, p), rtol=1e-9, atol=1e-250), (n, p)


def test_chance_level_guessing_bounds_nothing_and_perfect_guessing_a_lot():
    assert epsilon_lower_bound(1000, 200, 100, 1e-5, 0.05) == 0.0
    perfect = epsilon_lower_bound(1000, 200, 200, 0.0, 0.05)
    # every guess right: the epsilon at which p^200 = 0.05, p = e^eps / (1 + e^eps)
    assert perfect == pytest.approx(math.log(0.05 ** (1 / 200) / (1 - 0.05 ** (1 / 200))), rel=1e-5)


def test_randomised_response_is_never_overstated_more_often_than_the_confidence_allows():
    """Each canary released by randomised response at epsilon0 (pure DP, exact): the guesses are the responses, W is
    exactly Binomial(r, e^eps0 / (1 + e^eps0)); the 95% bound exceeds epsilon0 in at most 5% of repetitions."""
    rng = np.random.default_rng(0)
    m, eps0, reps = 400, 1.0, 400
    over = 0
    for _ in range(reps):
        coins = rng.integers(0, 2, m).astype(bool)
        truthful = rng.random(m) < math.exp(eps0) / (1 + math.exp(eps0))
        scores = np.where(coins == truthful, 1.0, -1.0) + rng.random(m) * 1e-3  # ties broken at random
        over += audit_scores(scores, coins, 0.0, 0.95)["epsilon_lower_bound"] > eps0
    assert over / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), over


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The Gaussian mechanism's epsilon at delta, sensitivity mu in units of its noise: dp_accounting's."""
    import dp_accounting

    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("mu", [1.0, pytest.param(3.0, marks=pytest.mark.slow)])  # 60 audits of 2,000 canaries each
def test_gaussian_canaries_are_bounded_by_the_gaussian_mechanisms_own_epsilon(mu):
    """Each canary a Gaussian mechanism (score N(mu, 1) when in, N(0, 1) when out): the bound stays below the true
    epsilon(delta) in >= 95% of repetitions, and recovers a good part of what one run can show: the truth, or where
    that is beyond the method's ceiling at m canaries (every guess right), the ceiling."""
    rng = np.random.default_rng(1)
    delta, m, reps = 1e-5, 2000, 60
    truth = gaussian_epsilon(mu, delta)
    bounds = []
    for _ in range(reps):
        coins = rng.integers(0, 2, m).astype(bool)
        bounds.append(audit_scores(rng.normal(mu * coins, 1.0), coins, delta, 0.95)["epsilon_lower_bound"])
    bounds = np.array(bounds)
    assert (bounds > truth).mean() <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), (bounds.max(), truth)
    ceiling = audit_scores(coins.astype(float), coins, delta, 0.95)["epsilon_lower_bound"]
    assert np.median(bounds) > 0.3 * min(truth, ceiling), (np.median(bounds), truth, ceiling)


def reference_auditing():
    """jax_privacy's auditing module (Google DeepMind's, the reference implementation), loaded from its file without
    the package (which needs jax): it imports dp_accounting, numpy and scipy only. None where it is not installed
    (pip install --no-deps jax-privacy==2.0.0 to run the comparison)."""
    import importlib.util
    import sys

    found = importlib.util.find_spec("jax_privacy")
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(found.submodule_search_locations[0]) / "auditing.py"
    spec = importlib.util.spec_from_file_location("reference_auditing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference_auditing"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("m, k, v, delta, significance", [
    (1000, 100, 80, 1e-5, 0.05 / 6), (1000, 500, 300, 1e-5, 0.05 / 6), (2000, 20, 20, 1e-5, 0.05),
    (500, 250, 140, 1e-5, 0.01), (1000, 250, 240, 1e-6, 0.05 / 6), (100, 50, 45, 1e-3, 0.05)])
def test_the_fdp_estimate_is_jax_privacys_term_by_term(m, k, v, delta, significance):
    reference = reference_auditing()
    if reference is None:
        pytest.skip("jax_privacy is not installed (pip install --no-deps jax-privacy==2.0.0)")
    assert fdp_epsilon(m, k, v, delta, significance) == pytest.approx(
        reference._epsilon_one_run_fdp(0, m, k, v, significance, delta), abs=2e-6)


@pytest.mark.parametrize("epsilon, delta", [(0.0, 1e-5), (0.5, 1e-5), (1.0, 1e-6), (4.0, 1e-5), (10.0, 1e-9), (30.0, 1e-5)])
def test_the_gaussian_mechanisms_mu_is_dp_accountings(epsilon, delta):
    from dp_accounting import get_sigma_gaussian

    from dpgrid.audit.bound import gaussian_mu

    assert gaussian_mu(epsilon, delta) == pytest.approx(1 / get_sigma_gaussian(epsilon, delta), rel=1e-8)


def test_the_fdp_estimate_stays_below_a_gaussian_mechanisms_epsilon_and_shows_more_of_it():
    """Each canary a Gaussian mechanism (score N(mu, 1) in, N(0, 1) out): a mu-GDP mechanism, for which the f-DP
    estimate is a lower bound. It stays below the true epsilon(delta) in >= 95% of repetitions, never falls below
    zero, and its median is above the Steinke et al. bound's on the same scores."""
    rng = np.random.default_rng(2)
    delta, m, reps, mu = 1e-5, 1000, 30, 1.5
    truth = gaussian_epsilon(mu, delta)
    fdp, steinke = [], []
    for _ in range(reps):
        coins = rng.integers(0, 2, m).astype(bool)
        scores = rng.normal(mu * coins, 1.0)
        fdp.append(fdp_scores(scores, coins, delta, 0.95)["epsilon_lower_bound"])
        steinke.append(audit_scores(scores, coins, delta, 0.95)["epsilon_lower_bound"])
    fdp, steinke = np.array(fdp), np.array(steinke)
    assert (fdp > truth).mean() <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), (fdp.max(), truth)
    assert np.median(fdp) > np.median(steinke) > 0, (np.median(fdp), np.median(steinke))


def audit(tmp_path, strategy, *extra, epsilon=1, canaries=500, seed=1, epochs=5, exit_code=0):
    """`dpgrid audit` of a k = 2 grid of `strategy` (tests/audited's plugins too); canaries=None: the default count."""
    out = tmp_path / strategy
    count = ["--canaries", canaries] if canaries is not None else []
    r = run_dpgrid("audit", f"strategy={strategy}", "grid.k=2", "train.seeds=1", f"train.epochs={epochs}",
                   f"privacy.epsilon={epsilon}", *count, "--seed", seed, f"hydra.run.dir={out}",
                   f"hydra.searchpath=[file://{AUDITED / 'conf'}]", *extra, path=[AUDITED])
    assert r.returncode == exit_code, r.stderr
    return json.loads((out / "audit.json").read_text()), r


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["no_noise", "tenth_noise", "no_clip"])
def test_a_strategy_that_does_not_earn_its_epsilon_is_caught(tmp_path, strategy):
    found, r = audit(tmp_path, strategy, exit_code=1)
    assert found["epsilon_lower_bound"] > found["epsilon_claimed"], found
    assert "the claim is falsified at 95% confidence" in r.stderr
    assert found["mechanism"]["verdict"] == "differs"


@pytest.mark.slow
@pytest.mark.parametrize("strategy, overrides, flagged", [
    ("scaled_noise", ["strategy.noise_scale=0.8"], {"noise_multiplier"}),
    ("scaled_noise", ["strategy.noise_scale=0.5"], {"noise_multiplier"}),
    ("loose_clip", ["strategy.clip_scale=1.25"], {"noise_multiplier", "sensitivity"}),
    ("loose_clip", ["strategy.clip_scale=2"], {"noise_multiplier", "sensitivity"}),
    ("reused_noise", [], {"independent"}),
    ("echoed_batch", [], {"canary_sampling"}),
])
def test_the_mechanism_test_catches_the_bugs_plugins_make(tmp_path, strategy, overrides, flagged):
    """Bugs the one-run bound cannot see (it stays far below the claim): each exits 1 with one line naming it."""
    found, r = audit(tmp_path, strategy, *overrides, epsilon=4, canaries=1000, seed=0, epochs=10, exit_code=1)
    tests = found["mechanism"]["tests"]
    assert flagged <= {name for name, t in tests.items() if t["verdict"] == "differs"}, tests
    assert found["epsilon_lower_bound"] <= found["epsilon_claimed"]  # the bound alone passes them
    assert "mechanism differs from the plan at 95% confidence: " in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 10])
@pytest.mark.parametrize("strategy, flagged", [("fixed_size_batches", {"batch_sizes"}),
                                               ("shuffled_batches", {"batch_sizes", "overlap"})])
def test_batches_of_a_fixed_size_or_shuffled_are_caught_at_the_default_settings(tmp_path, strategy, flagged, epochs):
    """A plugin that draws round(q N) examples a step (afresh, or one permutation per epoch cut into batches) while
    claiming Poisson sampling: the mean rate is q, as planned; the spread of the sizes (none) and, shuffled, the
    overlap of consecutive batches (none within an epoch) are not. The default audit (1,000 canaries, 95%)."""
    found, r = audit(tmp_path, strategy, canaries=None, seed=0, epochs=epochs, exit_code=1)
    tests = found["mechanism"]["tests"]
    assert found["canaries"] == 1000 and found["confidence"] == 0.95
    assert flagged <= {name for name, t in tests.items() if t["verdict"] == "differs"}, tests
    assert tests["sampling"]["verdict"] == "as planned" and tests["batch_sizes"]["estimate"] < 0.01
    assert "the batch sizes varied 0x as much as Poisson batches'" in r.stdout.splitlines()[-2]  # before the verdict
    # the plugin's sampler served its own run only: this process samples honestly again
    honest, _ = audit(tmp_path / "after", "fixed_threshold", epochs=1, canaries=100)
    assert honest["mechanism"]["tests"]["batch_sizes"]["verdict"] == "as planned", honest["mechanism"]["tests"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fixed_threshold", "online", "fixed_quantile", "adamwosm", "dpadam"])
def test_the_built_in_strategies_are_not(tmp_path, strategy):
    found, r = audit(tmp_path, strategy)
    assert found["epsilon_lower_bound"] <= found["epsilon_claimed"], found
    assert found["epsilon_fdp"]["epsilon_lower_bound"] <= found["epsilon_claimed"], found
    assert found["mechanism"]["verdict"] == "as planned", found["mechanism"]
    assert {"epsilon_lower_bound", "epsilon_claimed", "confidence", "canaries", "threat_model"} <= set(found)
    assert {"sampling", "batch_sizes", "overlap"} <= set(found["mechanism"]["tests"])
    assert r.stdout.startswith("audit (white-box, 500 canaries, 1 released of ")
    assert "mechanism as planned at 95% confidence" in r.stdout or "only its sampling is measured" in r.stdout


@pytest.mark.slow
def test_a_selection_is_audited_on_its_chosen_candidate_and_the_black_box_on_the_released_model(tmp_path):
    import pandas as pd

    # (online's k = 2 selection draws the same configuration twice here and releases the second draw: a candidate
    # whose run seed is not its model's index, the case that names the run by runs.csv, not by model.json)
    found, _ = audit(tmp_path, "online", "privacy.selection=random_stopping", epochs=10, canaries=200, seed=0)
    assert found["selection"] == "random_stopping" and len(found["released_runs"]) == 1
    assert found["epsilon_lower_bound"] <= found["epsilon_claimed"]
    runs = pd.read_csv(tmp_path / "online" / "grid" / "runs.csv")
    chosen = json.loads((tmp_path / "online" / "grid" / "selection.json").read_text())["chosen"]["config_id"]
    assert found["released_runs"][0].split(" seed ")[0] == chosen
    assert int(found["released_runs"][0].split(" seed ")[1]) in set(runs[runs.config_id == chosen].seed)
    black, _ = audit(tmp_path / "black", "no_noise", "--threat", "black_box", canaries=100)
    assert black["threat_model"] == "black_box" and black["epsilon_lower_bound"] >= 0 and black["mechanism"] is None
    # the grid is planned for the data's N, whatever the coins put in (q, nu and N do not tell them)
    plan = json.loads((tmp_path / "black" / "no_noise" / "grid" / "plan.json").read_text())
    assert plan["n_train"] == 1437 and black["included"] > 0


@pytest.mark.slow
def test_the_audit_writes_only_its_own_directory(tmp_path):
    run = tmp_path / "run"
    r = run_dpgrid("run", "grid.k=2", "train.seeds=1", "train.epochs=1", f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stderr
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    refused = run_dpgrid("audit", "grid.k=2", f"hydra.run.dir={run}", "--seed", 1)
    assert refused.returncode == 2 and one_line(refused.stderr) and "not an audit's" in refused.stderr
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before


@pytest.mark.slow
def test_an_unfinished_audit_beside_a_grid_it_did_not_trace_is_one_line(tmp_path):
    """The same command resumes an unfinished audit (its marker, no audit.json); where the grid beside the marker holds
    runs this audit left no trace of (a grid of `dpgrid run`, or of an earlier dpgrid's audit), it is refused in one
    line saying what the directory holds and what to do, and nothing there is touched."""
    args = ["grid.k=2", "train.seeds=1", "train.epochs=1", "--canaries", 100, "--seed", 3, f"hydra.run.dir={tmp_path}"]
    assert run_dpgrid("audit", *args).returncode == 0
    (tmp_path / "audit.json").unlink()
    resumed = run_dpgrid("audit", *args)  # stopped after its grid: the same command ends it
    assert resumed.returncode == 0 and (tmp_path / "audit.json").exists(), resumed.stderr
    (tmp_path / "audit.json").unlink()
    steps = sorted((tmp_path / "grid" / "audit").glob("*_steps.npz"))[0]
    with np.load(steps) as trace:  # an earlier dpgrid's trace: no overlaps
        np.savez_compressed(steps, **{k: trace[k] for k in trace.files if k != "overlaps"})
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    refused = run_dpgrid("audit", *args)
    assert refused.returncode == 2 and one_line(refused.stderr), refused.stderr
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    assert "holds an unfinished audit" in refused.stderr and "overlaps missing" in refused.stderr
    assert "pass overwrite=true" in refused.stderr
    for trace in (tmp_path / "grid" / "audit").iterdir():  # the grid of a run that was not audited
        trace.unlink()
    refused = run_dpgrid("audit", *args)
    assert refused.returncode == 2 and one_line(refused.stderr) and "has no trace of it" in refused.stderr
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == \
        {p: t for p, t in before.items() if p.is_file()}  # but the traces this test removed
    assert run_dpgrid("audit", *args, "overwrite=true").returncode == 0  # what the line says to do


@pytest.mark.parametrize("args, message", [
    (["--canaries", "5"], "--canaries must be at least 20"),
    (["--seed", "-1"], "--seed must be a whole number >= 0, got -1"),
    (["--seed", "one"], "--seed must be int, got 'one'"),
    (["--threat", "grey"], "--threat must be one of white_box, black_box"),
    (["--confidence", "1.5"], "--confidence must be in [0.5, 1)"),
    (["--seeds", "3"], "unknown option --seeds"),
    (["dataset=iris", "strategy=pur"], "dpgrid audit audits DP-SGD grids"),
])
def test_bad_audit_options_are_one_line(tmp_path, args, message):
    r = run_dpgrid("audit", *args, f"hydra.run.dir={tmp_path / 'a'}")
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()


def test_the_canaries_trace_each_steps_batch_size_and_overlap(tmp_path):
    """GradientCanaries keeps what the sampler drew (each step's real batch size and how many of its examples the step
    before's batch held too), as the mechanism test reads it back (RunSteps); a step the strategy refused is not
    kept."""
    import torch

    from dpgrid.audit.canaries import AuditSpec, GradientCanaries, draw_coins
    from dpgrid.audit.mechanism import RunSteps
    from dpgrid.training.persample import PerSampleGrads

    class Engine:  # the real examples' gradients do not matter here
        def gradients(self, data, indices):
            b = len(indices[0])
            return PerSampleGrads(b, lambda: torch.ones(b), lambda w: [torch.zeros(len(w), 1)])

    class Strategy:
        finished = False

        def run_state(self, run=0):
            return [], 1.0, 0.1

        def linear_step(self):
            return 0.0, 0.1

    coins = draw_coins(40, 0)
    watched = GradientCanaries(Engine(), AuditSpec("white_box", 40, coins, 0, 0.1), ("c", 0), torch.zeros(1))
    strategy = Strategy()
    drawn = [[0, 1, 2, 5], [1, 5, 7], [], [3, 7], [7, 3, 9]]
    for step, batch in enumerate(drawn, 1):
        strategy.finished = step == len(drawn)  # the last step refused: its budget would be exceeded
        watched.gradients(None, [torch.tensor(batch, dtype=torch.int64)])
        watched.before_step(step, strategy)
        watched.after_step(step, strategy)
    watched.finish(tmp_path, "c", 0)
    run = RunSteps.load(tmp_path / "audit" / "c_seed0_steps.npz", coins, 1.0)
    assert run.batch_sizes.tolist() == [4, 3, 0, 2] and run.overlaps.tolist() == [0, 2, 0, 0]
    assert len(run.moves) == len(run.joins) == len(run.stated) == 4
