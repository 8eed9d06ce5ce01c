import math

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.privacy import calibrate, rdp_epsilon

from .conftest import fast_layer_runs, load_cfg, strategy_class

MNIST_Q, MNIST_T = 512 / 60000, math.ceil(10 * 60000 / 512)


def independent_epsilon(q, nu, steps, delta, accountant="rdp", orders=None):
    """Google's dp-accounting (RDP or PLD): an implementation independent of Opacus."""
    if accountant == "rdp":
        acc = rdp_privacy_accountant.RdpAccountant(*([orders] if orders else []))
    else:
        acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(nu)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("q, nu, steps, delta", [
    (MNIST_Q, 1.358, 7 * MNIST_T, 1e-5),
    (512 / 120000, 0.9, 2344, 1e-5),
    (128 / 1437, 5.0, 225 * 7, 1e-5),
    (0.05, 2.0, 500, 1e-6),
])
def test_accountant_agrees_with_dp_accounting(q, nu, steps, delta):
    ours = rdp_epsilon(q, nu, steps, delta)
    # Fractional orders: dp-accounting sums |binomial| terms, a looser bound than Opacus's signed
    # series (Mironov et al. 2019, sec. 3.3), so it may only be higher, and by little.
    theirs = independent_epsilon(q, nu, steps, delta)
    assert ours <= theirs * (1 + 1e-9) and theirs == pytest.approx(ours, rel=2e-3)
    # Integer orders: the same closed form in both libraries.
    integer_orders = list(range(2, 64)) + [80, 96, 128, 256, 512]
    ours_int = rdp_epsilon(q, nu, steps, delta, orders=integer_orders)
    assert ours_int == pytest.approx(independent_epsilon(q, nu, steps, delta, orders=integer_orders), rel=1e-6)
    # The tight PLD accountant: the true epsilon of the mechanism is at most the RDP bound.
    assert independent_epsilon(q, nu, steps, delta, "pld") <= ours


@pytest.mark.parametrize("epsilon, runs, expected", fast_layer_runs([(3, 1, 0.837), (3, 7, 1.358), (3, 49, 3.140),
                                                                     (9, 1, 0.580), (9, 7, 0.771)], (3, 49, 3.140)))
def test_calibration_matches_spec_sanity_figures(epsilon, runs, expected):
    nu = calibrate(epsilon, MNIST_Q, runs * MNIST_T, 1e-5)
    assert nu == pytest.approx(expected, abs=1.5e-3)
    assert rdp_epsilon(MNIST_Q, nu, runs * MNIST_T, 1e-5) <= epsilon  # enough noise
    assert rdp_epsilon(MNIST_Q, nu * 0.999, runs * MNIST_T, 1e-5) > epsilon  # and the least such
    assert independent_epsilon(MNIST_Q, nu, runs * MNIST_T, 1e-5, "pld") <= epsilon


def plan_for(strategy, **overrides):
    cfg = load_cfg("mnist", strategy, **overrides)
    return compile(cfg, 60000).plan


def test_plan_composes_the_whole_grid():
    plan = plan_for("fixed_threshold", **{"privacy.epsilon": 3, "grid.k": 7})
    assert plan.n_configs == 49 and plan.steps == MNIST_T and plan.composed_runs == 49
    assert plan.noise_multiplier == pytest.approx(3.140, abs=2e-3)
    assert plan.epsilon_spent <= 3.0
    assert independent_epsilon(plan.sample_rate, plan.noise_multiplier, 49 * MNIST_T, 1e-5, "pld") <= 3.0


def test_accounting_seeds_composes_them_too():
    plain = plan_for("online", **{"grid.k": 5, "train.seeds": 5})
    seeds = plan_for("online", **{"grid.k": 5, "train.seeds": 5, "privacy.account_seeds": True})
    assert seeds.composed_runs == 25 and plain.composed_runs == 5
    assert seeds.noise_multiplier == pytest.approx(calibrate(3, MNIST_Q, 25 * MNIST_T, 1e-5))


def test_online_split_composes_back_to_nu():
    plan = plan_for("online", **{"grid.k": 7})
    nu, nu_g, nu_q = plan.noise_multiplier, plan.per_query["noise_multiplier_g"], plan.per_query["noise_multiplier_q"]
    assert nu_g == pytest.approx(1.01 * nu)
    assert nu_q == pytest.approx(7.124 * nu, rel=1e-3)  # the paper's rule of thumb
    assert nu_g ** -2 + nu_q ** -2 == pytest.approx(nu ** -2)  # Proposition 1


