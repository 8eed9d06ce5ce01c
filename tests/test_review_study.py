"""An adversarial read of issue 75 (the study's whole cost; scores that are not chosen on themselves): grids whose
spending on a dataset the ledger does not count, or counts twice, a budget that a setting bypasses, and a reported
score measured on the half that chose it. Each test states what should hold and fails on the current code (xfail,
strict: a fix makes it pass, and then the mark must go)."""

import json
import math
import shutil
import warnings

import pandas as pd
import pytest

from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.results import study
from dpgrid.runner import train

from .conftest import load_cfg

SMALL = {"grid.k": 2, "train.seeds": 1, "train.epochs": 1}


def spec_of(ledger, strategy="fixed_threshold", dataset="digits", **extra):
    return compile(load_cfg(dataset, strategy, **{**SMALL, "privacy.study_ledger": str(ledger), **extra}))


def entries(ledger) -> list:
    return [e for folder in sorted(ledger.iterdir()) if folder.is_dir() for e in study.read_entries(folder)]


def composed(ledger, delta=1e-5) -> float:
    return study.composed(study.accounts_of(entries(ledger)), delta)["rdp"]


@pytest.mark.parametrize("how", ["folder deleted", "overwrite=true"])
def test_a_secure_grid_trained_again_in_its_directory_is_counted_again(tmp_path, how):
    """privacy.secure_rng=true: training the grid again draws new batches and noise, a second release on the same
    data, which dpgrid itself says spends a new (epsilon, delta). The study's ledger must compose both."""
    ledger, grid = tmp_path / "ledger", tmp_path / "grid"
    spec = spec_of(ledger, **{"privacy.secure_rng": "true"})
    train(spec, grid, progress=False)
    first = (grid / "runs.csv").read_text()
    if how == "folder deleted":
        shutil.rmtree(grid)
        train(spec, grid, progress=False)
    else:
        lines = first.splitlines(keepends=True)
        (grid / "runs.csv").write_text("".join(lines[:-1]))  # a run lost: the same command refuses, overwrite=true
        with warnings.catch_warnings():                      # starts a new release
            warnings.simplefilter("ignore")
            train(spec_of(ledger, **{"privacy.secure_rng": "true", "overwrite": "true"}), grid, progress=False)
    assert (grid / "runs.csv").read_text().splitlines()[1:] != first.splitlines()[1:]  # trained again, new noise
    once = spec.plan.epsilon_with_seeds
    assert composed(ledger, spec.plan.delta) > 1.2 * once, \
        f"two releases on the same data, the study composes {composed(ledger, spec.plan.delta):.4g} (one: {once:.4g})"


def test_a_grid_whose_release_no_epsilon_covers_makes_the_study_infinite(tmp_path):
    """The PUR track's logistic task evaluates its risk on the training set and standardises with its statistics:
    the release claims no epsilon (model.json's covered_by is null). The study's whole cost is then unbounded, as with
    a non-private grid."""
    from dpgrid.data import tasks

    spec = spec_of(tmp_path / "ledger", "pur", "breast_cancer")
    assert tasks.get(spec.dataset.task).disclosure  # what the release's statement reads: no epsilon covers it
    study.enter(spec, tmp_path / "grid", {})
    assert math.isinf(composed(tmp_path / "ledger", spec.plan.delta)), \
        f"the ledger counts this grid as epsilon = {entries(tmp_path / 'ledger')[0]['epsilon']:.4g}"


def test_the_same_training_file_is_one_dataset_whatever_public_files_are_read_beside_it(tmp_path):
    """dataset=ag_news with dataset.load.glove=PATH reads GloVe's file beside AG News's; without it, the packaged
    vectors. Both train on the same private examples, so they are one dataset's spending; another training file is
    another dataset."""
    from dpgrid.data import fingerprint
    from dpgrid.data.datasets import load_ag_news

    root = tmp_path / "data"
    (root / "ag_news_csv").mkdir(parents=True)
    rows = ['"1","Wall St. rises","Stocks climbed on Monday"', '"2","Team wins final","The home side scored twice"',
            '"3","New chip unveiled","A faster processor ships"', '"4","Rain expected","Storms move east"']
    (root / "ag_news_csv" / "train.csv").write_text("\n".join(rows * 3) + "\n")
    (root / "ag_news_csv" / "test.csv").write_text("\n".join(rows) + "\n")
    glove = tmp_path / "glove.txt"
    glove.write_text("\n".join(f"{w} " + " ".join(["0.1"] * 50) for w in ("stocks", "team", "chip", "rain")) + "\n")

    def identity(data):
        files = study.training_files(fingerprint(data.files), data.train_files)
        return study.data_identity(None, files, len(data.x_train))

    with_glove, packaged = load_ag_news(root, glove=str(glove)), load_ag_news(root)
    assert set(with_glove.files) != set(packaged.files)  # GloVe's file read beside the first
    before = identity(packaged)
    assert identity(with_glove) == before
    (root / "ag_news_csv" / "train.csv").write_text("\n".join(rows * 2) + "\n")
    assert identity(load_ag_news(root)) != before


