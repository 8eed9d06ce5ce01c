"""The PUR track: noise schedules of full-batch noisy gradient descent, their zCDP accounting, the stop rule,
the oracle's flags, the logistic-regression datasets and the refusals."""

import json
import math

import pandas as pd
import pytest
import torch

import dpgrid
from dpgrid.privacy import noise_schedule as zcdp
from dpgrid.data.binary import load_breast_cancer, load_iris, load_kddcup99, load_synthetic
from dpgrid.strategies import PUR, ConstantNoise, Noise, PUROracle

from .command import dpgrid as run_dpgrid


def problem(l2, d=4, z=4.0, radius=10.0, n=150):
    r = math.sqrt(2 * math.log(2) / l2) if l2 > 0 else radius
    return {"n": n, "d": d, "l2": l2, "feature_bound": z, "radius": r, "lipschitz": l2 * r + z, "smoothness": l2 + z * z / 4}


def test_the_schedules_by_hand_for_two_steps():
    # convex, lambda = 0, d = 4, Z = 4, R = 10: M = 16/4 = 4, sigma_t = 4 M R / (sqrt(d) t) = 80 / t
    convex = PUR.sigmas({}, problem(0.0))
    assert [next(convex), next(convex)] == pytest.approx([80.0, 40.0])
    # strongly convex, lambda = 0.1: M = 4.1, sigma_1 = sqrt(2 * 0.1 * log 2 / 4) = sqrt(0.0346574) = 0.186165,
    # sigma_2 = sigma_1 * sqrt(1 - 0.1 / 8.2) = 0.186165 * 0.993884 = 0.185026
    strong = PUR.sigmas({}, problem(0.1))
    assert [next(strong), next(strong)] == pytest.approx([0.186165, 0.185026], abs=2e-6)
    constant = ConstantNoise.sigmas({"sigma": 0.1}, problem(0.1))
    assert [next(constant), next(constant)] == [0.1, 0.1]


def test_rho_accumulates_as_the_direct_sum_and_the_run_stops_within_its_budget():
    p = problem(0.1)
    budget = zcdp.rho_budget(2.0, 1 / 150)
    assert zcdp.epsilon(budget, 1 / 150) == pytest.approx(2.0)  # the paper's conversion, inverted exactly
    steps, rho = zcdp.steps_within(PUR.sigmas({}, p), p["lipschitz"], 150, budget, 10**6)
    sigmas = PUR.sigmas({}, p)
    direct = [2 * p["lipschitz"] ** 2 / (150 ** 2 * next(sigmas) ** 2) for _ in range(steps + 1)]
    assert rho == pytest.approx(sum(direct[:steps]), rel=1e-12)
    assert zcdp.epsilon(sum(direct[:steps]), 1 / 150) <= 2.0 < zcdp.epsilon(sum(direct), 1 / 150)  # eps_T <= target < eps_T+1
    assert zcdp.epsilon(rho, 1 / 150, "rdp") < zcdp.epsilon(rho, 1 / 150, "zcdp")  # the RDP conversion is tighter


def test_a_step_is_gradient_descent_on_the_regularised_risk_plus_the_scheduled_noise():
    data = load_iris()
    from dpgrid.models import logistic
    from dpgrid.training.persample import make_engine

    model = logistic(4, l2=0.1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.3, -0.2, 0.1, 0.5]], dtype=torch.float64))
    theta = model.weight.detach().clone()
    p = {**problem(0.1), "rho_budget": 1e9, "eta": 1 / (2 * 4.1)}
    generator = torch.Generator().manual_seed(3)
    replay = torch.Generator().manual_seed(3)
    strategy = ConstantNoise(model.parameters(), hp={"sigma": 0.05}, batch_size=150, options={},
                              noise=Noise(float("nan"), delta=1 / 150, accountant="zcdp", problem=p),
                              generator=generator)
    strategy.step(make_engine(model, "logistic", "fast")(data.x_train, data.y_train))
    x, y = data.x_train, data.y_train
    margin = y * (x @ theta[0])
    gradient = -(torch.sigmoid(-margin) * y) @ x / 150 + 0.1 * theta[0]  # grad F at theta, by hand
    noise = torch.randn(4, generator=replay, dtype=torch.float64) * 0.05
    torch.testing.assert_close(model.weight[0].detach(), theta[0] - (gradient + noise) / (2 * 4.1))
    assert strategy.rho == pytest.approx(2 * p["lipschitz"] ** 2 / (150 ** 2 * 0.05 ** 2))


