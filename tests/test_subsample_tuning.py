"""Tuning on a subsample end to end (privacy.selection=subsample_tuning): the candidates train on the tuning set
with its noise and batch, the chosen configuration's final runs on the full data (or the rest) with theirs; what is
released, what stays private, a resume, the refusals, the plan and the table."""

import json

import pandas as pd
import pytest

from dpgrid import runner

from .command import dpgrid, one_line

BASE = ["strategy=fixed_threshold", "grid.k=2", "train.epochs=2", "train.seeds=2",
        "privacy.selection=subsample_tuning", "privacy.tuning_rate=0.3"]


def spy(monkeypatch) -> list:
    """Every run's training set size, expected batch and noise multiplier, as the training loop is given them."""
    seen = []
    loop = runner.train_runs

    def train_runs(models, engine, strategy, data, *args, **kwargs):
        seen.append((data.n_train, strategy.batch_size, strategy.noise.noise_multiplier, len(models)))
        return loop(models, engine, strategy, data, *args, **kwargs)

    monkeypatch.setattr(runner, "train_runs", train_runs)
    return seen


@pytest.mark.slow  # trains a tuning and its final runs end to end (2-4 s)
@pytest.mark.parametrize("extra", [[], ["privacy.final_data=rest", "privacy.tuning_search=composition",
                                        "privacy.tuning_split=0.4"]])
def test_candidates_train_on_the_tuning_set_and_the_final_model_on_the_data(extra, tmp_path, monkeypatch):
    out = tmp_path / "tuned"
    seen = spy(monkeypatch)
    r = dpgrid("run", *BASE, *extra, f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    plan = json.loads((out / "plan.json").read_text())
    tuning, members = plan["tuning"], json.loads((out / "tuning_set.json").read_text())["members"]
    n, rate, batch = plan["n_train"], plan["tuning"]["rate"], plan["batch_size"]
    assert abs(len(members) - rate * n) < 5 * (n * rate * (1 - rate)) ** 0.5  # Poisson membership at q1
    runs = pd.read_csv(out / "runs.csv")
    tuned, final = runs[runs.phase == "tuning"], runs[runs.phase == "final"]
    rest = "privacy.final_data=rest" in extra
    sizes = [(len(members), rate * batch, tuning["tuning"]["noise_multiplier"])] * len(tuned) + \
        [(n - len(members) if rest else n, batch * (1 - rate) if rest else batch, tuning["final"]["noise_multiplier"])] * len(final)
    # flat: pytest.approx compares no nested sequences (pytest >= 9.2 refuses them)
    assert [v for s in seen for _ in range(s[3]) for v in s[:3]] == pytest.approx([v for s in sizes for v in s])
    assert set(tuned.noise_multiplier) == {tuning["tuning"]["noise_multiplier"]}
    assert set(final.noise_multiplier) == {tuning["final"]["noise_multiplier"]} and len(final) == 2
    if "privacy.tuning_split=0.4" in extra:
        assert tuning["tuning"]["noise_multiplier"] != tuning["final"]["noise_multiplier"]
        assert tuning["tuning"]["epsilon"] <= 0.4 * plan["epsilon"] * (1 + 1e-9)
    assert plan["epsilon_spent"] <= plan["epsilon"]
    # released: the configuration the tuning rows choose, its score there, the final runs' score; the final model
    key = "candidate" if "candidate" in tuned else "config_id"
    scores = tuned.groupby(key).best_value.mean()
    released = json.loads((out / "selection.json").read_text())
    chosen = tuned[tuned[key] == scores.idxmax()].config_id.iloc[0]
    assert released["chosen"]["config_id"] == chosen == final.config_id.iloc[0]
    assert released["chosen"]["tuning_score"] == pytest.approx(scores.max())
    assert released["final"]["score"] == pytest.approx(final.best_value.mean())
    statement = json.loads((out / "model" / "model.json").read_text())
    assert statement["covered_by"]["epsilon"] == pytest.approx(plan["epsilon_spent"])
    assert statement["configuration"]["config_id"] == chosen and "final model" in statement["why"]
    assert sorted(p.name for p in (out / "model").glob("*.safetensors")) == ["seed0.safetensors", "seed1.safetensors"]
    assert "final model:" in r.stdout and "subsample tuning: training; its epsilon covers the chosen" in r.stderr
    # a second command trains nothing and releases the same
    before = (out / "runs.csv").read_text()
    assert dpgrid("run", *BASE, *extra, f"hydra.run.dir={out}").returncode == 0
    assert (out / "runs.csv").read_text() == before


@pytest.mark.slow  # trains a tuning and its final runs end to end (2-4 s)
def test_the_table_shows_the_final_model_and_refuses_an_edited_release(tmp_path):
    out = tmp_path / "tuned"
    assert dpgrid("run", *BASE, f"hydra.run.dir={out}").returncode == 0
    assert dpgrid("tables", str(tmp_path)).returncode == 0
    results = pd.read_csv(tmp_path / "tables" / "results.csv")
    final = pd.read_csv(out / "runs.csv").query("phase == 'final'").best_value
    assert results.value.iloc[0] == pytest.approx(final.mean()) and results.budget.iloc[0] == "selection"
    released = json.loads((out / "selection.json").read_text())
    released["final"]["score"] += 1
    (out / "selection.json").write_text(json.dumps(released))
    r = dpgrid("tables", str(tmp_path), "--out", str(tmp_path / "t2"))
    assert "does not release what its rows select" in r.stderr, r.stderr


@pytest.mark.slow  # trains a tuning and its final runs end to end (2-4 s)
def test_a_secure_tuning_refuses_a_lost_tuning_set(tmp_path):
    out = tmp_path / "tuned"
    args = [*BASE, "privacy.secure_rng=true", f"hydra.run.dir={out}"]
    assert dpgrid("run", *args).returncode == 0
    (out / "tuning_set.json").unlink()
    r = dpgrid("run", *args)
    assert r.returncode == 2 and one_line(r.stderr) and "tuning_set.json is missing" in r.stderr, r.stderr


@pytest.mark.parametrize("override, message", [
    ("privacy.tuning_rate=0", "privacy.selection.tuning_rate must be a number in (0, 1)"),
    ("privacy.tuning_rate=1", "privacy.selection.tuning_rate must be a number in (0, 1)"),
    ("privacy.tuning_split=1", "privacy.selection.tuning_split must be shared"),
    ("privacy.tuning_split=0", "privacy.selection.tuning_split must be shared"),
    ("privacy.tuning_split=half", "privacy.selection.tuning_split must be shared"),
    ("privacy.tuning_rate=0.001", "expected batch of 0.128 examples"),
    ("privacy.final_data=test", "privacy.selection.final_data"),
    ("privacy.tuning_search=grid", "privacy.selection.tuning_search"),
    ("privacy.stopping=liu_talwar", "privacy.selection.stopping"),
    ("privacy.selection_accountant=profile", "needs privacy.accountant=pld"),
])
def test_bad_settings_are_one_line(override, message, tmp_path):
    r = dpgrid("run", *BASE, override, cwd=tmp_path)
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("analysis, other", [
    ([], "by profile"),
    pytest.param(["privacy.accountant=pld", "privacy.selection_accountant=profile"], "by rdp",
                 marks=pytest.mark.slow),  # calibrates under the profile analysis (PLDs: 10 s)
])
def test_the_plan_shows_both_phases(analysis, other):
    r = dpgrid("plan", *BASE, *analysis)
    assert r.returncode == 0, r.stderr
    for words in ("tuning phase:", "final phase:", "nu_1 =", "nu_2 =", "expected compute:", other):
        assert words in r.stdout, r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["online", "fixed_quantile", "adamwosm", "dpadam"])
