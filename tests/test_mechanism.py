"""The mechanism test (dpgrid.audit.mechanism) against exact toys: runs simulated step by step as the accountant
assumes them (Gaussian noise nu C_t on the sum, every canary's contribution C_t, joins at rate q, heavy ball or Adam's
first moment, adaptive C_t and learning rate), and the same runs with one assumption broken the way plugins break it.
The honest toy passes in at least 95% of repetitions (the stated confidence); each broken one is flagged by the test
that names its bug. Whole audits of real plugins: tests/test_audit.py."""

import math

import numpy as np
import pytest

from dpgrid.audit.mechanism import RunSteps, measure, overlap_test, size_test, summary_line
from dpgrid.strategies import AdamWOSM, DPAdam, FixedQuantile, FixedThreshold, Online

N, B, M, T = 2000, 100, 300, 80  # training set, expected batch, canaries, steps
Q = B / N


def batches(rng, sampler: str = "poisson") -> tuple:
    """(b_t, o_t): the sizes of T batches of the N real examples and how many of each the batch before held too, drawn
    as `sampler` draws them: poisson (each example in with probability q, afresh each step: the accountant's), fixed
    (exactly B = q N without replacement, afresh each step), shuffled (a permutation per epoch cut into batches of
    B), or poisson_sizes (binomial sizes, but the members taken in turn from a permutation per epoch: the sizes of
    Poisson batches, none of their overlap)."""
    if sampler == "poisson":
        member = rng.random((T, N), dtype=np.float32) < Q
    else:
        member = np.zeros((T, N), dtype=bool)
        sizes = rng.binomial(N, Q, T) if sampler == "poisson_sizes" else np.full(T, B)
        order, at = rng.permutation(N), 0
        for t, size in enumerate(sizes):
            if sampler == "fixed" or at + size > N:
                order, at = rng.permutation(N), 0
            member[t, order[at:at + size]] = True
            at += size
    return member.sum(1), np.concatenate([[0], (member[1:] & member[:-1]).sum(1)])


def simulated(rng, nu=2.0, noise_scale=1.0, clip_scale=1.0, mu=0.9, reused=False, echoed=False, laplace=False,
              included=None, adapt=True, sampler="poisson") -> RunSteps:
    """One run's steps as GradientCanaries records them, from the linear update of Strategy.linear_step: moves
    d_t = -a_t v_t, v_t = mu v_{t-1} + (sum + noise) / B over m canary and m control coordinates."""
    included = rng.random(M) < 0.5 if included is None else included
    clips = np.exp(np.cumsum(rng.normal(0, 0.05, T))) if adapt else np.ones(T)  # an adaptive C_t
    rates = 0.1 * np.exp(np.cumsum(rng.normal(0, 0.05, T))) if adapt else np.full(T, 0.1)  # and learning rate
    joins = (rng.random((T, M)) < Q) & included
    v, moves, once, previous = np.zeros(2 * M), [], None, np.zeros(2 * M)
    for t in range(T):
        total = np.zeros(2 * M)
        total[:M] = joins[t] * clip_scale * clips[t]
        if laplace:
            z = rng.laplace(0, 1 / math.sqrt(2), 2 * M)
        else:
            z = rng.normal(0, 1, 2 * M) if once is None or not reused else once
        once = z
        g = (total + (previous if echoed else 0) + noise_scale * nu * clips[t] * z) / B
        previous = total
        v = mu * v + g
        moves.append(-rates[t] * v)
    stated = np.column_stack([clips, np.full(T, mu), rates])
    return RunSteps(np.array(moves, dtype=np.float32), joins, *batches(rng, sampler), stated, included, nu)


def verdicts(runs, strategy=FixedThreshold, queries=None) -> dict:
    found = measure(runs, N, B, Q, 0.95, strategy, queries or {})
    return found, {name: t["verdict"] for name, t in found["tests"].items()}