def test_the_oracle_is_flagged_not_private_everywhere(tmp_path):
    cfg = dpgrid.compose(["dataset=iris", "strategy=pur_oracle", "train.seeds=1", "train.epochs=50"])
    plan = dpgrid.plan(cfg)
    assert plan.epsilon_spent is None and plan.epsilon_grid is None and "not private (oracle)" in plan.sampling
    printed = run_dpgrid("plan", "dataset=iris", "strategy=pur_oracle")
    assert "NOT PRIVATE (oracle)" in printed.stdout
    result = dpgrid.run_grid(cfg, tmp_path / "oracle", progress=False)
    assert result.runs.epsilon_spent.isna().all() and (result.runs.sampling == plan.sampling).all()
    assert result.plan["epsilon_spent"] is None and "oracle" in result.plan["label"].lower()
    lines = []
    dpgrid.tables(tmp_path, figures=False, report=lines.append)
    assert not (tmp_path / "tables" / "iris_k7.md").exists()  # no grid with a DP guarantee: no table, a line
    assert any("iris k=7: no grid of this table has a result" in line for line in lines), lines
    results = pd.read_csv(tmp_path / "tables" / "results.csv")
    assert results.sampling.str.contains("not private (oracle)", regex=False).all()


def test_a_pur_grid_spends_its_budget_under_both_conversions(tmp_path):
    cfg = dpgrid.compose(["dataset=iris", "strategy=pur", "train.seeds=1", "privacy.epsilon=2"])
    result = dpgrid.run_grid(cfg, tmp_path / "pur", progress=False)
    run = result.runs.iloc[0]
    assert run.steps == result.plan["schedule"]["default"]["steps"] > 0 and run.epsilon_spent <= 2
    assert run.epsilon_rdp < run.epsilon_zcdp == run.epsilon_spent
    curve = result.curves
    assert curve.step.max() == run.steps and curve.epsilon.is_monotonic_increasing and curve.epsilon.max() <= 2
    # its scores are evaluated on the private training data and its features standardised with it (the paper's
    # protocol): the release claims no epsilon, and says why, whatever epsilon the runs spent
    statement = dpgrid.load_model(tmp_path / "pur").statement
    assert statement["covered_by"] is None and "evaluated on the private training data" in statement["why"]
    assert statement["privacy"]["epsilon_spent"] <= 2  # what the mechanism spent, stated beside it


def test_the_logistic_datasets():
    synthetic = load_synthetic(feature_bound=1e9)
    assert synthetic.x_train.shape == (10_000, 2) and set(synthetic.y_train.tolist()) == {-1.0, 1.0}
    torch.testing.assert_close(synthetic.x_train.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(synthetic.x_train.std(0, correction=0), torch.ones(2, dtype=torch.float64))
    agree = ((synthetic.x_train.sum(1) > 0) == (synthetic.y_train > 0)).double().mean()
    assert 0.88 < float(agree) < 0.92  # labels flipped with p = 0.1
    assert int((load_iris().y_train > 0).sum()) == 50 and int((load_breast_cancer().y_train > 0).sum()) == 212
    bounded = load_breast_cancer(feature_bound=5.0)
    assert float(bounded.x_train.norm(dim=1).max()) <= 5.0 + 1e-9  # rows longer than Z are shortened


def test_kddcup99_without_its_files_says_where_to_put_them(tmp_path):
    with pytest.raises(dpgrid.DpgridError, match=r"KDD Cup '99 is not under .*kddcup99; fetch it once"):
        load_kddcup99(tmp_path)


@pytest.mark.parametrize("args, message", [
    (["dataset=iris", "strategy=pur", "dataset.l2=-1"], "dataset.l2 must be a finite number >= 0"),
    (["dataset=iris", "strategy=pur", "dataset.feature_bound=0"], "dataset.feature_bound must be"),
    (["dataset=iris", "strategy=constant_noise", "strategy.axes.sigma=[0,1]"], "strategy.axes.sigma must be"),
    (["dataset=iris", "strategy=pur", "privacy.epsilon=0"], "privacy.epsilon must be in"),
    (["dataset=iris", "strategy=pur", "privacy.delta=1"], "privacy.delta must be in"),
    (["dataset=digits", "strategy=pur"], "dataset=digits has task classification"),
    (["dataset=iris", "strategy=fixed_threshold"], "privacy.accountant=zcdp does not apply"),
    (["dataset=iris", "strategy=pur", "privacy.accountant=pld"], "privacy.accountant=pld does not apply"),
])
def test_bad_pur_input_is_one_line(args, message, tmp_path):
    r = run_dpgrid("run", *args, cwd=tmp_path)
    errors = [line for line in r.stderr.strip().splitlines() if not line.startswith("dpgrid: warning:")]
    assert r.returncode == 2 and len(errors) == 1 and message in errors[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_pur_oracle_and_constant_are_importable_classes():
    assert PUROracle.oracle and not PUR.oracle and issubclass(ConstantNoise, dpgrid.Strategy)
    assert json.dumps(problem(0.1))  # the plan's constants are plain numbers
