"""Where a sweep's grids train (hydra/launcher=dpgrid, dpgrid.commands.placement), with the CUDA calls stubbed: on a
GPU as many side by side as its free memory holds (at most one per core and MAX_SIDE_BY_SIDE), on a CPU one after
another in this process as Hydra's basic launcher trains them, N at once where asked; each grid told how many share
the device, which its threads and its stacked groups' memory follow. A real side-by-side sweep on the CPU is the slow
layer's."""

import pytest
import torch
from omegaconf import OmegaConf

from dpgrid.commands import placement
from dpgrid.config import compile
from dpgrid.commands.jobs import LOCAL_LAUNCHER, parallel_jobs
from dpgrid.training.rules.convolution import WORKSPACE_BYTES

from .command import dpgrid
from .conftest import load_cfg, strategy_class

GiB = 2 ** 30


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA device with `free` bytes free (set gpu.free), 16 cores, no real CUDA call."""
    class Device:
        free, total = 80 * GiB, 80 * GiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (Device.free, Device.total))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Stub GPU")
    monkeypatch.setattr("dpgrid.training.threads.available_cores", lambda: 16)
    monkeypatch.setenv("DPGRID_DEVICE", "auto")  # the tests' default is the CPU (tests/conftest.py)
    return Device


@pytest.mark.parametrize("grids, need, free, cores, count, bound", [
    (63, 2.7, 79, 16, 8, "at most 8 per GPU"),
    (6, 2.7, 79, 16, 6, "the sweep's grids"),
    (63, 3, 10, 16, 2, "what 70% of its free memory holds"),
    (63, 2.7, 79, 3, 3, "one per core of the 3"),
    (63, 40, 30, 16, 1, "what 70% of its free memory holds"),
])
def test_a_gpu_takes_as_many_grids_as_its_free_memory_holds(gpu, monkeypatch, grids, need, free, cores, count, bound):
    gpu.free = free * GiB
    monkeypatch.setattr("dpgrid.training.threads.available_cores", lambda: cores)
    placed, line = placement.placed_on_gpu(grids, int(need * GiB), torch.device("cuda", 0))
    assert placed == count and bound in line and f"{count} side by side" in line
    assert f"about {need:.1f} GiB of the {free:.1f} GiB free" in line and "hydra.launcher.side_by_side=N" in line


def mnist_like(load):
    """dpgrid.data.load, with MNIST's sizes (60,000 + 10,000 images of 28 x 28) without its files or its memory
    (expanded zeros)."""
    def loaded(dataset, root, device="cpu"):
        return mnist(dataset, root) if dataset.name == "mnist" else load(dataset, root, device)
    return loaded


def mnist(dataset, root):
    from dpgrid.data import Data

    image = torch.zeros(1, 1, 28, 28)
    return Data(image.expand(60000, 1, 28, 28), torch.zeros(60000, dtype=torch.long),
                image.expand(10000, 1, 28, 28), torch.zeros(10000, dtype=torch.long), "classification")


def test_a_grids_device_memory_is_estimated_from_its_model_data_and_batch(gpu, monkeypatch):
    """The MNIST CNN's grid peaked at 2.5 GB on an H200 (its CUDA context included): the estimate says 2-3.5 GiB;
    a larger batch needs more, and a digits MLP grid needs little more than the context."""
    import dpgrid.data

    monkeypatch.setattr("dpgrid.data.load", mnist_like(dpgrid.data.load))
    cuda = torch.device("cuda", 0)
    def need(dataset, **overrides):
        return placement.grid_bytes(compile(load_cfg(dataset, "fixed_threshold", **overrides), plan=False), cuda, {})

    cnn = need("mnist", **{"grid.k": 5})
    assert 2.0 * GiB <= cnn <= 3.5 * GiB
    assert need("mnist", **{"train.batch_size": 2048}) > cnn + 0.5 * GiB
    mlp = need("digits")
    assert placement.CUDA_CONTEXT < mlp < placement.CUDA_CONTEXT + WORKSPACE_BYTES + 0.1 * GiB


class Loader:
    """Hydra's config loader as the launcher asks it: each job's config composed from its overrides."""

    @staticmethod
    def load_sweep_config(config, overrides):
        import dpgrid

        return dpgrid.compose(list(overrides), with_hydra=True)


def launcher(side_by_side="auto"):
    from types import SimpleNamespace

    from hydra_plugins.dpgrid_launcher import LocalLauncher

    made = LocalLauncher(side_by_side)
    made.hydra_context, made.config = SimpleNamespace(config_loader=Loader()), None
    return made


def launched(monkeypatch, made, jobs) -> list:
    """What the launcher did with `jobs` (lists of overrides): ("one after another",) or ("side by side", N)."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    said = []
    monkeypatch.setattr(BasicLauncher, "launch", lambda self, overrides, idx: said.append(("one after another",)))
    monkeypatch.setattr(placement, "in_processes", lambda self, overrides, idx, n, line: said.append(("side by side", n))
                        or print(f"dpgrid: {line}", file=__import__("sys").stderr))
    made.launch(jobs, 0)
    return said


