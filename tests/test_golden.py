"""The regression guard: every built-in strategy reproduces tests/golden/ bit for bit on CPU.

The golden files were recorded by tests/golden/record.py; timing columns are not compared, and
columns added later are allowed (only the recorded ones must be equal)."""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from .command import dpgrid

GOLDEN = Path(__file__).resolve().parent / "golden"
TIMING = ("seconds", "eval_seconds")


def recorder():
    spec = importlib.util.spec_from_file_location("record", GOLDEN / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    record = recorder()
    names = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and (p / "runs.csv").exists())
    assert set(names) == set(record.strategies()), "a built-in strategy has no golden data: run tests/golden/record.py"
    def in_this_process(*args):
        assert dpgrid(*args).returncode == 0

    return record.run_all(tmp_path_factory.mktemp("golden"), names, in_this_process), record.FILES


@pytest.mark.parametrize("strategy", sorted(p.name for p in GOLDEN.iterdir() if (p / "runs.csv").exists()))
def test_strategy_reproduces_its_golden_data_bit_for_bit(rerun, strategy):
    folders, files = rerun
    for file in files:
        golden = pd.read_csv(GOLDEN / strategy / file, dtype={"config_id": str})
        now = pd.read_csv(folders[strategy] / file, dtype={"config_id": str})
        columns = [c for c in golden.columns if c not in TIMING]
        missing = [c for c in columns if c not in now.columns]
        assert not missing, f"{strategy}/{file} lost columns {missing}"
        pd.testing.assert_frame_equal(now[columns], golden[columns], check_exact=True)
