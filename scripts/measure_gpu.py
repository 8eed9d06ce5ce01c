"""The GPU measurement in one command (about 6 of its 8 minutes on one H100 or H200): whether the private steps come
within 1.25x of the captured non-private step, where their extra time goes, and what the paper's MNIST sweep costs
as `dpgrid run -m` places its grids.

    python scripts/measure_gpu.py --data-root ./data [--out benchmarks] [--commit HASH]

Parts, each in its own process with its own cap (a slow part leaves the others their time; together within
--budget seconds):

1. the CUDA tests: tests/test_cuda.py, tests/test_graphs.py and tests/test_placement.py's fast layer;
2. the steps, launched and captured (`scripts/bench.py --device cuda --cuda-graphs`): every model at B = 512,
   fixed_threshold and online against the non-private baseline captured alike (target: 1.25x);
3. the profile (`scripts/bench.py --device cuda --profile`) of the models above the target when this was written
   (the autoencoder, the bag-of-words, the transformer): each region's and each layer's kernel time, private
   against non-private;
4. the slice: one epoch of one MNIST grid per strategy (k = 5, epsilon = 3), one `dpgrid run -m` placing them as it
   places a sweep's grids (hydra/launcher=dpgrid: side by side on the GPU), timed whole; extrapolated to the paper's
   MNIST sweep (its strategies x epsilons x k, `python scripts/reproduce.py mnist --dry-run`) with the arithmetic
   printed;
5. if time is left, the fixed_threshold grid of the slice alone, for what placing grids side by side gained.

It writes into --out: steps_cuda_<gpu>_captured.json (the steps and the profiles; `python scripts/bench.py
--device cuda --check` compares a later run with it), grid_cuda_<gpu>_sweep.json (the slice, the extrapolation), each
with the device, the commit and the command, and pytest_cuda.txt and measure_gpu_log.txt: four files."""

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS_CONV = ["cnn", "autoencoder", "bag_of_words"]
MODELS_SEQ = ["transformer", "vit"]
PROFILED = ["autoencoder", "bag_of_words", "transformer"]
STRATEGIES = None  # fixed threshold and online (their config names, asked of the configs: `by_class`)
SLICE = {"dataset": "mnist", "epsilon": 3, "k": 5, "epochs": 1, "device": "cuda"}
TARGET_HOURS = 2.0
# each part's cap in seconds, in order; a part gets its cap or what is left of the budget, whichever is less
CAPS = {"tests": 75, "steps_conv": 100, "steps_seq": 70, "profile": 90, "slice": 180, "alone": 75}


def device_slug(name: str) -> str:
    """A short name of the GPU for the records' names: its model (h100, h200, a100), else its name in lower case."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", name)
    return (found.group(1) if found else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")).lower()


class Parts:
    """The parts run one after another within `budget` seconds, each command's output kept in the log."""

    def __init__(self, budget: float, log):
        self.start, self.budget, self.log, self.done = time.monotonic(), budget, log, {}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run(self, name: str, command: list, least: float = 20) -> tuple:
        """(exit status or None when skipped or stopped at its cap, its stdout, seconds): `command` with the part's
        cap, never past the budget; skipped where less than `least` seconds are left."""
        cap = min(CAPS[name], self.left())
        if CAPS[name] == 0:
            self.say(f"== {name}: not asked for (--parts)")
            return None, "", 0.0
        if cap < least:
            self.say(f"== {name}: skipped ({self.left():.0f} s of the budget left)")
            return None, "", 0.0
        self.say(f"== {name} (cap {cap:.0f} s, {self.left():.0f} s left): {shlex.join(command)}")
        began = time.monotonic()
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)  # its own group: a part stopped at its cap stops whole
        try:
            out, err = process.communicate(timeout=cap)
            code = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            code = None
        seconds = time.monotonic() - began
        self.log.write(err[-20000:])
        self.say(f"== {name}: {'stopped at its cap' if code is None else f'exit {code}'} after {seconds:.0f} s")
        self.done[name] = {"exit": code, "seconds": round(seconds, 1)}
        return code, out, seconds