SWEEP = [[f"strategy={s}", "grid.k=2", "train.seeds=1", "train.epochs=1"] for s in ("nodp", "fixed_threshold",
                                                                                        "online")]


def test_a_sweep_on_a_gpu_trains_its_grids_side_by_side_and_says_so(gpu, monkeypatch, capsys):
    said = launched(monkeypatch, launcher(), SWEEP)
    assert said == [("side by side", 3)]
    line = capsys.readouterr().err
    assert line.startswith("dpgrid: 3 grids on cuda") and "Stub GPU" in line and "3 side by side" in line
    gpu.free = int(1.5 * GiB)  # room for one digits grid's need (a CUDA context and a little)
    assert launched(monkeypatch, launcher(), SWEEP) == [("one after another",)]


def test_a_sweep_on_a_cpu_trains_one_grid_after_another_unless_told(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: pytest.fail("asked a CPU's GPU memory"))
    assert launched(monkeypatch, launcher(), SWEEP) == [("one after another",)]
    assert capsys.readouterr().err == ""
    assert launched(monkeypatch, launcher(2), SWEEP) == [("side by side", 2)]
    assert "3 grids, 2 side by side (hydra.launcher.side_by_side=2)" in capsys.readouterr().err
    assert launched(monkeypatch, launcher(8), SWEEP[:1]) == [("one after another",)]


def test_grids_on_the_gpu_and_the_cpu_at_once_train_one_after_another(gpu, monkeypatch):
    jobs = [SWEEP[0] + ["train.device=cpu"], SWEEP[1] + ["train.device=cuda"]]
    assert launched(monkeypatch, launcher(), jobs) == [("one after another",)]


def test_each_grid_hears_how_many_share_its_device():
    """A grid's process reads its launcher's record: its threads (train.threads=auto) and, on CUDA, its stacked
    groups' memory are shared among the grids placed beside it."""
    placed = OmegaConf.create({"_target_": LOCAL_LAUNCHER, "side_by_side": 4})
    alone = OmegaConf.create({"_target_": LOCAL_LAUNCHER, "side_by_side": "auto"})
    assert parallel_jobs(placed) == 4 and parallel_jobs(alone) == 1


def test_grids_side_by_side_on_a_gpu_share_its_memory_among_their_groups(gpu, monkeypatch):
    from dpgrid.models import build_model
    from dpgrid.training.stacked import bytes_per_run, group_size, per_sample_sizes

    words = build_model(load_cfg("ag_news", "online").model)
    per_run = bytes_per_run(words, 512, per_sample_sizes(words)[1])
    monkeypatch.setattr("dpgrid.training.stacked.available_memory", lambda device: 4 * 40 * per_run)
    online, cuda = strategy_class("online"), torch.device("cuda", 0)
    assert group_size("auto", words, online, 64, 512, cuda) == (40, "")
    assert group_size("auto", words, online, 64, 512, cuda, side_by_side=4) == (10, "")
    cpu = torch.device("cpu")  # on a CPU nothing changes (the bag-of-words trains one run at a time there anyway)
    assert group_size("auto", words, online, 64, 512, cpu, side_by_side=4) == group_size("auto", words, online, 64,
                                                                                         512, cpu)


