"""The measuring scripts' own code, on the CPU, before any GPU time is spent on them: scripts/bench.py's profile (its
regions name the step's parts layer by layer and change nothing), its comparison of captured steps with a record,
and scripts/measure_gpu.py's records and extrapolation (run whole with the CUDA calls stubbed and its parts on the
CPU, in the slow layer). Timings are not asserted: speed targets live in the benchmark records."""

import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench  # noqa: E402
import measure_gpu  # noqa: E402


def one_step(labelled: bool):
    """The digits MLP's parameters after one fixed_threshold step on a fixed batch, with the profile's regions named or
    not."""
    from dpgrid.models import mlp
    from dpgrid.strategies import FixedThreshold, Noise
    from dpgrid.training.persample import FastEngine

    torch.manual_seed(0)
    model = mlp().double()
    x, y = torch.rand(32, 64, dtype=torch.float64), torch.randint(0, 10, (32,))
    strategy = FixedThreshold(model.parameters(), hp={"lr": 0.5, "clip": 0.1}, batch_size=32, options={},
                              generator=torch.Generator().manual_seed(3), noise=Noise(1.0), momentum=0.9)
    engine = FastEngine(model, "classification")
    with bench.regions(model, [FixedThreshold]) if labelled else __import__("contextlib").nullcontext():
        for _ in range(2):
            strategy.step(engine(x, y))
    return [p.detach().clone() for p in model.parameters()]


def test_the_profiles_regions_change_no_number_and_are_gone_after():
    from dpgrid.strategies import FixedThreshold, base
    from dpgrid.training.persample import PerSampleGrads
    from dpgrid.training.rules import LayerRule
    from dpgrid.training.rules.convolution import ConvRule
    from dpgrid.training.rules.linear import LinearRule

    before = {(owner, name): owner.__dict__[name] for owner, name in [
        (LayerRule, "from_recorded"), (LinearRule, "sq_norms"), (LinearRule, "weighted_sum"), (ConvRule, "wg"),
        (base.Strategy, "descend"), (base.Strategy, "noisy_mean_flat"), (FixedThreshold, "step"),
        (PerSampleGrads, "norms"), (base, "standard_normal")]}
    for a, b in zip(one_step(labelled=True), one_step(labelled=False)):
        assert torch.equal(a, b)
    assert all(owner.__dict__[name] is kept for (owner, name), kept in before.items())


class Event:
    def __init__(self, name, parent=None):
        self.name, self.cpu_parent = name, parent


def test_an_operator_is_counted_in_its_innermost_region():
    step = Event("dpgrid: strategy: the rest of its step")
    norms = Event("dpgrid: 3 (Conv2d): norms", Event("dpgrid: engine: norms over the layers", step))
    assert bench.region_of(Event("aten::linalg_vector_norm", norms)) == "3 (Conv2d): norms"
    assert bench.region_of(Event("aten::sqrt", step)) == "strategy: the rest of its step"
    backward = Event("autograd::engine::evaluate_function: ConvolutionBackward0")
    assert bench.region_of(Event("aten::convolution_backward", backward)) == "backward: ConvolutionBackward0"
    assert bench.region_of(Event("aten::index")) == bench.OTHER


@pytest.mark.slow
def test_the_profile_names_each_layers_per_sample_work_and_the_noise(monkeypatch):
    """The MNIST CNN at B = 16 on the CPU: the private step's regions hold each convolution's per-sample gradients and
    every layer's norms, the noise draw and the clip weights, which the non-private baseline's do not; both hold the
    forwards and the backward; the rows add up to the totals."""
    monkeypatch.setattr(bench, "BATCH", 16)
    monkeypatch.setattr(bench, "PROFILED", {})
    found = bench.profile("cnn", "fixed_threshold", "fast", steps=1)
    rows = {r["region"]: r for r in found["regions"]}
    for layer in ("0 (Conv2d)", "3 (Conv2d)"):
        assert rows[f"{layer}: per-sample gradients"]["private_ms"] > 0
        assert rows[f"{layer}: per-sample gradients"]["nonprivate_ms"] == 0
    for layer in ("0 (Conv2d)", "3 (Conv2d)", "6 (Linear)", "8 (Linear)"):
        assert rows[f"{layer}: norms"]["private_launches"] > 0 == rows[f"{layer}: norms"]["nonprivate_launches"]
        assert rows[f"{layer}: weighted sums"]["nonprivate_launches"] > 0
    for region in ("strategy: noise draw", "strategy: clip weights"):
        assert rows[region]["private_launches"] > 0 == rows[region]["nonprivate_launches"]
    assert rows["forward 0 (Conv2d)"]["nonprivate_launches"] > 0 and rows["strategy: update"]["nonprivate_launches"] > 0
    assert any(region.startswith("backward: Convolution") for region in rows)
    assert found["private_ms"] == pytest.approx(sum(r["private_ms"] for r in found["regions"]))
    assert found["private_launches"] > found["nonprivate_launches"] and found["baseline"] == "nodp"