def bench(*args) -> list:
    return [sys.executable, "scripts/bench.py", "--device", "cuda", *args]


def merged(reports: list) -> dict:
    """One steps record from several of scripts/bench.py's JSON reports (their models' rows together)."""
    found = None
    for report in reports:
        if found is None:
            found = report
            continue
        for key in ("nonprivate", "results", "opacus", "proof", "per_sample_methods"):
            found[key] = found.get(key, []) + report.get(key, [])
    return found


def sweep_steps(dataset: str) -> dict:
    """{strategy: run-steps} of the paper's sweep on `dataset` as scripts/reproduce.py plans it (every strategy x the
    dataset's epsilons x k in 5, 7, 9, 5 seeds; the baseline once per k), asked of the configs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from reproduce import grids

    steps = {}
    for name, private, k_configs, t, epsilons, _, _ in grids(dataset, [5, 7, 9], []):
        steps[name] = steps.get(name, 0) + k_configs * t * (len(epsilons) if private else 1) * 5
    return steps


def by_class(*classes) -> list:
    """The names of the strategy configs whose `_target_` is each of these classes (no list of names here)."""
    import dpgrid
    from dpgrid import strategies
    from dpgrid.config.groups import options

    named = {strategies.resolve(dpgrid.compose([f"strategy={name}"]).strategy): name for name in options("strategy")}
    return [named[cls] for cls in classes]


def slice_strategies(dataset: str) -> list:
    """The strategies of the config group that train on the dataset's task (the paper's DP-SGD strategies and the
    non-private baseline; the noise schedules train logistic regression), asked of the configs."""
    import dpgrid
    from dpgrid import strategies
    from dpgrid.config.groups import options

    task = str(dpgrid.compose([f"dataset={dataset}"]).dataset.task)
    found = []
    for name in options("strategy"):
        runs_on = strategies.resolve(dpgrid.compose([f"dataset={dataset}", f"strategy={name}"]).strategy).tasks
        if runs_on is None or task in runs_on:
            found.append(name)
    return found


def slice_grids(sweep_dir: Path) -> list:
    """Each grid of the slice: its strategy, runs, run-steps (rows x T), its runs' own seconds (training and
    validation), its span (first to last line of its cli.log) and how many grids the launcher placed beside it."""
    from omegaconf import OmegaConf

    from dpgrid.results.files import read_frame

    found = []
    for runs_csv in sorted(sweep_dir.glob("*/*/*/k*/runs.csv")):
        grid, runs = runs_csv.parent, read_frame(runs_csv)
        stamps = [time.mktime(time.strptime(line[1:20], "%Y-%m-%d %H:%M:%S"))
                  for line in (grid / "cli.log").read_text().splitlines() if re.match(r"\[\d{4}-\d\d-\d\d ", line)]
        record = OmegaConf.load(grid / ".hydra" / "hydra.yaml")
        found.append({"strategy": str(runs.strategy.iloc[0]), "runs": len(runs), "steps_per_run": int(runs.steps.iloc[0]),
                      "run_steps": int(runs.steps.sum()), "run_seconds": float(runs.seconds.sum()),
                      "eval_seconds": float(runs.eval_seconds.sum()),
                      "span_s": (max(stamps) - min(stamps)) if stamps else None,
                      "side_by_side": record.hydra.launcher.get("side_by_side")})
    return found


def extrapolated(wall: float, grids: list, sweep: dict) -> dict:
    """The sweep's GPU-hours from the slice's `wall` seconds for its grids' run-steps, two ways:
    plain: every run-step of the sweep at the slice's wall seconds per run-step;
    by strategy: each strategy's run-steps at its own cost relative to the slice's mean (its grid's run seconds per
    run-step, which side-by-side sharing inflates alike), so that the sweep's mix of strategies (online's 12 grids,
    the baseline's 3) is weighed as the sweep has it, not as the slice (one grid each)."""
    slice_steps = sum(g["run_steps"] for g in grids)
    per_step = wall / slice_steps
    cost = {g["strategy"]: g["run_seconds"] / g["run_steps"] for g in grids}
    mean_slice = sum(cost[g["strategy"]] * g["run_steps"] for g in grids) / slice_steps
    weighted = {s: steps * per_step * cost[s] / mean_slice for s, steps in sweep.items() if s in cost}
    missing = sorted(set(sweep) - set(cost))
    total = sum(sweep.values())
    return {"slice_wall_s": wall, "slice_run_steps": slice_steps, "seconds_per_run_step": per_step,
            "sweep_run_steps": total, "sweep_run_steps_by_strategy": sweep,
            "gpu_hours_plain": total * per_step / 3600,
            "gpu_hours_by_strategy": (sum(weighted.values()) + sum(sweep[s] for s in missing) * per_step) / 3600,
            "relative_cost_by_strategy": {s: c / mean_slice for s, c in cost.items()},
            "strategies_not_in_the_slice": missing, "target_hours": TARGET_HOURS}


