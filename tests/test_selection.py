"""Random-stopping selection (Papernot & Steinke 2022; Liu & Talwar 2019): dpgrid's Renyi curves against a
transcription of the theorems that shares no code with dpgrid (tests/selection_transcription.py, itself
checked on examples worked by hand), against dp-accounting's implementation, the stopping distributions,
the refusals, and a selection that resumes with the candidates it drew."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from dpgrid import DpgridError
from dpgrid.results import draws, selection
from dpgrid.privacy import random_stopping
from dpgrid.config import compile

from . import selection_transcription as paper
from .command import dpgrid, one_line
from .conftest import load_cfg


# --- the transcription, on examples worked by hand ------------------------------------------------------

def test_transcription_on_examples_worked_by_hand():
    # order 2 of the subsampled Gaussian: A_2 = 1 + q^2 (e^(1/sigma^2) - 1); q = 0.1, sigma = 1: log(1.0171828)
    assert paper.subsampled_gaussian_rdp(0.1, 1.0, 2) == pytest.approx(0.017037, abs=1e-6)
    assert paper.subsampled_gaussian_rdp(1.0, 2.0, 5) == pytest.approx(5 / 8)  # q = 1: the Gaussian, a / (2 sigma^2)
    assert paper.expected_count(0.0, 0.1) == pytest.approx(9 / math.log(10))  # 3.908650
    assert paper.expected_count(0.5, 0.25) == pytest.approx(3.0)  # 0.5 * 0.75 / (0.25 * (1 - 0.5))
    # Theorem 2 on the Gaussian's curve eps(l) = l / 2 (rho = 1/2), eta = 1, gamma = 0.1 (E[K] = 10), lambda = 3:
    # min over l_hat of (l_hat - 1)/2 + log(10)/l_hat is at l_hat = sqrt(2 log 10) = 2.14597: 2 sqrt(log(10)/2) - 1/2
    # = 1.645966; eps' = 1.5 + 2 * 1.645966 + log(10)/2 = 1.5 + 3.291932 + 1.151293 = 5.943225
    orders = [1 + i / 1000 for i in range(1, 50000)]
    curve = paper.theorem_2(orders, [a / 2 for a in orders], eta=1.0, gamma=0.1)
    assert curve[orders.index(3.0)] == pytest.approx(5.943225, abs=1e-5)
    # Theorem 6 on the one-order curve {2: 1.0}, mu = 3: eps_hat = log 2, delta_hat = e^(1 - log 2) / 2 * (1/2)
    # = 0.339785; eps' = 1 + 3 * 0.339785 + log 3 = 3.117968
    assert paper.theorem_6([2], [1.0], mu=3.0)[0] == pytest.approx(3.117968, abs=1e-6)


# --- dpgrid against the transcription and against dp-accounting ------------------------------------------

SETTINGS = [  # (q, nu, T, eta or "poisson", gamma or mu)
    (0.01, 1.0, 1000, 0.0, 0.05),
    (0.01, 2.0, 5000, 1.0, 0.05),
    (0.05, 1.5, 500, 0.5, 0.2),
    (0.004, 0.8, 2000, -0.5, 0.1),
    (512 / 60000, 1.86, 5 * 1172, 0.0, 0.01),
    (0.02, 1.2, 1000, "poisson", 10.0),
    (0.1, 3.0, 300, "poisson", 50.0),
]


def stopping_of(eta, gamma_or_mu) -> dict:
    if eta == "poisson":
        return {"rule": "poisson", "mean": gamma_or_mu, "mu": gamma_or_mu}
    return {"rule": "truncated_negative_binomial", "eta": eta, "gamma": gamma_or_mu,
            "mean": paper.expected_count(eta, gamma_or_mu)}


@pytest.mark.parametrize("q, nu, steps, eta, gamma_or_mu", SETTINGS)
def test_renyi_curves_agree_with_the_transcription_within_one_percent(q, nu, steps, eta, gamma_or_mu):
    orders = list(range(2, 65))
    base = paper.base_curve(q, nu, steps, orders)
    if eta == "poisson":
        expected = paper.monotone(paper.theorem_6(orders, base, gamma_or_mu))
    else:
        expected = paper.monotone(paper.theorem_2(orders, base, eta, gamma_or_mu))
    ours = random_stopping.selection_rdp(orders, random_stopping.candidate_rdp(q, nu, steps, orders), stopping_of(eta, gamma_or_mu))
    np.testing.assert_allclose(ours, expected, rtol=0.01)
    assert not np.allclose(ours, base, rtol=0.01)  # the selection does cost something


@pytest.mark.parametrize("eta, mean", [(0.0, 7), (1.0, 25), (2.5, 49), (-0.5, 5), (0.3, 1.5)])
def test_gamma_for_a_mean_inverts_the_mean(eta, mean):
    from dpgrid.privacy.stopping_laws import tnb_gamma

    gamma = tnb_gamma(eta, mean)
    assert paper.expected_count(eta, gamma) == pytest.approx(mean, rel=1e-9)


@pytest.mark.parametrize("shape, mean", [(0.0, 10), (1.0, 10), (2.5, 30), ("poisson", 10)])
def test_renyi_curves_agree_with_dp_accounting(shape, mean):
    from dp_accounting.rdp import rdp_privacy_accountant as accountant

    base = random_stopping.candidate_rdp(0.01, 1.5, 5000)
    stopping = (random_stopping.parameters("poisson", 0, mean, 1e-5) if shape == "poisson"
                else random_stopping.parameters("truncated_negative_binomial", shape, mean, 1e-5))
    theirs = accountant._compute_rdp_repeat_and_select(random_stopping.ORDERS, list(base), mean,
                                                      math.inf if shape == "poisson" else shape)
    theirs = np.minimum.accumulate(np.asarray(theirs)[::-1])[::-1]  # their Poisson branch skips this step
    np.testing.assert_allclose(random_stopping.selection_rdp(random_stopping.ORDERS, base, stopping), theirs, rtol=1e-6)


# --- the stopping distributions -----------------------------------------------------------------------

@pytest.mark.parametrize("rule, eta, mean", [("truncated_negative_binomial", 0.0, 7), ("truncated_negative_binomial", 1.0, 7),
                                             ("truncated_negative_binomial", -0.5, 4), ("poisson", 0, 7),
                                             ("liu_talwar", 0, 7)])
def test_the_number_of_candidates_has_the_stated_mean(rule, eta, mean):
    stopping = random_stopping.parameters(rule, eta, mean, 1e-5)
    counts = np.array([draws.draw_count(stopping, u) for u in draws.uniforms(10000, torch.Generator().manual_seed(1))])
    assert counts.min() >= (0 if rule == "poisson" else 1)
    assert counts.mean() == pytest.approx(mean, abs=5 * counts.std() / math.sqrt(len(counts)))


def test_a_geometric_draw_by_hand():
    """eta = 1, mean 4: gamma = 1/4, P[K = 1] = 1/4, P[K = 2] = 3/16, so u = 0.2 gives 1, u = 0.3 gives 2."""
    stopping = random_stopping.parameters("truncated_negative_binomial", 1.0, 4, 1e-5)
    assert stopping["gamma"] == pytest.approx(0.25)
    assert [draws.draw_count(stopping, u) for u in (0.2, 0.3, 0.4374, 0.4376)] == [1, 2, 2, 3]


# --- plans and refusals ---------------------------------------------------------------------------------

def test_the_plan_calibrates_the_whole_selection_to_the_target():
    cfg = load_cfg("digits", "fixed_threshold", **{"grid.k": 3, "privacy.selection": "random_stopping"})
    plan = compile(cfg, 1437).plan
    assert plan.record.stopping["mean"] == 9 and plan.composed_runs == plan.seeds and plan.account_seeds
    spent = random_stopping.selection_epsilon(plan.sample_rate, plan.noise_multiplier, plan.seeds * plan.steps, 1e-5,
                                        plan.record.stopping)
    assert spent == pytest.approx(plan.epsilon_spent) and 2.99 < spent <= 3
    less = random_stopping.selection_epsilon(plan.sample_rate, plan.noise_multiplier * 0.99, plan.seeds * plan.steps, 1e-5,
                                       plan.record.stopping)
    assert less > 3  # the smallest such noise


@pytest.mark.parametrize("overrides, message", [
    ({"privacy.stopping_eta": -1}, "privacy.selection.stopping_eta must be a number in (-1, 100]"),
    ({"privacy.stopping_mean": 1}, "privacy.selection.stopping_mean must be a number in (1, 1e+06]"),
    ({"privacy.stopping": "geometric"}, "privacy.selection.stopping"),
    ({"privacy.budget": "per_run"}, "needs privacy.budget=per_grid"),
    ({"grid.only": "[lr0_clip0]"}, "cannot run with grid.only"),
])
def test_bad_selection_settings_are_one_line(overrides, message, tmp_path):
    args = ["strategy=fixed_threshold", "privacy.selection=random_stopping", *(f"{k}={v}" for k, v in overrides.items())]
    r = dpgrid("run", *args, cwd=tmp_path)
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_selection_says_what_is_reachable():
    cfg = load_cfg("digits", "fixed_threshold", **{"grid.k": 3, "privacy.selection": "random_stopping",
                                                 "privacy.epsilon": 0.005})
    with pytest.raises(DpgridError, match=r"unreachable .* spends epsilon = [\d.]+; raise privacy.epsilon above that"):
        compile(cfg, 1437)


# --- a selection end to end ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("secure", [False, True])
def test_a_selection_resumes_with_the_candidates_it_drew(secure, tmp_path):
    out = tmp_path / "sel"
    args = ["strategy=fixed_threshold", "grid.k=3", "train.epochs=1", "train.seeds=2", "privacy.selection=random_stopping",
            "privacy.stopping_eta=1", f"privacy.secure_rng={str(secure).lower()}", f"hydra.run.dir={out}"]
    assert dpgrid("run", *args).returncode == 0
    drawn = json.loads((out / "candidates.json").read_text())["candidates"]
    released = json.loads((out / "selection.json").read_text())
    runs = pd.read_csv(out / "runs.csv")
    assert len(drawn) == runs.candidate.nunique() and len(runs) == 2 * len(drawn)
    assert list(runs.drop_duplicates("candidate").config_id) == drawn  # trained in the order drawn
    best = runs.groupby("candidate").best_value.mean()
    assert released["chosen"]["score"] == pytest.approx(best.max())
    assert released["chosen"]["config_id"] == drawn[best.idxmax()]
    # rows lost after the first run: a seeded selection trains the same candidates again, in the same order (the
    # same runs); a secure one refuses, since its runs trained again would be a second release
    (out / "runs.csv").write_text("".join((out / "runs.csv").read_text().splitlines(keepends=True)[:2]))
    (out / "selection.json").unlink()
    if secure:
        r = dpgrid("run", *args)
        assert r.returncode == 2 and one_line(r.stderr) and "holds 1 of the" in r.stderr, r.stderr
        return
    assert dpgrid("run", *args).returncode == 0
    assert json.loads((out / "candidates.json").read_text())["candidates"] == drawn
    again = pd.read_csv(out / "runs.csv")
    assert list(again.config_id) == list(runs.config_id) and list(again.seed) == list(runs.seed)
    pd.testing.assert_series_equal(again.best_value, runs.best_value)  # seeded: the same numbers


def test_the_side_by_side_nu_of_composition_is_the_plans_own():
    from dpgrid.privacy import alternatives

    plan = compile(load_cfg("digits", "fixed_threshold", **{"grid.k": 2}), 1437).plan
    found = alternatives(plan, 0.0, float(plan.n_configs))
    assert found[f"composition, {plan.n_configs} runs (seeds not accounted)"] == pytest.approx(plan.noise_multiplier,
                                                                                                 abs=1e-4)
    assert found[f"composition, {plan.n_configs * plan.seeds} runs (seeds accounted)"] > plan.noise_multiplier


# --- what a selection releases, and that it is drawn once -------------------------------------------------

SELECTION = ["strategy=fixed_threshold", "grid.k=3", "train.epochs=1", "train.seeds=2", "train.eval_every=4",
             "privacy.selection=random_stopping"]
GOOD, BAD = "lr1_clip1", ["lr0_clip0", "lr0_clip2", "lr0_clip1"]  # lr0 (rho = 10^-2.5) barely moves in one epoch


def select(folder, drawn, monkeypatch, *extra):
    """A selection whose draw is `drawn`, run and tabulated in `folder` (the same relative paths every time)."""
    monkeypatch.setattr(selection, "draw_candidates", lambda stopping, ids, source: list(drawn))
    folder.mkdir()
    run = dpgrid("run", *SELECTION, "hydra.run.dir=sel", *extra, cwd=folder)
    assert run.returncode == 0, run.stderr
    tables = dpgrid("tables", "sel", cwd=folder)
    assert tables.returncode == 0, tables.stderr
    return run


def released(folder, run) -> dict:
    """Every released byte: selection.json, the tables and figures, the console, cli.log without its clock."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in (folder / "sel" / "tables").rglob("*")
             if p.is_file() and p.suffix != ".pdf"}  # a PDF stamps its creation time
    log_path = folder / "sel" / "cli.log"  # opened at its first line: a selection may write none
    log = [line.split("] ", 1)[-1] for line in (log_path.read_text() if log_path.exists() else "").splitlines()]
    console = (run.stdout + run.stderr).replace(str(folder.resolve()), "FOLDER")  # `results: <its path>`
    models = {p.relative_to(folder).as_posix(): p.read_bytes() for p in (folder / "sel" / "model").iterdir()}
    return {**files, **models, "selection.json": (folder / "sel" / "selection.json").read_bytes(), "console": console,
            "cli.log": log}


