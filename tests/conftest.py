import os
import tempfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


COMPOSED = {}  # the overrides -> their composed config: composing is a pure function of them, and costs 0.2 s


def load_cfg(dataset="digits", strategy="online", **overrides):
    """The composed config without Hydra's machinery (tests that need `dpgrid run` use the CLI); each test gets its
    own copy."""
    import copy

    from dpgrid.api import compose

    args = (f"dataset={dataset}", f"strategy={strategy}", *(f"{k}={v}" for k, v in overrides.items()))
    if args not in COMPOSED:
        COMPOSED[args] = compose(list(args))
    return copy.deepcopy(COMPOSED[args])


TRAINED = {}  # (strategy, overrides) -> (spec, a folder holding that grid as trained): this worker's, kept for its tests


def trained_grid(folder: Path, strategy="fixed_threshold", **overrides):
    """(spec, folder): the digits grid of `strategy` with `overrides`, trained once per test worker and copied into
    `folder` for each test that asks (a test edits its copy as it likes; the grid is seeded, so a copy is what
    training it again would write)."""
    import shutil

    from dpgrid.config import compile
    from dpgrid.runner import train

    key = (strategy, tuple(sorted((k, str(v)) for k, v in overrides.items())))
    if key not in TRAINED:
        spec = compile(load_cfg("digits", strategy, **overrides))
        source = Path(tempfile.mkdtemp(prefix="dpgrid-trained-")) / "grid"
        train(spec, source, progress=False)
        TRAINED[key] = spec, source
    spec, source = TRAINED[key]
    shutil.copytree(source, folder)
    return spec, folder


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


def script_module(path: Path, name: str):
    """A file that is not part of the package (a script, a recorder), imported as module `name`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fast_layer_runs(cases, *fast):
    """A parametrised matrix whose cases in `fast` run in the fast layer and the rest carry the `slow` marker: the
    fast layer checks the property once (a check after every edit), the slow layer across the whole matrix. The
    test ids are those of the plain list."""
    return [case if case in fast else pytest.param(*(case if isinstance(case, tuple) else (case,)),
                                                   marks=pytest.mark.slow) for case in cases]


__all__ = ["load_cfg", "OmegaConf", "strategy_class", "fast_layer_runs", "script_module"]


MADE = []  # the temporary folders this process made for the session, removed as it ends


def pytest_unconfigure(config):
    import shutil

    for folder in [*MADE, *(str(source.parent) for _, source in TRAINED.values())]:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    """The noise searches' and the features' caches and the study's ledger in folders of this session (shared by its
    processes), not the user's; and the CPU as every grid's default device: the tests that compare numbers (golden
    data, stacked against one at a time, kill and resume) compare the CPU's, and the CUDA tests (tests/test_cuda.py) say train.device=cuda."""
    if "DPGRID_CACHE" not in os.environ:  # the first process of the session makes it, its workers inherit it
        MADE.append(tempfile.mkdtemp(prefix="dpgrid-noise-"))
        os.environ["DPGRID_CACHE"] = MADE[-1]
    if "DPGRID_TEST_LEDGER" not in os.environ:  # the study's ledger of every grid the tests train: the session's
        MADE.append(tempfile.mkdtemp(prefix="dpgrid-ledger-"))
        os.environ["DPGRID_TEST_LEDGER"] = os.environ["DPGRID_LEDGER"] = MADE[-1]
    if "DPGRID_FEATURES" not in os.environ:  # a fixed stage's features (dpgrid.data.features): never the user's cache
        MADE.append(tempfile.mkdtemp(prefix="dpgrid-features-"))
        os.environ["DPGRID_FEATURES"] = MADE[-1]
    os.environ["DPGRID_DEVICE"] = "cpu"
    # one torch thread per test process (pytest-xdist starts one per core): more would contend for the same cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# ---- the fast layer's guards (README: `python -m pytest -q -m "not slow"`, a check after every edit)
FAST_TEST_SECONDS = 3.0  # a fast test over this is made cheaper or moved to the slow layer
CALL_SECONDS = {}        # nodeid -> its call's seconds, as the workers report them


def starts_dpgrid(args) -> bool:
    """Whether a command line is a dpgrid process: the `dpgrid` command, `python -m dpgrid[.cli]`, or
    tests/paused.py (a dpgrid command paused at a point)."""
    import shlex

    words = shlex.split(args) if isinstance(args, str) else [str(a) for a in (args if isinstance(args, (list, tuple))
                                                                               else [args])]
    if not words:
        return False
    module = words[words.index("-m") + 1] if "-m" in words[:-1] else ""
    return (Path(words[0]).name == "dpgrid" or module == "dpgrid" or module.startswith("dpgrid.")
            or any(Path(w).name == "paused.py" for w in words))


@pytest.fixture(autouse=True)
def fast_tests_start_no_dpgrid_process(request, monkeypatch):
    """A test of the fast layer calls `dpgrid` in its own process (tests/command.py); one that starts a dpgrid
    process (a kill, a signal, the installed entry point) carries the `slow` marker, or fails here."""
    import subprocess

    if request.node.get_closest_marker("slow"):
        return
    real = subprocess.Popen

    class FastLayerPopen(real):
        def __init__(self, args, *rest, **kwargs):
            if starts_dpgrid(args):
                raise AssertionError(f"{request.node.nodeid} starts a dpgrid process ({args!r}): mark it "
                                     "@pytest.mark.slow, or call tests/command.py's dpgrid() in this process")
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", FastLayerPopen)


def pytest_runtest_logreport(report):
    if report.when == "call":
        CALL_SECONDS[report.nodeid] = report.duration


def pytest_terminal_summary(terminalreporter, config):
    """The fast layer's slowest tests, and any over FAST_TEST_SECONDS, after every run of `-m "not slow"`."""
    if "not slow" not in (config.getoption("markexpr") or "") or not CALL_SECONDS:
        return
    slowest = sorted(CALL_SECONDS.items(), key=lambda kv: -kv[1])[:10]
    terminalreporter.section("the fast layer's slowest tests")
    for nodeid, seconds in slowest:
        flag = f"  (over {FAST_TEST_SECONDS:g} s: make it cheaper or mark it slow)" if seconds > FAST_TEST_SECONDS else ""
        terminalreporter.write_line(f"{seconds:6.2f} s  {nodeid}{flag}")