def alone_against(alone_wall: float, grids: list, found: dict, strategy: str) -> dict:
    """What the slice would take one grid after another, from `strategy`'s grid trained alone (`alone_wall` seconds):
    each grid scaled from it by its run-steps and its relative cost (`extrapolated`), summed."""
    relative = found["relative_cost_by_strategy"]
    alone = next(g for g in grids if g["strategy"] == strategy)
    unit = alone_wall / (alone["run_steps"] * relative[strategy])  # seconds per run-step at relative cost 1
    apart = sum(unit * g["run_steps"] * relative[g["strategy"]] for g in grids)
    return {"wall_s": alone_wall, "run_steps": alone["run_steps"], "slice_one_after_another_s": apart,
            "placement_speedup": apart / found["slice_wall_s"],
            "gpu_hours_one_grid_at_a_time": found["gpu_hours_by_strategy"] * apart / found["slice_wall_s"]}


def arithmetic(found: dict, grids: list, side_by_side, device: str) -> list:
    """The extrapolation's arithmetic, in lines."""
    e = found
    lines = [f"slice: {len(grids)} {SLICE['dataset']} grids (one per strategy, epsilon = {SLICE['epsilon']}, k = {SLICE['k']}, "
             f"{SLICE['epochs']} epoch: T = {grids[0]['steps_per_run']} steps per run), {side_by_side} side by side on "
             f"{device}: {e['slice_wall_s']:.1f} s for {e['slice_run_steps']:,} run-steps = "
             f"{e['seconds_per_run_step'] * 1e3:.3f} ms per run-step (process starts, proofs, captures and validation "
             "included)",
             f"the paper's {SLICE['dataset']} sweep: {e['sweep_run_steps']:,} run-steps (python scripts/reproduce.py "
             f"{SLICE['dataset']} --dry-run): " + ", ".join(f"{s} {n:,}" for s, n in e["sweep_run_steps_by_strategy"].items()),
             f"plain: {e['sweep_run_steps']:,} x {e['seconds_per_run_step'] * 1e3:.3f} ms / 3600 = "
             f"{e['gpu_hours_plain']:.2f} GPU-hours",
             "by strategy (each at its own cost relative to the slice's mean: "
             + ", ".join(f"{s} {c:.2f}" for s, c in e["relative_cost_by_strategy"].items())
             + f"): sum over strategies of run-steps x {e['seconds_per_run_step'] * 1e3:.3f} ms x its relative cost "
             f"/ 3600 = {e['gpu_hours_by_strategy']:.2f} GPU-hours",
             f"target: <= {TARGET_HOURS:g} GPU-hours: {'met' if max(e['gpu_hours_plain'], e['gpu_hours_by_strategy']) <= TARGET_HOURS else 'not met'} "
             "(an upper bound: the sweep's runs are 10 epochs, over which each grid's start, proof and captures "
             "are spread 10 times thinner)"]
    if e["strategies_not_in_the_slice"]:
        lines.append(f"not in the slice (counted at its mean): {', '.join(e['strategies_not_in_the_slice'])}")
    return lines