@pytest.mark.slow
def test_what_a_selection_releases_does_not_depend_on_the_other_candidates(tmp_path, monkeypatch):
    """The same chosen candidate (index 0, so the same seeds and numbers) among 1, 2 or 4 candidates with
    different rivals: every released file is byte-identical."""
    outputs = [released(tmp_path / name, select(tmp_path / name, drawn, monkeypatch))
               for name, drawn in (("one", [GOOD]), ("two", [GOOD, BAD[0]]), ("four", [GOOD, *BAD]))]
    assert json.loads(outputs[0]["selection.json"])["chosen"]["config_id"] == GOOD
    assert any(name.endswith(".png") for name in outputs[0])  # the chosen candidate's curve is drawn
    assert {"sel/model/model.json", "sel/model/seed0.safetensors", "sel/model/seed1.safetensors"} <= set(outputs[0])
    for other in outputs[1:]:
        assert other.keys() == outputs[0].keys()
        assert [name for name in other if other[name] != outputs[0][name]] == []
    runs = pd.read_csv(tmp_path / "four" / "sel" / "runs.csv")
    assert runs.candidate.nunique() == 4  # the rivals were trained: they just released nothing


@pytest.mark.slow
def test_a_selection_is_drawn_once(tmp_path, monkeypatch):
    first = tmp_path / "first"
    select(first, [BAD[0], GOOD], monkeypatch)
    out, drawn_file = first / "sel", first / "sel" / "candidates.json"
    recorded = json.loads(drawn_file.read_text())
    for damage, message in ((lambda: drawn_file.unlink(), "is missing but"),
                            (lambda: drawn_file.write_text(json.dumps({**recorded, "candidates": [BAD[0]]})),
                             "is not the draw the candidate rows"),
                            (lambda: drawn_file.write_text(json.dumps({**recorded, "candidates": [BAD[1], GOOD]})),
                             "is not the draw the candidate rows"),
                            (lambda: drawn_file.write_text("{"), "is damaged")):
        damage()
        r = dpgrid("run", *SELECTION, "hydra.run.dir=sel", cwd=first)
        assert r.returncode == 2 and one_line(r.stderr), r.stderr
        assert str(drawn_file.relative_to(first)) in r.stderr and message in r.stderr and "spending epsilon again" in r.stderr
        drawn_file.write_text(json.dumps(recorded))
    assert json.loads((out / "selection.json").read_text())["chosen"]["config_id"] == GOOD
    drawn_file.unlink()
    monkeypatch.setattr(selection, "draw_candidates", lambda stopping, ids, source: [BAD[2]])
    r = dpgrid("run", *SELECTION, "hydra.run.dir=sel", "overwrite=true", cwd=first)
    assert r.returncode == 0 and "NEW selection is drawn: it spends a new (epsilon, delta)" in r.stderr, r.stderr
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs.config_id) == {BAD[2]} and json.loads((out / "selection.json").read_text())["chosen"]["config_id"] == BAD[2]


