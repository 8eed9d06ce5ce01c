"""What `dpgrid audit`'s mechanism test catches and how often it raises a false alarm (docs/audit.md, "The mechanism
test"): the plugins of tests/audited (noise at 0.8x and 0.5x the plan, clipping at 1.25x and 2x the threshold, noise
drawn once and reused, each example counted in two steps as if sampled at 2q, batches of a fixed size and batches cut
from a permutation per epoch, these two at 1 epoch too) at epsilon 1, 4 and 8, and every built-in DP-SGD strategy
(secure mode too) over many seeds, each audit a k = 2 grid on digits, 1 seed, 10 epochs unless said.

    python scripts/mechanism_study.py [--seeds 20] [--bug-seeds 5] [--jobs 2] [--secure NAME ...]  # ~40 min on 2 idle cores

Writes docs/audit/mechanism_detection.csv and docs/audit/mechanism_false_alarms.csv and prints both as markdown.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
from selection_study import markdown  # (scripts/ is on the path of a script run from it)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "audit"
AUDITED = ROOT / "tests" / "audited"
EPSILONS = (1, 4, 8)
BUGS = {"noise 0.8x": ["strategy=scaled_noise", "strategy.noise_scale=0.8"],
        "noise 0.5x": ["strategy=scaled_noise", "strategy.noise_scale=0.5"],
        "clip 1.25x": ["strategy=loose_clip", "strategy.clip_scale=1.25"],
        "clip 2x": ["strategy=loose_clip", "strategy.clip_scale=2"],
        "noise reused": ["strategy=reused_noise"],
        "sampled at 2q": ["strategy=echoed_batch"],
        "fixed-size batches": ["strategy=fixed_size_batches"],
        "fixed-size batches, 1 epoch": ["strategy=fixed_size_batches", "train.epochs=1"],
        "shuffled batches": ["strategy=shuffled_batches"],
        "shuffled batches, 1 epoch": ["strategy=shuffled_batches", "train.epochs=1"]}


def built_ins(secure: list) -> dict:
    """{name: overrides}: every private strategy of the default dataset (asked of conf/strategy, as audit_study.py
    does), and the `secure` ones (None: the default strategy) in secure mode too."""
    import dpgrid
    from audit_study import grids

    private = [(name, overrides) for name, overrides in grids() if not any("selection" in o for o in overrides)]
    secure = secure or [str(dpgrid.compose([]).strategy.name)]
    return {**dict(private), **{f"{name}, secure": [f"strategy={name}", "privacy.secure_rng=true"] for name in secure}}


def audit(tmp: str, name: str, overrides: list, epsilon: float, seed: int) -> dict:
    out = Path(tmp) / f"{name.replace(' ', '_').replace(',', '')}_{epsilon}_{seed}"
    epochs = [] if any(o.startswith("train.epochs=") for o in overrides) else ["train.epochs=10"]
    command = [sys.executable, "-m", "dpgrid", "audit", "grid.k=2", "train.seeds=1", *epochs, "train.threads=1",
               f"privacy.epsilon={epsilon}", "--seed", str(seed), f"hydra.run.dir={out}",
               f"hydra.searchpath=[file://{AUDITED / 'conf'}]", *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(AUDITED), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    found = json.loads((out / "audit.json").read_text())
    tests = found["mechanism"]["tests"]
    return dict(grid=name, epsilon=epsilon, seed=seed, exit=done.returncode, verdict=found["mechanism"]["verdict"],
                differs=" ".join(n for n, t in tests.items() if t["verdict"] == "differs"),
                noise_ratio=round(tests.get("noise_multiplier", {}).get("estimate", float("nan")), 3),
                contribution=round(tests.get("sensitivity", {}).get("estimate", float("nan")), 3),
                spread=round(tests["batch_sizes"]["estimate"], 3), overlap=round(tests["overlap"]["estimate"], 4),
                bound=round(found["epsilon_lower_bound"], 3), fdp=round(found["epsilon_fdp"]["epsilon_lower_bound"], 3),
                claimed=round(found["epsilon_claimed"], 3), seconds=round(time.perf_counter() - start, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seeds", type=int, default=20, help="audits of each built-in strategy (epsilon 1, 4, 8 in turn)")
    parser.add_argument("--bug-seeds", type=int, default=5, help="audits of each bug at each epsilon")
    parser.add_argument("--jobs", type=int, default=2, help="audits at once (one torch thread each)")
    parser.add_argument("--secure", nargs="+", help="strategies audited in secure mode too (default: the default one)")
    parser.add_argument("--rows", help="a log of an interrupted study (the rows it printed): audits it holds are kept")
    args = parser.parse_args()
    done = {}
    if args.rows:
        for line in open(args.rows):
            if line.startswith("{"):
                row = eval(line, {"nan": float("nan")})  # the script's own printed dicts
                done[(row["grid"], row["epsilon"], row["seed"])] = row
    jobs = [(name, o, e, s) for name, o in BUGS.items() for e in EPSILONS for s in range(args.bug_seeds)]
    jobs += [(name, o, EPSILONS[s % 3], s) for name, o in built_ins(args.secure).items() for s in range(args.seeds)]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        rows = []
        for row in pool.map(lambda job: done.get((job[0], job[2], job[3])) or audit(tmp, *job), jobs):
            rows.append(row)
            print(row, flush=True)
    frame = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    bugs, built_in = frame[frame.grid.isin(list(BUGS))], frame[~frame.grid.isin(list(BUGS))]
    bugs.to_csv(OUT / "mechanism_detection.csv", index=False)
    built_in.to_csv(OUT / "mechanism_false_alarms.csv", index=False)
    detected = bugs.assign(caught=bugs.verdict == "differs").groupby(["grid", "epsilon"], sort=False).agg(
        caught=("caught", "sum"), audits=("caught", "size"), noise_ratio=("noise_ratio", "median"),
        contribution=("contribution", "median"), spread=("spread", "median"), overlap=("overlap", "median"),
        seconds=("seconds", "median")).reset_index()
    print(markdown(detected))
    alarms = built_in.assign(alarm=built_in.verdict == "differs").groupby("grid", sort=False).agg(
        alarms=("alarm", "sum"), audits=("alarm", "size"), noise_ratio=("noise_ratio", "median"),
        contribution=("contribution", "median"), spread=("spread", "median"),
        overlap=("overlap", "median")).reset_index()
    print(markdown(alarms))
    print(f"false alarms: {int(built_in.verdict.eq('differs').sum())} of {len(built_in)} audits")


if __name__ == "__main__":
    main()