def test_fixed_quantile_split_and_refusal():
    plan = plan_for("fixed_quantile", **{"grid.k": 7})
    nu, sigma_b = plan.noise_multiplier, plan.per_query["count_noise_std"]
    assert sigma_b == 512 / 20
    assert plan.per_query["noise_multiplier_grad"] ** -2 + (2 * sigma_b) ** -2 == pytest.approx(nu ** -2)
    cfg = load_cfg("mnist", "fixed_quantile")
    with pytest.raises(DpgridError, match="2 sigma_b"):
        strategy_class("fixed_quantile").split_noise(2 * sigma_b, dict(cfg.strategy), 512)


def test_nodp_has_no_noise_and_no_epsilon():
    plan = plan_for("nodp")
    assert plan.noise_multiplier == 0 and plan.epsilon_spent is None


def test_unreachable_epsilon_is_a_clear_error():
    with pytest.raises(DpgridError, match="unreachable"):
        calibrate(1e-6, 0.01, 100, 1e-5)


def bisection(spent, epsilon, rtol):
    """The plain search smallest_noise replays: double from 1, then halve until narrower than rtol * high."""
    low, high = 0.0, 1.0
    while spent(high) > epsilon:
        low, high = high, 2 * high
    while high - low > rtol * high:
        mid = (low + high) / 2
        low, high = (low, mid) if spent(mid) <= epsilon else (mid, high)
    return high


def test_the_replayed_search_returns_the_bisections_noise_bit_for_bit():
    """smallest_noise evaluates spent about a third less often, and must answer exactly what the bisection
    answers (ν recorded in every existing grid, and the golden data, stay as they are)."""
    import random

    from dpgrid.privacy.accountants import smallest_noise

    rng = random.Random(0)
    for _ in range(2000):  # decreasing curves of every steepness, targets everywhere
        c, p, epsilon, rtol = 10 ** rng.uniform(-3, 3), rng.uniform(0.3, 3), 10 ** rng.uniform(-2, 1.5), rng.choice([1e-4, 1e-3])
        spent = lambda nu, c=c, p=p: math.inf if nu == 0 else c / nu ** p  # noqa: E731
        if spent(5e3) <= epsilon:
            assert smallest_noise(spent, epsilon, rtol, "") == bisection(spent, epsilon, rtol)
    spent = lambda nu: rdp_epsilon(MNIST_Q, nu, 7 * MNIST_T, 1e-5)  # noqa: E731  a real one
    assert smallest_noise(spent, 3.0, 1e-4, "") == bisection(spent, 3.0, 1e-4)


def test_a_search_that_cannot_be_replayed_falls_back_to_the_full_bisection():
    """A curve the root finder cannot bracket (a step) still gets the bisection's answer."""
    from dpgrid.privacy.accountants import smallest_noise

    spent = lambda nu: 10.0 if nu < 2.7 else 1.0  # noqa: E731
    assert smallest_noise(spent, 3.0, 1e-4, "") == bisection(spent, 3.0, 1e-4)