def test_selection_json_holds_no_count_and_no_candidate_index():
    from dpgrid.results.selection import summarize_selection

    plan = compile(load_cfg("digits", "fixed_threshold", **{"grid.k": 2, "privacy.selection": "random_stopping"}),
                   1437).plan
    runs = pd.DataFrame({"candidate": [0, 0, 1, 1, 2, 2], "config_id": ["lr0_clip0"] * 2 + ["lr1_clip1"] * 4,
                         "lr": [0.1] * 6, "clip": [1.0] * 6, "best_value": [50, 52, 70, 72, 60, 61], "diverged": False})
    _, out = summarize_selection(runs, plan, ["lr", "clip"], "classification")
    assert out["chosen"] == {"config_id": "lr1_clip1", "lr": 0.1, "clip": 1.0, "score": 71.0}
    assert set(out) == {"selection", "stopping", "epsilon", "delta", "noise_multiplier", "accountant", "analysis", "covered", "neighbouring",
                        "chosen"}
    assert out["stopping"] == plan.record.stopping  # public: the rule and its parameters, fixed before any draw


@pytest.mark.slow
def test_a_damaged_selection_json_is_written_again(tmp_path, monkeypatch):
    from .test_faults import DAMAGE

    select(tmp_path / "sel0", [GOOD, BAD[0]], monkeypatch)
    out = tmp_path / "sel0" / "sel"
    released = (out / "selection.json").read_bytes()
    for damage in DAMAGE.values():
        damage(out / "selection.json")
        r = dpgrid("run", *SELECTION, "hydra.run.dir=sel", cwd=tmp_path / "sel0")
        assert r.returncode == 0, r.stderr
        assert (out / "selection.json").read_bytes() == released