def test_a_gpu_record_is_checked_by_its_captured_ratios():
    """A captured step's ratio is compared with the record's ratio to the captured non-private step; a launched one's
    with its ratio to the launched non-private step; one that moved by more than DRIFT is flagged."""
    record = {"results": [{"model": "cnn", "strategy": "online", "ratio_to_nonprivate": 1.6},
                          {"model": "cnn", "strategy": "online+graph", "ratio_to_nonprivate": 0.8,
                           "ratio_to_captured_nonprivate": 1.24}]}
    report = {"results": [{"model": "cnn", "strategy": "online", "ratio_to_nonprivate": 1.62},
                          {"model": "cnn", "strategy": "online+graph", "ratio_to_nonprivate": 0.81,
                           "ratio_to_captured_nonprivate": 1.5}]}
    assert bench.compare(report, record) == [("cnn online", 1.6, 1.62, False), ("cnn online+graph", 1.24, 1.5, True)]


def test_a_cuda_record_is_not_checked_on_a_cpu(tmp_path, monkeypatch, capsys):
    record = tmp_path / "steps_cuda_h100_captured.json"
    record.write_text('{"machine": {"device": "NVIDIA H100 80GB HBM3", "device_type": "cuda"}, '
                      '"results": [{"model": "cnn", "strategy": "online+graph", "ratio_to_nonprivate": 1.0}]}')
    monkeypatch.setattr(sys, "argv", ["bench.py", "--check", str(record)])
    with pytest.raises(SystemExit) as stopped:
        bench.main()
    assert "measured on NVIDIA H100 80GB HBM3 (cuda); check it with --device cuda" in str(stopped.value)


def test_a_record_says_where_its_steps_ran():
    """Records made before `device_type` was written say a GPU by a device that is not their CPU."""
    assert bench.device_type({"cpu": "AMD EPYC", "device": "AMD EPYC"}) == "cpu"
    assert bench.device_type({"cpu": "Intel Xeon", "device": "NVIDIA H100 80GB HBM3"}) == "cuda"
    assert bench.device_type({"cpu": "Intel Xeon", "device": "NVIDIA H200", "device_type": "cuda"}) == "cuda"


def test_the_records_are_named_by_the_gpus_model():
    assert measure_gpu.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert measure_gpu.device_slug("NVIDIA H200") == "h200"
    assert measure_gpu.device_slug("NVIDIA A100-SXM4-40GB") == "a100"


