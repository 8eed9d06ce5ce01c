"""train.threads: chosen for the work and the cores this job may use, recorded in every row, restored after."""

import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from dpgrid.commands.jobs import parallel_jobs
from dpgrid.training import threads

from .conftest import load_cfg


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)


def test_auto_gives_tiny_models_one_thread_and_shares_the_cores_among_parallel_jobs(four_cores):
    assert threads.choose("auto", 2_410) == 1               # the digits MLP: overhead-bound
    assert threads.choose("auto", 551_322) == 4             # the MNIST CNN: every core this process may use
    assert threads.choose("auto", 551_322, parallel_jobs=2) == 2
    assert threads.choose("auto", 551_322, parallel_jobs=8) == 1
    assert threads.choose("3", 2_410) == 3                  # train.threads=N is taken as set


def test_auto_stays_within_a_slurm_allocation(four_cores, monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    assert threads.available_cores() == 2 and threads.choose("auto", 551_322) == 2


def test_a_launchers_parallel_jobs():
    joblib = OmegaConf.create({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
                               "n_jobs": 2})
    basic = OmegaConf.create({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"})
    slurm = OmegaConf.create({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
                              "cpus_per_task": 4})
    assert parallel_jobs(joblib) == 2 and parallel_jobs(basic) == 1 and parallel_jobs(slurm) == 1


@pytest.mark.parametrize("setting, expected", [("auto", 1), ("2", 2)])
def test_rows_record_the_threads_and_the_process_gets_its_own_back(tmp_path, setting, expected):
    import dpgrid

    before = torch.get_num_threads()
    cfg = load_cfg("digits", "fixed_threshold", **{"grid.k": 2, "train.epochs": 1, "train.seeds": 1,
                                                  "train.threads": setting})
    dpgrid.run_grid(cfg, tmp_path / "grid", progress=False)
    assert torch.get_num_threads() == before
    assert pd.read_csv(tmp_path / "grid" / "runs.csv").threads.tolist() == [expected] * 4


def test_threads_do_not_change_the_config_hash():
    from dpgrid.config import settings_of
    from dpgrid.config.identity import config_hash

    assert config_hash(settings_of(load_cfg())) == config_hash(settings_of(load_cfg(**{"train.threads": 2})))


FREED_KEPT = """
import ctypes, sys
from dpgrid.training.threads import glibc, keep_freed_memory

class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = glibc()
libc.mallinfo2.restype, libc.malloc.restype, libc.free.argtypes = Info, ctypes.c_void_p, [ctypes.c_void_p]
done = keep_freed_memory() if sys.argv[1] == "kept" else ""
block = libc.malloc(24 << 20)  # a CNN activation's size at B = 512
libc.free(block)
print(done != "", libc.mallinfo2().fordblks >= (24 << 20))  # the freed block stays in the heap, for reuse
"""


@pytest.mark.parametrize("mode", ["kept", "default"])
def test_freed_memory_is_kept_for_reuse_only_when_asked(mode):
    from dpgrid.training.threads import glibc

    if glibc() is None or not hasattr(glibc(), "mallinfo2"):
        pytest.skip("glibc >= 2.33 only")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", FREED_KEPT, mode], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == (["True", "True"] if mode == "kept" else ["False", "False"])


def test_an_allocator_the_user_chose_is_left_alone(monkeypatch):
    from dpgrid.training.threads import keep_freed_memory

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_memory() == ""
