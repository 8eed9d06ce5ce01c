"""What the console, the plan and the SLURM launcher say, word for word where a word was wrong: a run whose T equals
its validation interval, a LoRA grid that train.trainable did not freeze, a checkpoint trained on other data, the
memory sbatch reads, a time limit, a cancelled job's resume said once."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from dpgrid.config import compile

from .command import dpgrid
from .conftest import load_cfg

ONE_EPOCH = {"grid.k": 2, "train.seeds": 1, "train.epochs": 1}


@pytest.mark.parametrize("steps, eval_every, said", [(50, 50, "equals a run's T = 50"), (40, 50, "is more than a run's T = 40"),
                                                     (51, 50, None)])
def test_a_run_validated_once_is_warned_about_when_t_equals_its_interval(steps, eval_every, said):
    spec = compile(load_cfg("digits", "online", **{"grid.k": 2, "train.steps": steps, "train.eval_every": eval_every}),
                   1437)
    once = [w for w in spec.warnings if "validated once" in w]
    assert (once[0].startswith(f"train.eval_every={eval_every} {said} steps") if said else not once), once
    assert not any("shorter than" in w for w in spec.warnings)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from dpgrid.models import mlp

    path = tmp_path_factory.mktemp("start") / "start.safetensors"
    torch.manual_seed(3)
    save_file({name: t.contiguous() for name, t in mlp().state_dict().items()}, str(path))
    return path


def test_a_lora_grid_says_its_adapters_keep_it_from_stacking_not_train_trainable(checkpoint):
    r = dpgrid("plan", *(f"{k}={v}" for k, v in ONE_EPOCH.items()), f"model.init={checkpoint}", "model.lora.rank=2",
               'model.lora.targets=["0"]')
    assert r.returncode == 0, r.stderr
    line = next(line for line in r.stdout.splitlines() if "train.parallel_runs=" in line)
    assert "LoRA adapters (model.lora.rank)" in line and "train.trainable" not in line, line
    r = dpgrid("plan", *(f"{k}={v}" for k, v in ONE_EPOCH.items()), "train.trainable=[2.*]")
    line = next(line for line in r.stdout.splitlines() if "train.parallel_runs=" in line)
    assert "part of the model is frozen (train.trainable)" in line, line


def test_a_plan_from_a_checkpoint_of_other_data_never_speaks_of_the_same_data(checkpoint):
    r = dpgrid("plan", *(f"{k}={v}" for k, v in ONE_EPOCH.items()), f"model.init={checkpoint}",
               "model.init_covered_by={epsilon: 1.5, delta: 1e-6, dataset: clinic}")
    assert r.returncode == 0, r.stderr
    start = next(line for line in r.stdout.splitlines() if f"from {checkpoint}" in line)
    assert "on clinic" in start and "the same data" not in r.stdout
    assert "the release is covered by both grids together (model.init_disjoint=true declares" in start


# --- SLURM's words (the sweeps themselves: tests/test_launchers.py) -------------------------------------------------

@pytest.mark.parametrize("memory, advice", [
    ("4GB", "for hydra.launcher.mem=4GB set hydra.launcher.mem_gb=4"),
    ("4g", "set hydra.launcher.mem_gb=4"),
    ("1536MB", "set hydra.launcher.mem_gb=2 (1536MB rounded up to whole gigabytes)"),
    ("8", "would ask SLURM for 8 megabytes (sbatch's --mem); set hydra.launcher.mem_gb=8 for gigabytes"),
    ("lots", "is not memory sbatch reads"),
])
def test_memory_is_advised_as_a_whole_number_of_gigabytes(memory, advice):
    from dpgrid.commands.sweep import memory_refusal

    said = memory_refusal(memory)
    assert advice in said, said
    for value in [w.split("=", 1)[1].rstrip(",;)") for w in said.split() if w.startswith("hydra.launcher.mem_gb=")]:
        assert value.isdigit(), said  # every mem_gb it advises is one the launcher takes


def test_a_time_out_names_the_limit_it_had_not_a_value_to_set():
    from dpgrid.commands.launchers import ended_why

    said = ended_why(RuntimeError("Job not requeued because: timed-out too many times."), 3)
    assert said == " ran out of time (its limit, hydra.launcher.timeout_min, was 3 minutes: raise it)"
    assert "timeout_min=" not in said


def test_a_cancelled_jobs_resume_is_said_once(tmp_path):
    """A grid stopped by scancel says "the same command resumes it" in its log; the submitter's line, which quotes it,
    says that once for every job."""
    from dpgrid.commands.launchers import outcomes

    def job(i):
        log = tmp_path / f"{i}.err"
        log.write_text(f"dpgrid: error: SIGTERM: the grid in /x/eps{i} is incomplete; the same command resumes it\n")
        return SimpleNamespace(job_id=f"4400_{i}", state="CANCELLED", paths=SimpleNamespace(
            result_pickle=Path(tmp_path / "none.pkl"), stderr=log), stderr=log.read_text)

    from dpgrid import DpgridError

    with pytest.raises(DpgridError) as refused:
        outcomes([job(0), job(1)], [[["privacy.epsilon=3"]], [["privacy.epsilon=5"]]], 60, True)
    said = str(refused.value)
    assert said.count("the same command resumes") == 1, said
    assert "SIGTERM: the grid in /x/eps0 is incomplete" in said and said.endswith(
        "the same command resumes them (finished runs are kept)")