K_FREE = {  # what makes a grid train one run at a time, each said in a line that must not depend on K
    "a step written for one run": ["strategy=automatic", "train.seeds=1", "privacy.selection=random_stopping"],
    "a model over the stacking threshold": ["strategy=fixed_threshold", "train.seeds=2", "model=tabular_mlp",
                                           "model.inputs=64", "model.hidden=2000", "model.classes=10",
                                           "privacy.selection=random_stopping"],
    "tuning on a subsample, over the threshold": ["strategy=fixed_threshold", "train.seeds=1", "model=tabular_mlp",
                                                  "model.inputs=64", "model.hidden=2000", "model.classes=10",
                                                  "privacy.selection=subsample_tuning", "privacy.tuning_rate=0.5"]}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(K_FREE))
def test_the_console_and_cli_log_do_not_depend_on_k(tmp_path, monkeypatch, case):
    """A grid that trains one run at a time says so in a line (a strategy written for one run; a model whose step is
    bound by its arithmetic on a CPU: 150,010 parameters x B = 128): the same line, and nothing else that differs, whether
    one candidate was drawn (one run: nothing to stack) or several."""
    from .plugin import EXAMPLES, SEARCHPATH

    seen = []
    for name, drawn in (("one", ["lr1"]), ("three", ["lr1", "lr0", "lr2"])):
        if "clip" in " ".join(K_FREE[case]) or "fixed_threshold" in K_FREE[case][0]:
            drawn = [f"{c}_clip1" for c in drawn]
        monkeypatch.setattr(selection, "draw_candidates", lambda stopping, ids, source, drawn=drawn: list(drawn))
        folder = tmp_path / name
        folder.mkdir()
        r = dpgrid("run", *K_FREE[case], SEARCHPATH, "grid.k=3", "train.epochs=1", "train.eval_every=4",
                   "hydra.run.dir=sel", cwd=folder, path=[EXAMPLES])
        assert r.returncode == 0, r.stderr
        log = (folder / "sel" / "cli.log").read_text() if (folder / "sel" / "cli.log").exists() else ""
        seen.append((r.stdout.replace(str(folder.resolve()), "FOLDER"), r.stderr,
                     [line.split("] ", 1)[-1] for line in log.splitlines()]))
    assert "train.parallel_runs: one run at a time" in seen[0][1]
    assert seen[0] == seen[1]