def test_a_remembered_search_is_checked_not_trusted(tmp_path, monkeypatch):
    """The noise cache only proposes: a hit costs two evaluations and gives the search's own answer; an edited
    or damaged entry gives the same answer too (full search); DPGRID_CACHE=off writes nothing."""
    from dpgrid.privacy.accountants import NoiseCache, smallest_noise

    monkeypatch.setenv("DPGRID_CACHE", str(tmp_path / "cache"))
    calls = []

    def spent(nu):
        calls.append(nu)
        return math.inf if nu == 0 else 7.3 / nu ** 1.7

    key = ["test", 0.1, 100, 1e-5]
    first = smallest_noise(spent, 3.0, 1e-4, "", key=key)
    assert first == bisection(spent, 3.0, 1e-4) and len(list((tmp_path / "cache").iterdir())) == 1
    calls.clear()
    assert smallest_noise(spent, 3.0, 1e-4, "", key=key) == first and len(calls) == 2  # a hit: checked twice
    for entry in ("7.0", "garbage", "1e400", "-3"):
        NoiseCache(key, 3.0, 1e-4).path.write_text(entry)
        assert smallest_noise(spent, 3.0, 1e-4, "", key=key) == first
    monkeypatch.setenv("DPGRID_CACHE", "off")
    assert smallest_noise(spent, 2.0, 1e-4, "", key=key) == bisection(spent, 2.0, 1e-4)
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_the_rdp_curve_gives_rdp_epsilon_bit_for_bit():
    """A plan asks ε for several step counts at one ν: the one-step RDP curve is computed once and scaled,
    and each value must be exactly Opacus's for that many steps."""
    import random

    from dpgrid.privacy.accountants import epsilon_curve

    rng = random.Random(1)
    for _ in range(20):
        q, nu, delta = rng.uniform(0.001, 0.3), rng.uniform(0.5, 20), 10 ** rng.uniform(-8, -3)
        epsilon = epsilon_curve("rdp", q, nu)
        for steps in (rng.randint(1, 20000), rng.randint(1, 20000)):
            assert epsilon(steps, delta) == rdp_epsilon(q, nu, steps, delta)


GAUSSIAN_RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 256, 512]


@pytest.mark.parametrize("q", [1e-5, 0.004, 0.05, 0.3])
def test_the_subsampled_gaussians_rdp_is_opacus_computed_as_arrays(q):
    """dpgrid.privacy.gaussian_rdp against Opacus's own compute_rdp, at Opacus's default orders and dpgrid's extra ones
    (fractional and integer sums): equal to 1e-9 relative, or to 1e-10 a step where the RDP is so small that both sums
    cancel to their last digits (there Opacus's sequential float sum is the less accurate: the exact test below)."""
    import numpy as np
    from opacus.accountants.analysis.rdp import compute_rdp as opacus_rdp

    from dpgrid.privacy.gaussian_rdp import compute_rdp

    for nu in (0.5, 1.0, 3.0, 30.0):
        ours = compute_rdp(q, nu, 7, GAUSSIAN_RDP_ORDERS)
        theirs = np.asarray(opacus_rdp(q=q, noise_multiplier=nu, steps=7, orders=GAUSSIAN_RDP_ORDERS))
        assert np.array_equal(np.isfinite(ours), np.isfinite(theirs))
        finite = np.isfinite(theirs)
        assert np.all(np.abs(ours - theirs)[finite] <= 1e-9 * np.abs(theirs[finite]) + 7e-10), (q, nu)
    assert list(compute_rdp(0.0, 1.0, 3, [2, 2.5])) == [0.0, 0.0]  # the edge cases are Opacus's
    assert np.all(np.isinf(compute_rdp(0.1, 0.0, 3, [2, 2.5])))


@pytest.mark.parametrize("q, nu, order", fast_layer_runs([(1e-5, 3.0, 1.2), (0.004, 1.0, 1.5), (0.004, 1.0, 7.3),
                                                          (0.1, 2.0, 3.7), (0.1, 2.0, 4), (0.02, 0.7, 12),
                                                          (0.3, 5.0, 64)], (0.1, 2.0, 3.7), (0.1, 2.0, 4)))
def test_the_subsampled_gaussians_rdp_is_its_exact_moment(q, nu, order):
    """eps(a) = log E_{mu0}[((1 - q) + q mu1 / mu0)^a] / (a - 1), mu0 = N(0, nu^2), mu1 = N(1, nu^2): the integral in
    50 digits (mpmath), against the sums (Mironov, Talwar & Zhang 2019) as dpgrid computes them."""
    import mpmath

    from dpgrid.privacy.gaussian_rdp import compute_rdp

    mpmath.mp.dps = 50
    s, rate, a = mpmath.mpf(nu), mpmath.mpf(q), mpmath.mpf(order)
    density = lambda z: mpmath.npdf(z, 0, s) * ((1 - rate) + rate * mpmath.exp((2 * z - 1) / (2 * s ** 2))) ** a  # noqa: E731
    exact = float(mpmath.log(mpmath.quad(density, [-mpmath.inf, -10 * s, 0, 1, 10 * s, mpmath.inf])) / (a - 1))
    assert compute_rdp(q, nu, 1, [order])[0] == pytest.approx(exact, rel=1e-7, abs=1e-13)
