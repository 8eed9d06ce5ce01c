"""Regenerate the paper's results for one dataset: every strategy x the paper's epsilons x k in {5, 7, 9},
nodp once per k, then `dpgrid tables`. Prints the number of training runs and a compute estimate first.

    python scripts/reproduce.py mnist --data-root ./data                  # on this machine
    python scripts/reproduce.py mnist --launcher local --jobs 4           # parallel processes (joblib)
    python scripts/reproduce.py ag_news --launcher slurm -- hydra.launcher.partition=cpu   # a SLURM cluster
    python scripts/reproduce.py fashion_mnist --dry-run                   # only print the plan

Extra arguments after `--` go to every `dpgrid run` (e.g. train.momentum=0.9, train.seeds=2).
"""

import argparse
import math
import shlex
import subprocess
import sys

PRIVATE = ["online", "fixed_threshold", "fixed_quantile", "adamwosm"]
EPSILONS = {"mnist": [3, 5, 7, 9], "ag_news": [3, 5, 7, 9], "fashion_mnist": [1, 2, 3, 4], "digits": [3, 5, 7, 9]}
N_TRAIN = {"mnist": 60000, "fashion_mnist": 60000, "ag_news": 120000, "digits": 1437}
BATCH = {"mnist": 512, "fashion_mnist": 512, "ag_news": 512, "digits": 128}
EPOCHS = {"mnist": 10, "fashion_mnist": 10, "ag_news": 10, "digits": 20}
# Seconds per private step measured by scripts/bench.py on a 2-core x86 machine (README, Performance).
SECONDS_PER_STEP = {"mnist": 0.44, "fashion_mnist": 1.4, "ag_news": 0.006, "digits": 0.003}
CONFIGS = {"online": lambda k: k, "fixed_threshold": lambda k: k * k, "fixed_quantile": lambda k: 5 * k,
           "adamwosm": lambda k: k, "nodp": lambda k: k}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", choices=list(EPSILONS))
    parser.add_argument("--k", type=int, nargs="+", default=[5, 7, 9])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--data-root", default="./data")
    parser.add_argument("--results", default="outputs", help="hydra.sweep.dir: the results tree")
    parser.add_argument("--launcher", choices=["basic", "local", "slurm"], default="basic")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes with --launcher local")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("extra", nargs="*", help="more overrides for every run (after --)")
    args = parser.parse_args()

    d, ks = args.dataset, args.k
    steps = math.ceil(EPOCHS[d] * N_TRAIN[d] / BATCH[d])
    configs = sum(CONFIGS[s](k) for s in PRIVATE for k in ks) * len(EPSILONS[d]) + sum(CONFIGS["nodp"](k) for k in ks)
    runs = configs * args.seeds
    hours = runs * steps * SECONDS_PER_STEP[d] / 3600
    print(f"{d}: {configs} configurations x {args.seeds} seeds = {runs} training runs of {steps} steps "
          f"({runs * steps:,} steps); about {hours:,.0f} hours on one 2-core machine "
          f"({SECONDS_PER_STEP[d]} s/step), less with --launcher local/slurm")

    common = [f"dataset={d}", f"data.root={args.data_root}", f"train.seeds={args.seeds}",
              f"grid.k={','.join(map(str, ks))}", f"hydra.sweep.dir={args.results}", *args.extra]
    if args.launcher != "basic":
        common.append(f"hydra/launcher={args.launcher}")
    if args.launcher == "local":
        common.append(f"hydra.launcher.n_jobs={args.jobs}")
    commands = [
        ["dpgrid", "run", "-m", f"strategy={','.join(PRIVATE)}", f"privacy.epsilon={','.join(map(str, EPSILONS[d]))}", *common],
        ["dpgrid", "run", "-m", "strategy=nodp", *common],  # non-private: epsilon does not matter
        ["dpgrid", "tables", args.results],
    ]
    for command in commands:
        print("$", shlex.join(command))
        if not args.dry_run:
            subprocess.run(command, check=True)


if __name__ == "__main__":
    sys.exit(main())
