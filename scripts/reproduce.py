"""Regenerate the paper's results for one dataset: every private strategy x the dataset's epsilons x k in
{5, 7, 9}, the non-private baseline once per k, then `dpgrid tables`. Prints the number of training runs and
a compute estimate first. The strategies, their grid sizes, the privacy levels and step times are asked of
the configs (conf/strategy, conf/dataset), never listed here.

    python scripts/reproduce.py mnist --data-root ./data                  # on this machine
    python scripts/reproduce.py mnist --launcher local --jobs 4           # parallel processes (joblib)
    python scripts/reproduce.py ag_news --launcher slurm -- hydra.launcher.partition=cpu   # a SLURM cluster
    python scripts/reproduce.py fashion_mnist --dry-run                   # only print the plan

    python scripts/reproduce.py mnist --paper-cells --k 9 --seeds 2 --data-root ./data   # the paper's best only

--paper-cells trains, in each cell of the paper's Tables 8-13 (strategy x epsilon x k), only the configuration
the paper reports as best, with the noise of the whole grid (grid.only): a comparison with the paper in hours
instead of weeks. A cell the paper does not report (a diverged row, a privacy level it did not run) is named
and skipped. Each cell is an ordinary `dpgrid run` in RESULTS/<dataset>/<strategy>/eps<e>/k<k>: a killed
reproduction resumes where it stopped, and ends with `dpgrid tables RESULTS` (the *_vs_paper tables). With
--launcher slurm each cell is submitted as a SLURM job, --jobs of them queued at once.

Extra arguments after `--` go to every `dpgrid run` (e.g. protocol=literal, train.epochs=1).
"""

import argparse
import concurrent.futures
import os
import shlex
import subprocess
import sys

from dpgrid import DpgridError
from dpgrid.config.groups import options
from dpgrid.reporting.describe import duration


def compiled(dataset: str, name: str, k: int, extra: list, epsilon: float = None):
    """The grid `dpgrid run` would train (dpgrid.compile: K, T, whether it is private), or None for a strategy
    of another task (e.g. noisy gradient descent, which runs on logistic regression only); DpgridError for a
    cell that cannot be planned (at `epsilon`, None: the dataset's default)."""
    import dpgrid
    from dpgrid import strategies

    cfg = dpgrid.compose([f"dataset={dataset}", f"strategy={name}", f"grid.k={k}",
                          *([f"privacy.epsilon={epsilon:g}"] if epsilon is not None else []),
                          *[e for e in extra if not e.startswith("hydra")]])
    runs_on = strategies.resolve(cfg.strategy).tasks
    if runs_on is not None and cfg.dataset.task not in runs_on:
        return None
    return dpgrid.compile(cfg)


def grids(dataset: str, ks: list, extra: list):
    """[(strategy, private, K, T, epsilons, seconds per step, k)] for every strategy option, asked of dpgrid
    (the strategy group, the compiled grid, the dataset's privacy levels and step time): no list here. A cell
    that cannot be planned (e.g. fixed_quantile's count noise at the noise a large grid needs) is left out and
    said, with dpgrid's reason, in one line each."""
    import dpgrid

    found = []
    levels = [float(e) for e in dpgrid.compose([f"dataset={dataset}"]).dataset.get("epsilons", [])]
    for name in options("strategy"):
        for k in ks:
            plannable, spec = [], None
            for epsilon in levels or [None]:
                try:
                    spec = compiled(dataset, name, k, extra, epsilon) or spec
                except DpgridError as e:
                    print(f"skipped: {name} k={k} epsilon={epsilon:g}: {e}")
                    continue
                if spec is None:
                    break
                plannable.append(epsilon)
                if not spec.plan.private:  # a baseline's grid does not depend on epsilon
                    break
            if spec is None:
                continue
            plan = spec.plan
            found.append((name, plan.private, plan.n_configs, plan.steps,
                          [e for e in plannable if e is not None] if plan.private else plan.dataset_epsilons,
                          float(spec.dataset.seconds_per_step or 0), k))
    return found


def private_sweeps(found: list) -> list:
    """[(strategies, epsilons, ks)]: the private grids as few Hydra sweeps as the cells left out allow (a sweep is
    a product: strategy x epsilon x k)."""
    by_cell = {}
    for name, private, _, _, epsilons, _, k in found:
        if private and epsilons:
            by_cell.setdefault((tuple(epsilons), k), []).append(name)
    sweeps = {}
    for (epsilons, k), names in sorted(by_cell.items(), key=lambda item: item[0][1]):
        sweeps.setdefault((tuple(sorted(names)), epsilons), []).append(k)
    return [(list(names), list(epsilons), ks) for (names, epsilons), ks in sweeps.items()]


