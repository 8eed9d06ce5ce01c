"""scripts/reproduce.py --paper-cells: the paper's best configuration of each cell, found in dpgrid's grid."""

import shlex
from pathlib import Path

import pandas as pd
import pytest

from .command import dpgrid
from .conftest import script_module
from .test_data import make_idx_root

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce.py"


@pytest.fixture(scope="module")
def reproduce():
    return script_module(SCRIPT, "reproduce")


def test_each_paper_cell_trains_the_configuration_the_paper_reports(reproduce):
    cells, skipped = reproduce.paper_cells("mnist", [9], [], only_epsilons=[3, 9], only_strategies=[
        "online", "fixed_threshold", "fixed_quantile", "adamwosm", "dpadam", "nodp"])
    ids = {(name, eps): config_id for name, eps, k, config_id, *_ in cells}
    # Table 8: online rho0 = 0.316 and 1.0; fixed_threshold (0.1, 0.1) and (0.00316, 10);
    # fixed_quantile (0.00316, 0.5) and (0.00316, 0.7); adamwosm C = 10 and 31.6 (grid 10^-2.5..10^1.5, 10^-2..10^2)
    assert ids == {("online", 3): "lr4", ("online", 9): "lr5", ("fixed_threshold", 3): "lr3_clip2",
                   ("fixed_threshold", 9): "lr0_clip6", ("fixed_quantile", 3): "lr0_q2", ("fixed_quantile", 9): "lr0_q3",
                   ("adamwosm", 3): "clip6", ("adamwosm", 9): "clip7"}
    assert {k for _, _, k, *_ in cells} == {9} and all(steps == 1172 for *_, steps, _ in cells)
    assert skipped == ["mnist dpadam k=9: not one of the paper's strategies; skipped"]


def test_cells_the_paper_does_not_report_are_named_and_skipped(reproduce):
    cells, skipped = reproduce.paper_cells("fashion_mnist", [9, 7], [], only_strategies=["fixed_quantile"])
    assert [eps for _, eps, *_ in cells] == [2, 3, 4]
    assert skipped == ["fashion_mnist fixed_quantile eps=1 k=9: the paper reports no value (diverged in the paper); "
                       "skipped",
                       "fashion_mnist k=7: the paper reports no values at this k (Tables 8-13 have k = 9 and 5)"]
    cells, skipped = reproduce.paper_cells("mnist", [9], [], only_strategies=["online"], only_epsilons=[4])
    assert not cells and skipped == ["mnist online eps=4 k=9: the paper reports no value (not in the paper's "
                                     "tables); skipped"]


@pytest.mark.slow
def test_paper_cells_runs_one_cell_and_ends_with_the_comparison(reproduce, tmp_path, capsys):
    make_idx_root(tmp_path, "MNIST", n_train=60)
    out = tmp_path / "results"
    argv = ["mnist", "--paper-cells", "--k", "9", "--seeds", "1", "--strategies", "online", "--epsilons", "3",
            "--jobs", "1", "--data-root", str(tmp_path), "--results", str(out), "--", "train.epochs=1",
            "train.batch_size=2", "dataset.n_train=60"]  # q = 1/30 calibrates in a second; N as the run loads it
    assert reproduce.main(argv, dpgrid=lambda command, threads: dpgrid(*command[1:])) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("mnist: 1 paper cells x 1 seeds = 1 training runs; about ")
    runs = pd.read_csv(out / "mnist" / "online" / "eps3" / "k9" / "runs.csv")
    assert runs.config_id.tolist() == ["lr4"] and (runs.protocol == "paper").all()
    md = (out / "tables" / "mnist_k9_vs_paper.md").read_text()
    assert "| 3 | Online | ρ=0.316 | 90.69 ± 0.53 | ρ=0.316 (1 of 9 configurations run) |" in md
    # a second call resumes: the run is not trained again
    assert reproduce.main(argv, dpgrid=lambda command, threads: dpgrid(*command[1:])) == 0
    again = pd.read_csv(out / "mnist" / "online" / "eps3" / "k9" / "runs.csv")
    assert again.seconds.tolist() == runs.seconds.tolist()


@pytest.mark.slow  # composes and plans MNIST grids twice (4 s)
def test_paper_cells_on_slurm_submit_each_cell_into_the_same_tree(reproduce, tmp_path, capsys):
    """--paper-cells --launcher slurm: each cell a one-job sweep whose folder (hydra.sweep.subdir) is the folder
    the cell has on this machine, so a cluster's cells and a local one's resume and tabulate alike."""
    from dpgrid.api import compose

    argv = ["mnist", "--paper-cells", "--k", "9", "--strategies", "online", "--epsilons", "3", "--dry-run",
            "--results", str(tmp_path)]
    reproduce.main(argv)
    local = [shlex.split(line[2:]) for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    reproduce.main([*argv, "--launcher", "slurm"])
    slurm = [shlex.split(line[2:]) for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(local) == len(slurm) == 1 and slurm[0][:4] == ["dpgrid", "run", "-m", "hydra/launcher=slurm"]
    run_dir = next(a for a in local[0] if a.startswith("hydra.run.dir=")).split("=", 1)[1]
    cfg = compose([a for a in slurm[0][4:]], with_hydra=True)
    assert str(tmp_path / cfg.hydra.sweep.subdir) == run_dir and cfg.hydra.sweep.dir == str(tmp_path)


@pytest.mark.slow  # plans every MNIST grid at k = 9 (4 s)
def test_with_a_launcher_the_baselines_sweep_is_submitted_beside_the_private_one(reproduce, tmp_path, monkeypatch):
    events = []

    class Process:
        def __init__(self, command):
            events.append(("start", command[3] if command[1] == "run" else command[1]))

        def wait(self):
            events.append(("wait",))
            return 0

    monkeypatch.setattr(reproduce.subprocess, "Popen", Process)
    monkeypatch.setattr(reproduce.subprocess, "run", lambda command, check: events.append(("run", command[1])))
    reproduce.main(["mnist", "--k", "9", "--launcher", "slurm", "--results", str(tmp_path)])
    assert [e[0] for e in events] == ["start", "start", "wait", "wait", "run"]  # both queued, then waited on
    assert events[1][1].startswith("strategy=") and "nodp" in events[1][1] and events[-1] == ("run", "tables")


@pytest.mark.slow  # plans 13 grids (6 s)
def test_a_cell_that_cannot_be_planned_is_skipped_and_the_rest_is_swept(reproduce, capsys, monkeypatch):
    """digits at k = 9 and epsilon = 3: fixed_quantile's count noise cannot carry the noise its grid of 45 needs.
    The reproduction says so in one line and sweeps every other cell, none of them twice (three strategies of the
    option group: the one that cannot be planned, one that can, and a baseline)."""
    monkeypatch.setattr(reproduce, "options", lambda group: ["fixed_quantile", "online", "nodp"])
    found = reproduce.grids("digits", [7, 9], [])
    out = capsys.readouterr().out
    assert out.count("skipped:") == 1 and "skipped: fixed_quantile k=9 epsilon=3:" in out, out
    cells = [(name, e, k) for names, epsilons, ks in reproduce.private_sweeps(found)
             for name in names for e in epsilons for k in ks]
    assert len(cells) == len(set(cells)) and ("fixed_quantile", 3.0, 9) not in cells
    assert ("fixed_quantile", 5.0, 9) in cells and ("fixed_quantile", 3.0, 7) in cells and ("online", 3.0, 9) in cells