def test_an_honest_mechanism_is_as_planned_in_at_least_the_stated_share_of_repetitions():
    """Each repetition: 2 runs (an adaptive threshold and learning rate, heavy ball 0.9) measured at 95%. The share
    of repetitions that say "differs" stays below 5% (plus three standard errors)."""
    rng = np.random.default_rng(0)
    reps, alarms, ratios = 120, 0, []
    for _ in range(reps):
        found, _ = verdicts([simulated(rng), simulated(rng)])
        alarms += found["verdict"] == "differs"
        ratios.append(found["tests"]["noise_multiplier"]["estimate"])
    assert alarms / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), alarms
    assert np.median(ratios) == pytest.approx(1.0, abs=0.02)  # the estimator is centred on the truth


@pytest.mark.parametrize("bug, flagged", [
    (dict(noise_scale=0.8), {"noise_multiplier"}),
    (dict(noise_scale=0.5), {"noise_multiplier"}),
    (dict(clip_scale=1.25), {"noise_multiplier", "sensitivity"}),
    (dict(clip_scale=2.0), {"noise_multiplier", "sensitivity"}),
    (dict(reused=True), {"independent"}),
    (dict(echoed=True), {"canary_sampling"}),
    (dict(laplace=True), {"gaussian"}),
    (dict(noise_scale=0.0), {"noise_multiplier"}),  # no noise at all: the controls never move
])
def test_each_broken_assumption_is_flagged_by_its_own_test(bug, flagged):
    rng = np.random.default_rng(1)
    found, said = verdicts([simulated(rng, **bug), simulated(rng, **bug)])
    assert found["verdict"] == "differs"
    assert flagged <= {name for name, v in said.items() if v == "differs"}, said
    line = summary_line(found)
    assert line.startswith("mechanism differs from the plan at 95% confidence: ")


def test_the_estimates_measure_the_bug_by_its_size():
    rng = np.random.default_rng(2)
    found, _ = verdicts([simulated(rng, noise_scale=0.5), simulated(rng, noise_scale=0.5)])
    assert found["tests"]["noise_multiplier"]["estimate"] == pytest.approx(0.5, rel=0.06)
    assert found["tests"]["sensitivity"]["estimate"] == pytest.approx(1.0, abs=0.06)  # the clip is honest
    found, _ = verdicts([simulated(rng, clip_scale=1.25), simulated(rng, clip_scale=1.25)])
    assert found["tests"]["sensitivity"]["estimate"] == pytest.approx(1.25, rel=0.05)
    assert found["tests"]["noise_multiplier"]["estimate"] == pytest.approx(0.8, rel=0.06)
    # the rate's estimate has a standard deviation near 0.1 of 2q over 4 runs (0.14 over 2): three of them, against q
    found, _ = verdicts([simulated(rng, echoed=True) for _ in range(4)])
    assert found["tests"]["canary_sampling"]["estimate"] == pytest.approx(2 * Q, rel=0.3)


def test_adams_first_moment_without_momentum_and_a_wrongly_stated_momentum():
    rng = np.random.default_rng(3)
    found, said = verdicts([simulated(rng, mu=0.0), simulated(rng, mu=0.99)])
    assert found["verdict"] == "as planned", said
    wrong = simulated(rng, mu=0.9)
    stated = wrong.stated.copy()
    stated[:, 1] = 0.0  # the strategy says plain SGD, its moves carry momentum
    found, said = verdicts([RunSteps(wrong.moves, wrong.joins, wrong.batch_sizes, wrong.overlaps, stated,
                                     wrong.included, 2.0)])
    assert said["independent"] == "differs"


