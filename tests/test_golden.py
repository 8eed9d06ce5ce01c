"""The regression guard: every built-in strategy reproduces tests/golden/ on any CPU.

The golden grids are recorded and replayed in float64 (`train.float64=true`, tests/golden/record.py).
Between CPUs, BLAS builds and thread counts they then differ by rounding alone: at most 1.4e-14 relative
after an epoch, measured against torch's portable kernels (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE)
and under 1, 2 and 4 threads. RTOL sits five orders of magnitude above that and far below what a change
to the algorithm moves: the perturbation tests below change one thing each and see the guard fail.
Integers, flags and names compare exactly; timing columns are not compared; columns added later are
allowed (only the recorded ones must match)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dpgrid.strategies.base import Strategy, flat_like, standard_normal

from .command import dpgrid
from .conftest import script_module

GOLDEN = Path(__file__).resolve().parent / "golden"
TIMING = ("seconds", "eval_seconds")
RTOL = 1e-9
STRATEGIES = sorted(p.name for p in GOLDEN.iterdir() if (p / "runs.csv").exists())

pytestmark = pytest.mark.slow  # trains every built-in strategy's golden grid (about 30 s)


def recorder():
    return script_module(GOLDEN / "record.py", "record")


def in_this_process(*args):
    result = dpgrid(*args)
    assert result.returncode == 0, result.stderr


def differences(golden_dir: Path, now_dir: Path, files) -> list:
    """What differs between a golden grid and a new one: one line per column, [] when they agree."""
    found = []
    for file in files:
        golden = pd.read_csv(golden_dir / file, dtype={"config_id": str})
        now = pd.read_csv(now_dir / file, dtype={"config_id": str})
        if len(now) != len(golden):
            found.append(f"{file}: {len(now)} rows, golden {len(golden)}")
            continue
        for column in (c for c in golden.columns if c not in TIMING):
            if column not in now.columns:
                found.append(f"{file}: column {column} is gone")
            elif golden[column].dtype.kind == "f" and now[column].dtype.kind in "fi":
                a, b = golden[column].to_numpy(float), now[column].to_numpy(float)
                bad = ~np.isclose(b, a, rtol=RTOL, atol=0, equal_nan=True)
                if bad.any():
                    i = int(np.argmax(bad))
                    found.append(f"{file}: {column} row {i}: {b[i]!r}, golden {a[i]!r} ({int(bad.sum())} rows)")
            elif not golden[column].astype(str).equals(now[column].astype(str)):
                found.append(f"{file}: {column} differs")
    return found


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    record = recorder()
    assert set(STRATEGIES) == set(record.strategies()), "a built-in strategy has no golden data: run tests/golden/record.py"
    return record.run_all(tmp_path_factory.mktemp("golden"), STRATEGIES, in_this_process), record.FILES


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_reproduces_its_golden_data(rerun, strategy):
    folders, files = rerun
    assert differences(GOLDEN / strategy, folders[strategy], files) == []


def reversed_noise_order(self, sums, std):
    """The noise drawn for the last parameter first: the same distribution, another draw order."""
    flat, views = flat_like(sums)
    for view in reversed(views):
        standard_normal(view.shape, self.generator, flat.device, flat.dtype, out=view)
    flat.mul_(std / self.batch_size)
    for view, s in zip(views, sums):
        view.add_(s, alpha=1 / self.batch_size)
    return flat, views


def normalised_not_clipped(self, norms):
    """w_i = C / n_i for every sample: gradients scaled up to C as well as down."""
    return self.clip / norms.clamp_min(1e-12)


def divided_by_one_more(self, *args, **kwargs):
    """Every noisy sum divided by B + 1 instead of the expected batch size B."""
    Strategy.__dict__["unchanged_init"](self, *args, **kwargs)
    self.batch_size += 1


@pytest.mark.parametrize("attribute, change", [("noisy_mean_flat", reversed_noise_order),
                                               ("clip_weights", normalised_not_clipped),
                                               ("__init__", divided_by_one_more)],
                         ids=["noise draw order", "clip rule", "divisor"])
def test_the_guard_fails_on_a_real_change(tmp_path, monkeypatch, attribute, change):
    """(One run at a time, the form the changes are written for: the golden grids themselves train stacked, and
    tests/test_stacked.py shows both forms give the same numbers.)"""
    record = recorder()
    monkeypatch.setattr(Strategy, "unchanged_init", Strategy.__init__, raising=False)
    monkeypatch.setattr(Strategy, attribute, change)
    folders = record.run_all(tmp_path, ["fixed_threshold"], in_this_process, ["train.parallel_runs=1"])
    found = differences(GOLDEN / "fixed_threshold", folders["fixed_threshold"], record.FILES)
    assert any("test_loss" in line for line in found), found


def test_float64_grids_train_in_float64(tmp_path, monkeypatch):
    """The golden data means something only if train.float64 reaches the model, the data and the noise."""
    seen = []
    step = Strategy.descend

    def spy(self, direction, lr):
        seen.append({p.dtype for p in self.params} | {d.dtype for d in direction} | {self.clip.dtype, self.lr.dtype})
        return step(self, direction, lr)

    monkeypatch.setattr(Strategy, "descend", spy)
    in_this_process("run", "strategy=fixed_threshold", "grid.k=2", "train.epochs=1", "train.seeds=1",
                    "train.float64=true", f"hydra.run.dir={tmp_path}")
    assert seen and all(dtypes == {torch.float64} for dtypes in seen)
