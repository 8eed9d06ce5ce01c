"""Update rules on hand-built per-sample gradients (noise off unless a test is about noise)."""

import math

import pytest
import torch

from dpgrid.strategies import Noise
from dpgrid.training.persample import PerSampleGrads, empty_batch

from .conftest import fast_layer_runs, strategy_class

CFG = {
    "online": dict(clip0=0.1, clip_lr=2.5e-3, lr_lr=2.5e-3, grad_noise_ratio=1.01),
    "fixed_quantile": dict(clip0=0.1, clip_lr=0.2, count_noise_divisor=20),
    "adamwosm": dict(lr=1e-3, beta1=0.9, xi=1e-8),
    "dpadam": dict(lr=1e-3, beta1=0.9, beta2=0.999, xi=1e-8),
    "fixed_threshold": {}, "nodp": {},
}


def grads_from(per_sample: torch.Tensor) -> PerSampleGrads:
    """Per-sample gradients of a single flat parameter: (b, P)."""
    return PerSampleGrads(len(per_sample), lambda: per_sample.norm(dim=1),
                          lambda w: [w.to(per_sample.dtype) @ per_sample])  # (m, P)


def make(name, hp, noise=None, batch_size=4, dim=3, momentum=0.0, seed=0):
    param = torch.zeros(dim, dtype=torch.float64)
    noise = noise if noise is not None else {"noise_multiplier": 0.0, "noise_multiplier_g": 0.0,
                                              "noise_multiplier_q": 0.0, "noise_multiplier_grad": 0.0,
                                              "count_noise_std": 0.0}
    cls = strategy_class(name)
    queries = dict(noise)
    s = cls([param], hp=hp, noise=Noise(queries.pop("noise_multiplier", 0.0), queries), batch_size=batch_size,
            options=dict(CFG[name]),
            generator=torch.Generator().manual_seed(seed), momentum=momentum)
    return s, param


def test_fixed_threshold_clips_and_divides_by_expected_batch_size():
    s, theta = make("fixed_threshold", {"lr": 0.5, "clip": 1.0}, batch_size=10)
    g = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.3, 0.4]], dtype=torch.float64)  # norms 5 and 0.5
    s.step(grads_from(g))
    clipped_sum = torch.tensor([0.6, 0.8 + 0.3, 0.4], dtype=torch.float64)  # first scaled to norm 1
    torch.testing.assert_close(theta, -0.5 * clipped_sum / 10)  # / B = 10, not the realised 2


def test_fixed_threshold_with_momentum_is_heavy_ball():
    s, theta = make("fixed_threshold", {"lr": 1.0, "clip": 10.0}, batch_size=1, momentum=0.9)
    g = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    s.step(grads_from(g))
    s.step(grads_from(g))
    torch.testing.assert_close(theta, torch.tensor([-(1 + 1.9), 0, 0], dtype=torch.float64))


def test_nodp_is_plain_sgd_on_the_mean():
    s, theta = make("nodp", {"lr": 0.1})
    g = torch.tensor([[30.0, 0, 0], [0, 10.0, 0]], dtype=torch.float64)
    s.step(grads_from(g))
    torch.testing.assert_close(theta, torch.tensor([-1.5, -0.5, 0], dtype=torch.float64))