def main(argv=None, dpgrid=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()), usage="%(prog)s [options] dataset [-- override ...]")
    parser.add_argument("dataset", help="a dataset option: " + ", ".join(options("dataset")))
    parser.add_argument("--k", type=int, nargs="+", default=[5, 7, 9],
                        help="the granularities to run (values per log-spaced axis; the paper's: 5 7 9)")
    parser.add_argument("--seeds", type=int, default=5, help="runs per configuration (train.seeds; the paper's: 5)")
    parser.add_argument("--data-root", default="./data", help="data.root: where the dataset's files are read from")
    parser.add_argument("--results", default="outputs", help="hydra.sweep.dir: the results tree")
    parser.add_argument("--launcher", choices=["basic", "local", "slurm"], default="basic",
                        help="basic: here, as dpgrid run -m places grids (one after another on a CPU, side by side "
                        "on a GPU); local: --jobs processes here; slurm: SLURM jobs")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes with --launcher local or --paper-cells "
                        "(with --paper-cells --launcher slurm: cells queued at once, each waited on by a light process)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the runs, the compute estimate and the commands, and run nothing")
    parser.add_argument("--paper-cells", action="store_true",
                        help="only the paper's best configuration of each cell, with the whole grid's noise")
    parser.add_argument("--strategies", nargs="+", help="--paper-cells: only these strategies (default: all)")
    parser.add_argument("--epsilons", type=float, nargs="+", help="--paper-cells: only these privacy levels")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)  # overrides for every run follow "--"
    args = parser.parse_args(argv[:cut])
    args.extra = argv[cut + 1:]
    if args.paper_cells:
        return reproduce_paper_cells(args, dpgrid or in_a_process)

    d, ks = args.dataset, args.k
    found = grids(d, ks, args.extra)
    baselines = sorted({name for name, is_private, *_ in found if not is_private})
    configs = sum(K * (len(eps) if is_private else 1) for _, is_private, K, _, eps, _, _ in found)
    runs = configs * args.seeds
    steps = sum(K * T * (len(eps) if p else 1) for _, p, K, T, eps, _, _ in found) * args.seeds
    seconds = sum(K * T * (len(eps) if p else 1) * sec for _, p, K, T, eps, sec, _ in found) * args.seeds
    print(f"{d}: {configs} configurations x {args.seeds} seeds = {runs} training runs ({steps:,} steps); "
          f"about {duration(seconds)} on one 2-core machine (dataset.seconds_per_step), less with --launcher local/slurm")

    common = [f"dataset={d}", f"data.root={args.data_root}", f"train.seeds={args.seeds}",
              f"hydra.sweep.dir={args.results}", *args.extra]
    if args.launcher != "basic":
        common.append(f"hydra/launcher={args.launcher}")
    if args.launcher == "local":
        common.append(f"hydra.launcher.n_jobs={args.jobs}")
    commands = [
        *[["dpgrid", "run", "-m", f"strategy={','.join(names)}", f"privacy.epsilon={','.join(f'{e:g}' for e in epsilons)}",
           f"grid.k={','.join(map(str, sweep_ks))}", *common] for names, epsilons, sweep_ks in private_sweeps(found)],
        *([["dpgrid", "run", "-m", f"strategy={','.join(baselines)}", f"grid.k={','.join(map(str, ks))}", *common]]
          if baselines else []),  # no epsilon
        ["dpgrid", "tables", args.results],
    ]
    for command in commands:
        print("$", shlex.join(command))
    if args.dry_run:
        return 0
    sweeps, tables = commands[:-1], commands[-1]
    if args.launcher != "slurm":  # this machine's cores: one sweep after the other
        for command in sweeps:
            subprocess.run(command, check=True)
    else:  # on SLURM the baselines' sweep is queued beside the private one, not after it
        started = [subprocess.Popen(command) for command in sweeps]
        failed = [shlex.join(c) for c, proc in zip(sweeps, started) if proc.wait()]
        if failed:
            raise DpgridError(f"{len(failed)} sweep(s) did not finish (each said why above); the same command resumes")
    subprocess.run(tables, check=True)


# --- --paper-cells ------------------------------------------------------------------------------------