def test_a_strategy_whose_update_is_not_linear_has_its_sampling_measured_and_says_what_is_not():
    rng = np.random.default_rng(4)
    run = simulated(rng)
    stated = run.stated.copy()
    stated[:, 1:] = np.nan  # DPAdam's linear_step() is None
    found, said = verdicts([RunSteps(run.moves, run.joins, run.batch_sizes, run.overlaps, stated, run.included, 2.0)],
                           DPAdam)
    assert list(said) == ["sampling", "batch_sizes", "overlap"] and found["verdict"] == "as planned"
    assert "DPAdam's update is not linear" in found["not_measured"]
    assert "only its sampling is measured" in summary_line(found)


@pytest.mark.parametrize("strategy, query, others", [
    (Online, "noise_multiplier_g", ["noise_multiplier_q"]),
    (FixedQuantile, "noise_multiplier_grad", ["count_noise_std"]),
    (AdamWOSM, "noise_multiplier", []),
])
def test_a_strategy_with_queries_beyond_the_gradient_names_those_not_measured(strategy, query, others):
    rng = np.random.default_rng(5)
    queries = {name: 1.0 for name in [q for q in (query, *others) if q != "noise_multiplier"]}
    found, _ = verdicts([simulated(rng)], strategy, queries)
    assert found["query"] == query and found["not_measured_queries"] == others


def test_real_examples_sampled_at_another_rate_are_flagged():
    rng = np.random.default_rng(6)
    run = simulated(rng)
    doubled = RunSteps(run.moves, run.joins, rng.binomial(N, 2 * Q, T), run.overlaps, run.stated, run.included, 2.0)
    _, said = verdicts([doubled])
    assert said["sampling"] == "differs"


@pytest.mark.parametrize("sampler, flagged", [
    ("fixed", {"batch_sizes"}),                 # the mean count as planned, no spread
    ("shuffled", {"batch_sizes", "overlap"}),   # and consecutive batches disjoint
    ("poisson_sizes", {"overlap"}),             # the spread as planned, disjoint batches
])
def test_batches_of_a_fixed_size_or_cut_from_a_permutation_are_flagged(sampler, flagged):
    """Each run samples at rate q in the mean, so `sampling` cannot tell; the size and overlap tests do."""
    rng = np.random.default_rng(7)
    found, said = verdicts([simulated(rng, sampler=sampler), simulated(rng, sampler=sampler)])
    assert flagged <= {name for name, v in said.items() if v == "differs"}, said
    assert found["tests"]["sampling"]["p_value"] > 0.01  # the mean alone passes them
    if "batch_sizes" in flagged:
        assert found["tests"]["batch_sizes"]["estimate"] < 0.01  # a fixed size: no spread at all
    if "overlap" in flagged:
        assert found["tests"]["overlap"]["estimate"] < Q / 3
    assert "differs from the plan" in summary_line(found)


def test_a_plan_of_shuffled_batches_has_no_poisson_sampling_to_test():
    """train.sampling=shuffle claims no epsilon and says its batches are shuffled: the audit does not hold them to
    Poisson batches' spread and overlap, and says it did not."""
    rng = np.random.default_rng(10)
    runs = [simulated(rng, sampler="shuffled"), simulated(rng, sampler="shuffled")]
    found = measure(runs, N, B, Q, 0.95, FixedThreshold, {}, poisson=False)
    assert found["verdict"] == "as planned" and not {"batch_sizes", "overlap"} & set(found["tests"])
    assert found["significance_each"] == pytest.approx(0.05 / 6)
    assert "shuffled, not Poisson batches" in summary_line(found) and "the sampling rate" in summary_line(found)
    assert verdicts(runs)[0]["verdict"] == "differs"  # the same batches under a plan that claims Poisson sampling