def test_every_built_in_strategy_tunes_on_a_subsample(strategy, tmp_path):
    out = tmp_path / strategy
    args = [f"strategy={strategy}", "grid.k=2", "train.epochs=2", "train.seeds=2", "privacy.selection=subsample_tuning",
            "privacy.tuning_rate=0.3", f"hydra.run.dir={out}"]
    r = dpgrid("run", *args)
    assert r.returncode == 0, r.stderr
    plan = json.loads((out / "plan.json").read_text())
    runs = pd.read_csv(out / "runs.csv")
    split = [c for c in runs if c.startswith("noise_multiplier_") or c == "count_noise_std"]
    for column in split:  # each phase's split of its own nu, computed with its own expected batch
        assert set(runs[runs.phase == "tuning"][column]) == {plan["tuning"]["tuning"]["per_query"][column]}
        assert set(runs[runs.phase == "final"][column]) == {plan[column]}
    assert (out / "model" / "model.json").exists()


def test_a_split_that_depends_on_the_batch_names_the_tuning_set():
    r = dpgrid("plan", "strategy=fixed_quantile", "privacy.selection=subsample_tuning")
    assert r.returncode == 2 and one_line(r.stderr) and "privacy.selection.tuning_rate" in r.stderr, r.stderr


@pytest.mark.slow  # trains a tuning and its final runs end to end (2-4 s)
def test_a_tuning_stopped_between_its_phases_resumes_with_the_same_choice_and_final_runs(tmp_path):
    out = tmp_path / "tuned"
    args = [*BASE, f"hydra.run.dir={out}"]
    assert dpgrid("run", *args).returncode == 0
    runs = pd.read_csv(out / "runs.csv")
    members = (out / "tuning_set.json").read_text()
    tuning_rows = [line for line in (out / "runs.csv").read_text().splitlines(keepends=True) if ",final," not in line]
    (out / "runs.csv").write_text("".join(tuning_rows))  # as if stopped before the final phase
    for name in ("selection.json", "summary.csv"):
        (out / name).unlink()
    assert dpgrid("run", *args).returncode == 0
    again = pd.read_csv(out / "runs.csv")
    assert (out / "tuning_set.json").read_text() == members
    assert list(again.seed) == list(runs.seed) and list(again.config_id) == list(runs.config_id)
    pd.testing.assert_series_equal(again.best_value, runs.best_value)  # seeded: the same final runs


@pytest.mark.slow  # trains a tuning and its final runs end to end (2-4 s)
def test_overwrite_draws_a_new_tuning_set(tmp_path):
    out = tmp_path / "tuned"
    assert dpgrid("run", *BASE, f"hydra.run.dir={out}").returncode == 0
    first = json.loads((out / "tuning_set.json").read_text())["members"]
    r = dpgrid("run", *BASE, "privacy.tuning_rate=0.4", "overwrite=true", f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "tuning_set.json").read_text())["members"] != first


@pytest.mark.slow
def test_tuning_on_a_subsample_of_real_mnist(shared_data, tmp_path):
    """The real MNIST files: a tenth as the tuning set, the final model on all 60,000; it learns."""
    out = tmp_path / "mnist"
    r = dpgrid("run", "dataset=mnist", "model=image_mlp", f"data.root={shared_data}", "strategy=fixed_threshold",
               "grid.k=2", "train.epochs=1", "train.seeds=1", "privacy.epsilon=8", "privacy.selection=subsample_tuning",
               "privacy.tuning_search=composition", f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    members = json.loads((out / "tuning_set.json").read_text())["members"]
    assert 5400 < len(members) < 6600  # about q1 N = 6,000 of 60,000
    released = json.loads((out / "selection.json").read_text())
    assert released["final"]["score"] > 60, released  # 10 classes: chance is 10 %