def commit(given: str) -> str:
    if given:
        return given
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (pass --commit)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--data-root", default="./data", help="data.root: where MNIST's files are (MNIST/raw/)")
    parser.add_argument("--out", default="benchmarks", help="where the records go")
    parser.add_argument("--commit", default="", help="the commit measured (default: git's, where the tree has .git)")
    parser.add_argument("--budget", type=float, default=420, help="seconds for all the parts together")
    parser.add_argument("--parts", nargs="+", default=list(CAPS), choices=list(CAPS), help="the parts to run")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("measure_gpu.py measures a CUDA device; this machine has none")
    from dpgrid.strategies import FixedThreshold, Online

    fixed_threshold, online = by_class(FixedThreshold, Online)
    chosen = STRATEGIES or [fixed_threshold, online]
    for name in set(CAPS) - set(args.parts):
        CAPS[name] = 0  # skipped
    device = torch.cuda.get_device_name(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug, stamp = device_slug(device), {"commit": commit(args.commit), "date": time.strftime("%Y-%m-%d"),
                                       "command": "python scripts/measure_gpu.py " + shlex.join(sys.argv[1:] if argv is
                                                                                               None else argv)}
    machine = {"device": device, "device_type": "cuda", "cpu_cores": os.cpu_count(), "torch": torch.__version__,
               "cuda": torch.version.cuda, "memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)}
    with open(out / "measure_gpu_log.txt", "w") as log:
        parts = Parts(args.budget, log)
        parts.say(f"{device} ({machine['memory_gb']} GB), torch {torch.__version__}, CUDA {torch.version.cuda}, "
                  f"{os.cpu_count()} cores; commit {stamp['commit']}")
        planner = subprocess.Popen([sys.executable, "-c", "import json, sys; sys.path.insert(0, 'scripts'); "
                                    f"import measure_gpu; print(json.dumps(measure_gpu.sweep_steps({SLICE['dataset']!r})))"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        code, text, _ = parts.run("tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                                            "addopts=", "-m", "not slow", "tests/test_cuda.py", "tests/test_graphs.py",
                                            "tests/test_placement.py"])
        if code is not None or text:
            (out / "pytest_cuda.txt").write_text(text)
            parts.say((text.strip().splitlines() or ["no output"])[-1])
        steps = []
        for name, models, extra in (("steps_conv", MODELS_CONV, ["--seconds", "1", "--warmup", "3"]),
                                    ("steps_seq", MODELS_SEQ, ["--steps", "5", "--seconds", "1", "--warmup", "2"])):
            code, text, _ = parts.run(name, bench("--cuda-graphs", "--no-memory", "--no-opacus", "--json", "--models",
                                                  *models, "--strategies", *chosen, *extra))
            if code == 0:
                steps.append(json.loads(text))
        code, text, _ = parts.run("profile", bench("--profile", "--json", "--models", *PROFILED,
                                                   "--strategies", *chosen))
        profiles = json.loads(text)["profiles"] if code == 0 else []
        if steps or profiles:
            record = {**(merged(steps) or {"machine": machine}), "profiles": profiles, **stamp,
                      "parts": {k: v for k, v in parts.done.items() if k.startswith(("steps", "profile"))}}
            record["machine"].update(machine)
            (out / f"steps_cuda_{slug}_captured.json").write_text(json.dumps(record, indent=2) + "\n")
            for row in record.get("results", []):
                if "ratio_to_captured_nonprivate" in row:
                    parts.say(f"{row['model']:<13} {row['strategy']:<24} {row['seconds'] * 1e3:7.2f} ms  "
                              f"{row['ratio_to_captured_nonprivate']:.2f}x the captured non-private step "
                              f"({'met' if row['met'] else 'NOT met'}: <= {row['target_ratio']})")
            for found in profiles:
                gap = sorted(found["regions"], key=lambda r: -r["difference_ms"])[:4]
                parts.say(f"{found['model']} {found['strategy']}: kernels {found['nonprivate_ms']:.2f} -> "
                          f"{found['private_ms']:.2f} ms, {found['nonprivate_launches']:.0f} -> "
                          f"{found['private_launches']:.0f} launches; most added: "
                          + "; ".join(f"{r['region']} {r['difference_ms']:+.2f} ms" for r in gap))
        sweep_dir = Path(tempfile.mkdtemp(prefix="dpgrid-slice-"))
        strategies = slice_strategies(SLICE["dataset"])
        slice_command = ["-m", "dpgrid", "run", "-m", f"dataset={SLICE['dataset']}", f"data.root={Path(args.data_root).resolve()}",
                         f"strategy={','.join(strategies)}", f"privacy.epsilon={SLICE['epsilon']}", f"grid.k={SLICE['k']}",
                         f"train.epochs={SLICE['epochs']}", f"train.device={SLICE['device']}", f"hydra.sweep.dir={sweep_dir}"]
        code, _, wall = parts.run("slice", [sys.executable, *slice_command])
        sweep = sweep_steps_or_none(planner, wait=True)
        grid_record = {"machine": machine, **stamp, "slice_command": "python " + shlex.join(slice_command),
                       "parts": parts.done}
        if code == 0 and sweep:
            grids = slice_grids(sweep_dir)
            found = extrapolated(wall, grids, sweep)
            placed = grids[0]["side_by_side"] if grids else None
            placed = placed if isinstance(placed, int) else 1  # "auto" in a grid's record: placed one after another
            for line in arithmetic(found, grids, placed, device):
                parts.say(line)
            grid_record.update(slice=grids, side_by_side=placed, extrapolation=found)
            alone_dir = Path(tempfile.mkdtemp(prefix="dpgrid-alone-"))
            alone = ["-m", "dpgrid", "run", f"dataset={SLICE['dataset']}", f"data.root={Path(args.data_root).resolve()}",
                     f"strategy={fixed_threshold}", f"privacy.epsilon={SLICE['epsilon']}", f"grid.k={SLICE['k']}",
                     f"train.epochs={SLICE['epochs']}", f"train.device={SLICE['device']}", f"hydra.run.dir={alone_dir}/grid"]
            code, _, alone_wall = parts.run("alone", [sys.executable, *alone], least=60)
            if code == 0:
                grid_record["alone"] = one = {"strategy": fixed_threshold,
                                              **alone_against(alone_wall, grids, found, fixed_threshold)}
                parts.say(f"{fixed_threshold}'s grid alone: {alone_wall:.1f} s for {one['run_steps']:,} run-steps; the "
                          f"slice's {len(grids)} grids one after another, each scaled from it by its run-steps and "
                          f"relative cost: about {one['slice_one_after_another_s']:.0f} s against "
                          f"{found['slice_wall_s']:.0f} s as placed ({one['placement_speedup']:.2f}x); the sweep one "
                          f"grid at a time about {one['gpu_hours_one_grid_at_a_time']:.2f} GPU-hours")
        else:
            parts.say("the slice did not finish: no extrapolation (measure_gpu_log.txt says why)")
        (out / f"grid_cuda_{slug}_sweep.json").write_text(json.dumps(grid_record, indent=2) + "\n")
        parts.say(f"wrote {out / f'steps_cuda_{slug}_captured.json'} and {out / f'grid_cuda_{slug}_sweep.json'} "
                  f"after {time.monotonic() - parts.start:.0f} s")
    return 0


def sweep_steps_or_none(planner, wait: bool = False):
    """The planner's answer ({strategy: run-steps}), once it has given one (None before, or if it failed)."""
    if planner.poll() is None and not wait:
        return None
    if not hasattr(planner, "answer"):
        text = planner.communicate(timeout=120)[0] if wait or planner.poll() is not None else ""
        try:
            planner.answer = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            planner.answer = None
    return planner.answer


if __name__ == "__main__":
    sys.exit(main())