def digits_batches(rng, sampler: str, steps: int) -> tuple:
    """Batch sizes and overlaps of one run on digits (N = 1,437, B = 128) as `sampler` draws them: the default
    audit's (1 epoch: T = 12 steps)."""
    n, b = 1437, 128
    if sampler == "poisson":
        member = rng.random((steps, n)) < b / n
    else:  # shuffled: a permutation per epoch cut into batches of B
        member = np.zeros((steps, n), dtype=bool)
        for t in range(steps):
            if t % (n // b) == 0:
                order = rng.permutation(n)
            member[t, order[t % (n // b) * b:(t % (n // b) + 1) * b]] = True
    sizes, overlaps = member.sum(1), (member[1:] & member[:-1]).sum(1)
    return sizes, np.column_stack([overlaps, sizes[:-1], sizes[1:]])


def test_the_size_and_overlap_tests_hold_their_level_on_poisson_coins_and_flag_one_epoch_of_shuffled_batches():
    """Literal Poisson coins, one epoch of digits (T = 12) and two runs, 400 times: each test says "differs" at 5% in
    at most 5% of them (plus three standard errors); one epoch of shuffled batches is flagged by both at the default
    audit's share of the significance (0.05 over its 8 tests)."""
    rng = np.random.default_rng(8)
    n, q, reps, level = 1437, 128 / 1437, 400, 0.05
    alarms = np.zeros(2)
    for _ in range(reps):
        (s1, o1), (s2, o2) = digits_batches(rng, "poisson", 12), digits_batches(rng, "poisson", 12)
        alarms += [size_test(np.concatenate([s1, s2]), n, q, level)[2] < level,
                   overlap_test(np.concatenate([o1, o2]), n, level)[2] < level]
    assert (alarms / reps <= level + 3 * math.sqrt(level * (1 - level) / reps)).all(), alarms
    (s1, o1), (s2, o2) = digits_batches(rng, "shuffled", 12), digits_batches(rng, "shuffled", 12)
    assert size_test(np.concatenate([s1, s2]), n, q, level / 8)[2] < level / 8
    assert overlap_test(np.concatenate([o1, o2]), n, level / 8)[2] < level / 8


def test_the_size_test_is_the_binomials_own_law_at_any_rate():
    """S = sum (b_t - N q)^2 over binomial sizes: two-sided p-values below a level in about that share of draws,
    from a tiny expected batch (N q = 5, where the binomial is far from normal) to a large one; q = 1 (every example,
    every step) has no spread, and says so exactly."""
    rng = np.random.default_rng(9)
    for n, q, steps in [(200, 0.025, 30), (1437, 128 / 1437, 12), (60000, 256 / 60000, 2344)]:
        p = np.array([size_test(rng.binomial(n, q, steps), n, q, 0.05)[2] for _ in range(2000)])
        for level in (0.01, 0.05):
            assert abs((p < level).mean() - level) <= 3 * math.sqrt(level * (1 - level) / 2000), (n, q, level)
    assert size_test(np.full(5, 100), 100, 1.0, 0.05)[2] == 1.0
    assert size_test(np.array([100, 99]), 100, 1.0, 0.05)[2] == 0.0


def test_the_linear_steps_the_strategies_state():
    """Strategy.linear_step is (momentum, lr) for descend; AdamWOSM's folds (1 - beta1) / (1 - beta1^t) into a; DPAdam
    has none."""
    import torch

    from dpgrid.strategies.base import Noise

    params = [torch.zeros(3)]
    common = dict(batch_size=10, generator=torch.Generator(), noise=Noise(1.0))
    sgd = FixedThreshold(params, hp={"lr": 0.5, "clip": 1.0}, options={}, momentum=0.9, **common)
    assert sgd.linear_step() == pytest.approx((0.9, 0.5))
    adam = AdamWOSM(params, hp={"clip": 1.0}, options={"lr": 0.1, "beta1": 0.9, "xi": 0.0}, **common)
    ess = 0.1 / (1.0 * 1.0 / 10)
    assert adam.linear_step() == pytest.approx((0.9, ess * 0.1 / (1 - 0.9)))  # t = 1: m_hat = g_tilde
    assert DPAdam(params, hp={"clip": 1.0}, options={"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "xi": 1e-8},
                  **common).linear_step() is None
