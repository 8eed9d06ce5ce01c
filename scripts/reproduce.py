"""Regenerate the paper's results for one dataset: every private strategy x the dataset's epsilons x k in
{5, 7, 9}, the non-private baseline once per k, then `dpgrid tables`. Prints the number of training runs and
a compute estimate first. The strategies, their grid sizes, the privacy levels and step times are asked of
the configs (conf/strategy, conf/dataset), never listed here.

    python scripts/reproduce.py mnist --data-root ./data                  # on this machine
    python scripts/reproduce.py mnist --launcher local --jobs 4           # parallel processes (joblib)
    python scripts/reproduce.py ag_news --launcher slurm -- hydra.launcher.partition=cpu   # a SLURM cluster
    python scripts/reproduce.py fashion_mnist --dry-run                   # only print the plan

Extra arguments after `--` go to every `dpgrid run` (e.g. train.momentum=0.9, train.seeds=2).
"""

import argparse
import shlex
import subprocess
import sys

from dpgrid.api import options

def grids(dataset: str, ks: list, extra: list):
    """[(strategy, private, K, T, epsilons, seconds per step)] for every strategy option, asked of the
    configs (dpgrid's strategy group, the dataset's privacy levels and step time): no list here."""
    import math

    import dpgrid
    from dpgrid import grid, strategies

    found = []
    for name in options("strategy"):
        for k in ks:
            cfg = dpgrid.compose([f"dataset={dataset}", f"strategy={name}", f"grid.k={k}",
                                  *[e for e in extra if not e.startswith("hydra")]])
            try:
                strategies.resolve(cfg.strategy).check_config(cfg)
            except dpgrid.DpgridError:
                continue  # a strategy of another task (e.g. noisy gradient descent on logistic regression)
            steps = math.ceil(int(cfg.train.epochs) * int(cfg.dataset.n_train) / int(cfg.train.batch_size))
            found.append((name, strategies.resolve(cfg.strategy).private, grid.size(cfg.strategy, cfg.grid), steps,
                          list(cfg.dataset.epsilons), float(cfg.dataset.get("seconds_per_step") or 0)))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a dataset option: " + ", ".join(options("dataset")))
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
    found = grids(d, ks, args.extra)
    private = sorted({name for name, is_private, *_ in found if is_private})
    baselines = sorted({name for name, is_private, *_ in found if not is_private})
    configs = sum(K * (len(eps) if is_private else 1) for _, is_private, K, _, eps, _ in found)
    runs = configs * args.seeds
    steps = sum(K * T * (len(eps) if p else 1) for _, p, K, T, eps, _ in found) * args.seeds
    hours = sum(K * T * (len(eps) if p else 1) * sec for _, p, K, T, eps, sec in found) * args.seeds / 3600
    epsilons = found[0][4]
    print(f"{d}: {configs} configurations x {args.seeds} seeds = {runs} training runs ({steps:,} steps); "
          f"about {hours:,.0f} hours on one 2-core machine (dataset.seconds_per_step), less with --launcher local/slurm")

    common = [f"dataset={d}", f"data.root={args.data_root}", f"train.seeds={args.seeds}",
              f"grid.k={','.join(map(str, ks))}", f"hydra.sweep.dir={args.results}", *args.extra]
    if args.launcher != "basic":
        common.append(f"hydra/launcher={args.launcher}")
    if args.launcher == "local":
        common.append(f"hydra.launcher.n_jobs={args.jobs}")
    commands = [
        ["dpgrid", "run", "-m", f"strategy={','.join(private)}", f"privacy.epsilon={','.join(f'{e:g}' for e in epsilons)}",
         *common],
        *([["dpgrid", "run", "-m", f"strategy={','.join(baselines)}", *common]] if baselines else []),  # no epsilon
        ["dpgrid", "tables", args.results],
    ]
    for command in commands:
        print("$", shlex.join(command))
        if not args.dry_run:
            subprocess.run(command, check=True)


if __name__ == "__main__":
    sys.exit(main())