def test_a_study_budget_counts_the_grids_already_on_the_data(tmp_path):
    """Grids run before a study was named trained on the same private data. A new study name must not start a fresh
    budget silently: the grid that would take the data's composed epsilon past the budget is refused (or the line
    says what the budget leaves out, and only dpgrid budget --forget forgets)."""
    ledger = tmp_path / "ledger"
    study.enter(spec_of(ledger), tmp_path / "a", {})  # a grid at epsilon 3, no study name
    named = spec_of(ledger, "online", **{"privacy.study": "final", "privacy.study_budget": 3.5})
    refused = False
    try:
        study.enter(named, tmp_path / "b", {})
    except DpgridError:
        refused = True
    assert refused, (f"admitted: the data's ledger now composes epsilon = {composed(ledger):.3g} past "
                     "privacy.study_budget=3.5")


def test_a_grid_split_across_directories_is_counted_once(tmp_path):
    """grid.only splits one grid (one noise plan, each configuration trained once) across jobs; written into two
    directories, the ledger holds the whole grid twice."""
    ledger = tmp_path / "ledger"
    parts = [spec_of(ledger, **{"grid.only": f"[{c}]"}) for c in ("lr0_clip0", "lr1_clip1")]
    for n, part in enumerate(parts):
        study.enter(part, tmp_path / f"part{n}", {})
    assert composed(ledger) == pytest.approx(parts[0].plan.epsilon_with_seeds, rel=0.01), \
        f"one grid of epsilon {parts[0].plan.epsilon_with_seeds:.3g} composed as {composed(ledger):.3g}"


def test_a_damaged_entry_is_forgotten_as_its_refusal_says(tmp_path, capsys):
    """A damaged entry refuses every grid on its dataset: "restore it from a copy, or forget it (dpgrid budget
    --forget)". That command must then work."""
    from dpgrid.commands.budget import budget_command

    ledger = tmp_path / "ledger"
    study.enter(spec_of(ledger), tmp_path / "a", {})
    (folder,) = [p for p in ledger.iterdir() if p.is_dir()]
    (folder / "entry-0000000000000000.json").write_text('{"dataset": "dig')  # torn by hand, or a disk fault
    with pytest.raises(DpgridError, match="dpgrid budget --forget"):
        study.enter(spec_of(ledger, "online"), tmp_path / "b", {})
    try:
        budget_command(["--forget", "--ledger", str(ledger)])
    except DpgridError as refused:
        assert False, f"dpgrid budget --forget refuses: {refused}"
    assert not list(folder.glob(study.ENTRY))


def test_a_subsample_tunings_reported_score_is_the_report_halfs(tmp_path):
    """data.validation=test_half: every reported score is measured on the half that chose nothing. A subsample
    tuning's released final score (selection.json, the tables, the console) too."""
    from dpgrid.reporting.grids import grid_row

    spec = spec_of(tmp_path / "ledger", **{"data.validation": "test_half", "privacy.selection": "subsample_tuning",
                                           "privacy.tuning_rate": 0.5, "train.seeds": 2, "train.epochs": 2})
    trained = train(spec, tmp_path / "grid", progress=False)
    runs = pd.read_csv(tmp_path / "grid" / "runs.csv")
    final = runs[(runs.phase == "final") & ~runs.diverged.astype(bool)]
    reported, chosen_on = final.report_value.mean(), final.best_value.mean()
    assert reported != pytest.approx(chosen_on)  # the two halves' numbers differ here: the test can tell them apart
    released = json.loads((tmp_path / "grid" / "selection.json").read_text())["final"]["score"]
    row = grid_row(tmp_path / "grid")
    assert row["validation"] == "test_half"  # what the tables' note then says of the value
    assert (released, row["value"], trained.final["score"]) == pytest.approx((reported,) * 3), \
        f"reported {released:.4g} (the selection half's best values' mean), the report half measured {reported:.4g}"


def test_a_tracker_publishes_the_report_halfs_score_under_test_half():
    """data.validation=test_half: what a tracker (MLflow, TensorBoard) shows as the grid's best configuration's score
    is a reported score, and must be the report half's, as the tables' and model.json's are."""
    from dpgrid.tracking.published import best_of

    summary = pd.DataFrame([{"config_id": "lr0_clip0", "mean": 91.0, "std": 1.0, "report_mean": 88.5,
                             "report_std": 1.5, "best": True}])
    published = best_of(summary)
    assert 88.5 in published.values() and 91.0 not in published.values(), \
        f"published {published}: the selection half's mean as the best score"


def test_an_earlier_dpgrids_entry_is_read_not_called_damaged(tmp_path):
    """A ledger written by the dpgrid before entries were named by their release (one per run directory) is composed
    as it was written, not refused as damaged."""
    ledger = tmp_path / "ledger"
    spec = spec_of(ledger)
    study.enter(spec, tmp_path / "grid", {})
    (path,) = [p for folder in ledger.iterdir() for p in folder.glob(study.ENTRY)]
    earlier = json.loads(path.read_text())
    del earlier["release"]
    path.write_text(json.dumps(earlier))
    (found,) = entries(ledger)
    assert found["epsilon"] == pytest.approx(spec.plan.epsilon_with_seeds)
    assert composed(ledger, spec.plan.delta) == pytest.approx(spec.plan.epsilon_with_seeds, rel=0.02)