def paper_cells(dataset: str, ks: list, extra: list, only_strategies=None, only_epsilons=None):
    """([(strategy, epsilon, k, config_id, steps, seconds per step)], [skipped cell, why]) for every private
    strategy's cell the paper reports at these k (or the strategies and epsilons named): its best
    configuration found in dpgrid's grid."""
    from dpgrid.reproduction.paper import paper_results

    paper = paper_results()
    paper = paper[paper.dataset == dataset]
    cells, skipped = [], []
    for k in ks:
        if k not in set(paper.k[paper.value.notna()]):
            skipped.append(f"{dataset} k={k}: the paper reports no values at this k (Tables 8-13 have k = 9 and 5)")
            continue
        for name in only_strategies or options("strategy"):
            if (spec := compiled(dataset, name, k, extra)) is None:
                continue
            plan = spec.plan
            if not plan.private:
                continue  # the paper reports the non-private baseline's learning rate only
            if name not in set(paper.strategy):
                skipped.append(f"{dataset} {name} k={k}: not one of the paper's strategies; skipped")
                continue
            for epsilon in only_epsilons or plan.dataset_epsilons:
                where = f"{dataset} {name} eps={epsilon:g} k={k}"
                row = paper[(paper.k == k) & (paper.strategy == name) & (paper.epsilon == epsilon)]
                if row.empty or row.value.isna().all():
                    why = "diverged in the paper" if len(row) else "not in the paper's tables"
                    skipped.append(f"{where}: the paper reports no value ({why}); skipped")
                    continue
                config_id = matching_config(plan.configurations, row.iloc[0])
                if config_id is None:
                    skipped.append(f"{where}: the paper's hyperparameters are not in dpgrid's grid; skipped")
                    continue
                cells.append((name, float(epsilon), k, config_id, plan.steps,
                              float(spec.dataset.seconds_per_step or 0)))
    return cells, skipped


def matching_config(configs: list, paper_row):
    """The id of the configuration whose axes the paper's row names (its printed, rounded values)."""
    from dpgrid.reporting.comparison import same_value

    for config in configs:
        axes = [a for a in ("lr", "clip", "quantile") if a in config]
        if axes and all(same_value(config[a], paper_row[a]) for a in axes):  # a missing (NaN) value matches nothing
            return config["config_id"]
    return None


def cell_command(args, name, epsilon, k, config_id) -> list:
    """One cell's `dpgrid run`: in its folder of RESULTS on this machine, or (--launcher slurm) submitted as a
    one-job sweep whose folder is the same deterministic tree (hydra.sweep.subdir)."""
    overrides = [f"dataset={args.dataset}", f"data.root={args.data_root}", f"strategy={name}", f"privacy.epsilon={epsilon:g}",
                 f"grid.k={k}", f"grid.only=[{config_id}]", f"train.seeds={args.seeds}", *args.extra]
    if args.launcher == "slurm":
        return ["dpgrid", "run", "-m", "hydra/launcher=slurm", *overrides, f"hydra.sweep.dir={args.results}"]
    return ["dpgrid", "run", *overrides, f"hydra.run.dir={args.results}/{args.dataset}/{name}/eps{epsilon:g}/k{k}"]


def in_a_process(command: list, threads) -> subprocess.CompletedProcess:
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))  # parallel cells share the cores
    return subprocess.run(command, env=env, capture_output=True, text=True)


def reproduce_paper_cells(args, dpgrid=in_a_process):
    cells, skipped = paper_cells(args.dataset, args.k, args.extra, args.strategies, args.epsilons)
    for line in skipped:
        print(line)
    runs = len(cells) * args.seeds
    seconds = sum(steps * seconds for *_, steps, seconds in cells) * args.seeds
    print(f"{args.dataset}: {len(cells)} paper cells x {args.seeds} seeds = {runs} training runs; about "
          f"{duration(seconds)} on one 2-core machine (dataset.seconds_per_step), divided by --jobs")
    commands = [cell_command(args, name, epsilon, k, config_id) for name, epsilon, k, config_id, *_ in cells]
    for command in commands:
        print("$", shlex.join(command))
    if args.dry_run:
        return 0
    # on this machine the cells share its cores; on SLURM each job has its own allocation (train.threads=auto)
    threads = None if args.launcher == "slurm" else max(1, (os.cpu_count() or 1) // args.jobs)
    if args.jobs == 1:
        done = [dpgrid(command, threads) for command in commands]
    else:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            done = list(pool.map(lambda command: dpgrid(command, threads), commands))
    failed = [(c, r) for c, r in zip(commands, done) if r.returncode]
    for command, result in failed:
        print(f"FAILED: {shlex.join(command)}\n  {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    tables = dpgrid(["dpgrid", "tables", args.results], threads)
    if tables.returncode:
        print(f"FAILED: dpgrid tables {args.results}\n  {tables.stderr.strip()}")
        return 1
    print(f"tables: {args.results}/tables/{args.dataset}_k<k>_vs_paper.md")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DpgridError as e:
        print(f"reproduce.py: error: {e}", file=sys.stderr)
        sys.exit(2)