def test_the_sweeps_cost_is_the_slices_time_per_run_step_times_the_sweeps_run_steps():
    """Two strategies in the slice, online twice as costly per run-step as the baseline: the plain estimate is the
    wall time per run-step times the sweep's run-steps; the estimate by strategy weighs each strategy's run-steps by
    its relative cost, which moves it towards online where the sweep has more of online's run-steps than the slice."""
    grids = [{"strategy": "online", "run_steps": 1000, "run_seconds": 4.0},
             {"strategy": "nodp", "run_steps": 1000, "run_seconds": 2.0}]
    found = measure_gpu.extrapolated(wall=3.0, grids=grids, sweep={"online": 9_000_000, "nodp": 1_000_000})
    assert found["seconds_per_run_step"] == pytest.approx(3.0 / 2000)
    assert found["gpu_hours_plain"] == pytest.approx(10_000_000 * 1.5e-3 / 3600)
    relative = found["relative_cost_by_strategy"]
    assert relative == pytest.approx({"online": 4 / 3, "nodp": 2 / 3})
    assert found["gpu_hours_by_strategy"] == pytest.approx((9e6 * 4 / 3 + 1e6 * 2 / 3) * 1.5e-3 / 3600)
    assert found["gpu_hours_by_strategy"] > found["gpu_hours_plain"]
    lines = measure_gpu.arithmetic(found, [{**g, "steps_per_run": 100} for g in grids], 2, "Stub GPU")
    assert any("= 4.17 GPU-hours" in line for line in lines) and any("not met" in line for line in lines)
    grids = [{"strategy": "fixed_threshold", "run_steps": 1000, "run_seconds": 4.0},
             {"strategy": "nodp", "run_steps": 500, "run_seconds": 1.0}]
    found = measure_gpu.extrapolated(wall=3.0, grids=grids, sweep={"fixed_threshold": 10 ** 6, "nodp": 10 ** 5})
    alone = measure_gpu.alone_against(4.0, grids, found, "fixed_threshold")  # the baseline's grid: half the cost per run-step, half the steps
    assert alone["slice_one_after_another_s"] == pytest.approx(4.0 + 4.0 / 4) and alone["placement_speedup"] == \
        pytest.approx(5.0 / 3.0)


@pytest.mark.slow
def test_the_gpu_measurement_runs_whole_with_its_parts_on_the_cpu(tmp_path, monkeypatch):
    """scripts/measure_gpu.py from end to end with the CUDA calls stubbed, each part on the CPU at a small size (the
    digits grids for the slice): the two records are written, with the device, the commit and the command, the
    slice's grids, the sweep's run-steps as scripts/reproduce.py plans them, and the arithmetic in the log."""
    import json
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80e9))
    monkeypatch.setattr(measure_gpu, "bench", lambda *args: [sys.executable, "scripts/bench.py", "--device", "cpu",
                                                              *[a for a in args if a != "--cuda-graphs"]])
    monkeypatch.setattr(measure_gpu, "SLICE", {"dataset": "digits", "epsilon": 3, "k": 2, "epochs": 1, "device": "cpu"})
    monkeypatch.setattr(measure_gpu, "MODELS_CONV", ["bag_of_words"])
    monkeypatch.setattr(measure_gpu, "PROFILED", ["bag_of_words"])
    monkeypatch.setattr(measure_gpu, "STRATEGIES", ["fixed_threshold"])
    monkeypatch.setattr(measure_gpu, "CAPS", {**measure_gpu.CAPS, "steps_conv": 300, "profile": 300, "slice": 300,
                                              "alone": 300})
    out = tmp_path / "records"
    assert measure_gpu.main(["--out", str(out), "--commit", "abc1234", "--budget", "1500",
                             "--parts", "steps_conv", "profile", "slice", "alone"]) == 0
    steps = json.loads((out / "steps_cuda_h100_captured.json").read_text())
    assert steps["commit"] == "abc1234" and steps["command"].startswith("python scripts/measure_gpu.py --out")
    assert steps["machine"]["device"] == "NVIDIA H100 80GB HBM3" and {r["model"] for r in steps["results"]} == {
        "bag_of_words"}
    assert steps["profiles"][0]["model"] == "bag_of_words" and steps["profiles"][0]["regions"]
    grid = json.loads((out / "grid_cuda_h100_sweep.json").read_text())
    assert {g["strategy"] for g in grid["slice"]} == set(measure_gpu.slice_strategies("digits"))
    sweep = grid["extrapolation"]["sweep_run_steps_by_strategy"]
    assert sweep == measure_gpu.sweep_steps("digits") and grid["extrapolation"]["sweep_run_steps"] == sum(sweep.values())
    assert grid["alone"]["run_steps"] > 0 and grid["alone"]["placement_speedup"] > 0
    log = (out / "measure_gpu_log.txt").read_text()
    assert "GPU-hours" in log and "== tests: not asked for (--parts)" in log
    assert sorted(p.name for p in out.iterdir()) == ["grid_cuda_h100_sweep.json", "measure_gpu_log.txt",
                                                      "steps_cuda_h100_captured.json"]