@pytest.mark.parametrize("override, message", [
    ("+hydra.launcher.n_jobs=2", "no setting 'hydra.launcher.n_jobs' of hydra/launcher=dpgrid; its setting: "
                                 "hydra.launcher.side_by_side (auto or a number of grids)"),
    ("hydra.launcher.side_by_side=0", "hydra.launcher.side_by_side=0 is not a number of grids; valid: auto"),
    ("hydra.launcher.side_by_side=two", "hydra.launcher.side_by_side=two is not a number of grids"),
])
def test_a_launcher_setting_it_does_not_have_is_one_line(tmp_path, override, message):
    r = dpgrid("run", "-m", "strategy=nodp,online", "grid.k=2", override, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "sweep").exists()


def test_the_launcher_is_found_where_hydras_discovery_misses_it(tmp_path, monkeypatch):
    """An editable install hides the hydra_plugins namespace from Hydra's plugin discovery: `dpgrid run -m` registers
    its launcher itself, so the default sweep runs there too."""
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    monkeypatch.delitem(plugins.class_name_to_class, LOCAL_LAUNCHER, raising=False)
    r = dpgrid("run", "-m", "strategy=nodp", "grid.k=2", "train.seeds=1", "train.epochs=1",
               f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sweep" / "digits" / "nodp" / "nonprivate" / "k2" / "summary.csv").is_file()


@pytest.mark.slow
def test_grids_side_by_side_give_the_numbers_they_give_one_after_another(tmp_path):
    """Two grids in two processes at once (hydra.launcher.side_by_side=2, on a CPU) write the rows they write one after
    another, each recording the placement in its Hydra record."""
    import pandas as pd

    args = ["run", "-m", "strategy=fixed_threshold,online", "grid.k=2", "train.seeds=2", "train.epochs=1"]
    together = dpgrid(*args, "hydra.launcher.side_by_side=2", f"hydra.sweep.dir={tmp_path / 'together'}")
    assert together.returncode == 0, together.stderr
    assert "dpgrid: 2 grids, 2 side by side (hydra.launcher.side_by_side=2)" in together.stderr
    apart = dpgrid(*args, f"hydra.sweep.dir={tmp_path / 'apart'}")
    assert apart.returncode == 0 and "side by side" not in apart.stderr, apart.stderr
    for strategy in ("fixed_threshold", "online"):
        grid = f"digits/{strategy}/eps3/k2"
        a, b = (pd.read_csv(tmp_path / where / grid / "runs.csv") for where in ("together", "apart"))
        assert a.best_value.tolist() == b.best_value.tolist() and len(a) >= 4
        record = OmegaConf.load(tmp_path / "together" / grid / ".hydra" / "hydra.yaml")
        assert record.hydra.launcher.side_by_side == 2


@pytest.mark.slow
def test_a_grid_that_ends_in_its_error_leaves_the_grids_beside_it_to_finish(tmp_path):
    """Side by side, a grid refused on its data (which says why in its own line, from its own process) leaves the grid
    beside it to train to its end; the sweep then ends in one line naming the grid, with its exit code."""
    r = dpgrid("run", "-m", "dataset=mnist,digits", f"data.root={tmp_path / 'nowhere'}", "strategy=nodp", "grid.k=2",
               "train.seeds=1", "train.epochs=1", "hydra.launcher.side_by_side=2", f"hydra.sweep.dir={tmp_path / 's'}")
    line = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and line.startswith("dpgrid: error: 1 of the sweep's 2 grids ended before finishing"), line
    assert "dataset=mnist" in line and "dataset=digits" not in line
    assert (tmp_path / "s" / "digits" / "nodp" / "nonprivate" / "k2" / "summary.csv").is_file()
