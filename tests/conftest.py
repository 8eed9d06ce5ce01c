import os
import tempfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def load_cfg(dataset="digits", strategy="online", **overrides):
    """The composed config without Hydra's machinery (tests that need `dpgrid run` use the CLI)."""
    from dpgrid.api import compose

    args = [f"dataset={dataset}", f"strategy={strategy}"] + [f"{k}={v}" for k, v in overrides.items()]
    return compose(args)


def strategy_class(name):
    """A built-in strategy's class, resolved from its config as `dpgrid run` resolves it."""
    from dpgrid.strategies import resolve
    return resolve(OmegaConf.load(ROOT / "conf" / "strategy" / f"{name}.yaml"))


@pytest.fixture(autouse=True)
def no_paused_process_outlives_its_test():
    """A test that fails while a paused dpgrid waits would leave it waiting for good: end it."""
    from .command import STARTED

    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def shared_data():
    if not (SHARED_DATA / "MNIST" / "raw").is_dir():
        pytest.skip("../shared/data is not beside this checkout")
    return SHARED_DATA


__all__ = ["load_cfg", "OmegaConf", "strategy_class"]


def pytest_configure(config):
    """The noise searches' cache in a folder of this session (shared by its processes), not the user's; and the
    CPU as every grid's default device: the tests that compare numbers (golden data, stacked against one at a
    time, kill and resume) compare the CPU's, and the CUDA tests (tests/test_cuda.py) say train.device=cuda."""
    os.environ.setdefault("DPGRID_CACHE", tempfile.mkdtemp(prefix="dpgrid-noise-"))
    os.environ["DPGRID_DEVICE"] = "cpu"