def test_online_q_has_unit_or_zero_norm_per_sample():
    s, _ = make("online", {"lr": 0.1})
    g = torch.tensor([[3.0, 4.0, 0.0], [0.01, 0.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    n = g.norm(dim=1)
    w = (n > s.clip).double() / n
    q_i = w[:, None] * g
    torch.testing.assert_close(q_i.norm(dim=1), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))


def test_online_raises_and_lowers_clip_and_lr_by_sign():
    s, theta = make("online", {"lr": 0.1})
    up = torch.tensor([[3.0, 4.0, 0.0]], dtype=torch.float64)  # norm 5 > C: clipped, q = g / 5
    s.step(grads_from(up))  # t = 1: q_0 = g_0 = 0, nothing adapts
    assert float(s.clip) == pytest.approx(0.1) and float(s.lr) == pytest.approx(0.1)
    torch.testing.assert_close(theta, -0.1 * 0.1 * torch.tensor([0.6, 0.8, 0.0], dtype=torch.float64) / 4)
    s.step(grads_from(up))  # same direction: g_t . q_{t-1} > 0 and g_t . g_{t-1} > 0
    assert float(s.clip) == pytest.approx(0.1 * math.exp(2.5e-3))
    assert float(s.lr) == pytest.approx(0.1 * math.exp(2.5e-3))
    s.step(grads_from(-up))  # reversed: both dot products < 0
    assert float(s.clip) == pytest.approx(0.1)
    assert float(s.lr) == pytest.approx(0.1)


def test_online_clip_ignores_samples_below_threshold():
    s, _ = make("online", {"lr": 0.1})
    s.step(grads_from(torch.tensor([[0.01, 0.0, 0.0]], dtype=torch.float64)))  # below C: q_0 = 0
    s.step(grads_from(torch.tensor([[5.0, 0.0, 0.0]], dtype=torch.float64)))
    assert float(s.clip) == pytest.approx(0.1)  # sign(g . 0) = 0
    assert float(s.lr) == pytest.approx(0.1 * math.exp(2.5e-3))


def test_fixed_quantile_moves_clip_to_the_target_quantile():
    s, _ = make("fixed_quantile", {"lr": 0.0, "quantile": 0.7}, batch_size=100)
    norms = torch.linspace(0.01, 10.0, 100, dtype=torch.float64)  # the 0.7 quantile is about 7
    g = torch.zeros(100, 3, dtype=torch.float64)
    g[:, 0] = norms
    for _ in range(300):
        s.step(grads_from(g))
    assert float(s.clip) == pytest.approx(float(torch.quantile(norms, 0.7)), rel=0.03)


def test_fixed_quantile_single_geometric_step():
    s, _ = make("fixed_quantile", {"lr": 0.0, "quantile": 0.5}, batch_size=4)
    g = torch.tensor([[0.05, 0, 0], [1.0, 0, 0], [2.0, 0, 0], [3.0, 0, 0]], dtype=torch.float64)
    s.step(grads_from(g))  # 1 of 4 norms <= C_0 = 0.1: b = (1 - 2) / 4 + 1/2 = 0.25
    assert float(s.clip) == pytest.approx(0.1 * math.exp(-0.2 * (0.25 - 0.5)))


def test_adamwosm_step_is_ess_times_bias_corrected_momentum():
    nu, clip, b = 2.0, 0.5, 8
    s, theta = make("adamwosm", {"clip": clip}, noise={"noise_multiplier": nu}, batch_size=b)
    s.noise = Noise(0.0)  # ESS keeps the planned nu; switch the draws off
    ess = 1e-3 / (nu * clip / b + 1e-8)
    g1 = torch.tensor([[0.3, 0.0, 0.0]], dtype=torch.float64)
    g2 = torch.tensor([[0.0, 0.4, 0.0]], dtype=torch.float64)
    s.step(grads_from(g1))
    m1 = 0.1 * g1[0] / b
    torch.testing.assert_close(theta, -ess * m1 / (1 - 0.9))
    before = theta.clone()
    s.step(grads_from(g2))
    m2 = 0.9 * m1 + 0.1 * g2[0] / b
    torch.testing.assert_close(theta, before - ess * m2 / (1 - 0.9 ** 2))


def test_dpadam_two_steps_by_hand():
    """Adam on the clipped mean (noise off), worked by hand for B = 2, C = 1, alpha = 0.1:
    step 1: g = (0.6, 0.8) / 2 = (0.3, 0.4) (the per-sample gradient (3, 4) clipped to norm 1);
            m = 0.1 g = (0.03, 0.04), v = 0.001 g^2 = (9e-5, 1.6e-4); m_hat = (0.3, 0.4), v_hat = (0.09, 0.16),
            theta = -0.1 m_hat / (sqrt(v_hat) + 1e-8) = -(0.1, 0.1) (Adam's first step is alpha sign(g)).
    step 2: g = (0, -0.25) (the gradient (0, -0.5), inside the threshold);
            m = 0.9 m + 0.1 g = (0.027, 0.011), m_hat = m / 0.19 = (0.142105, 0.057895);
            v = 0.999 v + 0.001 g^2 = (8.991e-5, 2.22340e-4), v_hat = v / 0.001999 = (0.044977, 0.111226);
            theta -= 0.1 m_hat / sqrt(v_hat) = (0.1 * 0.142105 / 0.212078, 0.1 * 0.057895 / 0.333506)
                   = (0.067006, 0.017360): theta = (-0.167006, -0.117360)."""
    s, theta = make("dpadam", {"clip": 1.0, "lr": 0.1}, batch_size=2, dim=2)
    s.step(grads_from(torch.tensor([[3.0, 4.0]], dtype=torch.float64)))
    torch.testing.assert_close(theta, torch.tensor([-0.1, -0.1], dtype=torch.float64))
    s.step(grads_from(torch.tensor([[0.0, -0.5]], dtype=torch.float64)))
    torch.testing.assert_close(theta, torch.tensor([-0.167006, -0.117360], dtype=torch.float64), atol=2e-6, rtol=0)


def test_dpadam_uses_the_configs_alpha_unless_the_grid_tunes_it():
    tuned, _ = make("dpadam", {"clip": 1.0, "lr": 0.1})
    fixed, _ = make("dpadam", {"clip": 1.0})
    assert float(tuned.lr) == pytest.approx(0.1) and float(fixed.lr) == pytest.approx(CFG["dpadam"]["lr"])


@pytest.mark.parametrize("clip", fast_layer_runs([0.1, 1.0, 10.0], 1.0))
def test_dpadam_effective_step_size_tends_to_adamwosms_when_noise_dominates(clip):
    """Mohapatra et al.'s Theorem 3: with g -> 0 the second moment tends to (nu C / B)^2, so DPAdam's
    per-coordinate step alpha / (sqrt(v_hat) + xi) tends to adamwosm's ESS = alpha / (nu C / B + xi).
    Zero gradients, nu = 1.3, B = 16, 2,000 coordinates, 3,000 steps (3 beta2 time constants): the median
    over coordinates is within 1 % of the ESS (a coordinate's v_hat then has a relative spread of about
    sqrt(2 (1 - beta2)) = 4.5 %, so sqrt(v_hat) 2.2 %, and the median of 2,000 about 0.1 %)."""
    nu, b, dim = 1.3, 16, 2000
    adam, _ = make("dpadam", {"clip": clip}, noise={"noise_multiplier": nu}, batch_size=b, dim=dim)
    wosm, _ = make("adamwosm", {"clip": clip}, noise={"noise_multiplier": nu}, batch_size=b, dim=dim)
    zero = grads_from(torch.zeros(1, dim, dtype=torch.float64))
    for _ in range(3000):
        adam.step(zero)
    ess = adam.effective_step_size()[0]
    assert float(ess.median()) == pytest.approx(float(wosm.lr), rel=0.01)
    assert float(wosm.lr) == pytest.approx(1e-3 / (nu * clip / b + 1e-8))


@pytest.mark.parametrize("name, noise, expected_std", [
    ("fixed_threshold", {"noise_multiplier": 1.5}, 1.5 * 0.7 / 64),
    ("online", {"noise_multiplier_g": 1.2, "noise_multiplier_q": 8.0}, 1.2 * 0.1 / 64),
    ("fixed_quantile", {"noise_multiplier_grad": 1.3, "count_noise_std": 3.2}, 1.3 * 0.1 / 64),
])
def test_added_noise_has_the_planned_std(name, noise, expected_std):
    """With zero gradients the update is -lr * noise / B: its std is lr * nu * C / B."""
    s, theta = make(name, {"lr": 1.0, "clip": 0.7, "quantile": 0.5}, noise=noise, batch_size=64, dim=200_000)
    s.step(grads_from(torch.zeros(5, 200_000, dtype=torch.float64)))
    assert float(theta.std()) == pytest.approx(expected_std, rel=0.02)
    assert abs(float(theta.mean())) < 5 * expected_std / math.sqrt(200_000)


def test_online_q_alignment_is_distributed_as_with_q_tilde_drawn_in_full():
    """g . q_tilde with q_tilde = (sum_i q_i + N(0, nu_q^2 I)) / B, unit sensitivity: drawn in full many
    times, and as online's one-number shortcut, the two samples agree in mean and std."""
    torch.manual_seed(1)
    nu_q, b, dim, draws = 8.0, 64, 50, 20_000
    s, _ = make("online", {"lr": 1.0}, noise={"noise_multiplier_g": 1.0, "noise_multiplier_q": nu_q},
                batch_size=b, dim=dim)
    q_sum = torch.randn(dim, dtype=torch.float64)
    g = torch.randn(dim, dtype=torch.float64)
    s.prev_q_sum = q_sum
    shortcut = torch.stack([s.q_alignment(g) for _ in range(draws)])
    full = (q_sum + nu_q * torch.randn(draws, dim, dtype=torch.float64)) @ g / b
    mean, std = float(g @ q_sum / b), nu_q * float(g.norm()) / b
    for sample in (shortcut, full):
        assert float(sample.mean()) == pytest.approx(mean, abs=4 * std / math.sqrt(draws))
        assert float(sample.std()) == pytest.approx(std, rel=0.02)


def test_noisy_mean_draws_the_same_noise_as_one_randn_per_sum():
    """The flat buffer must not change which numbers a seed draws (runs stay reproducible across
    versions), and every sum's noise is scaled by std / B, its value by 1 / B."""
    shapes = [(3, 5), (5,), (2, 2, 2), ()]
    sums = [torch.full(shape, float(k + 1), dtype=torch.float64) for k, shape in enumerate(shapes)]
    s, _ = make("fixed_threshold", {"lr": 1.0, "clip": 1.0}, batch_size=4, seed=7)
    flat, views = s.noisy_mean_flat(sums, torch.tensor(2.0, dtype=torch.float64))
    g = torch.Generator().manual_seed(7)
    expected = [(torch.randn(shape, generator=g, dtype=torch.float64) * 2.0 + k + 1) / 4 for k, shape in enumerate(shapes)]
    for view, e in zip(views, expected):
        torch.testing.assert_close(view, e, rtol=1e-15, atol=1e-15)
    assert flat.shape == (15 + 5 + 8 + 1,) and torch.equal(flat, torch.cat([e.reshape(-1) for e in expected]))


def test_empty_batch_adds_noise_only():
    s, theta = make("fixed_threshold", {"lr": 1.0, "clip": 1.0}, noise={"noise_multiplier": 1.0},
                    batch_size=16, dim=50_000)
    s.step(empty_batch([theta], theta.device, 1))
    assert float(theta.std()) == pytest.approx(1.0 / 16, rel=0.03)
