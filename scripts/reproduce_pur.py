"""Regenerate Table 3 and Figure 1 of the PUR paper ("Adaptive hyperparameter selection for differentially
private gradient descent") with dpgrid's strategies pur, constant_noise and pur_oracle.

    python scripts/reproduce_pur.py --quick                  # 10 repetitions, at most 5,000 iterations: minutes
    python scripts/reproduce_pur.py                          # 120 repetitions, as the paper
    python scripts/reproduce_pur.py --data-root /path/to/data --datasets mnist_binary --repeats 3 --table-only \
        --out docs/pur/mnist_binary                          # MNIST's cells: a full-batch step over 60,000 x 784

Every run goes through `dpgrid.run_grid` (the same runs `dpgrid run dataset=iris strategy=pur ...` makes), into
--results (default outputs/pur; resumed when run again). Writes into --out (default docs/pur):
- table3.csv / table3.md: the final empirical risk F(theta_T) at epsilon = 0.1 and 20 (lambda = 0.1, see
  docs/pur/README.md), median over the repetitions, for ours (pur) and the best constant sigma chosen in
  hindsight, each next to the paper's value and the difference;
- figure1.png / figure1.pdf: ||grad F|| against the cumulative epsilon, median and interquartile band over the
  repetitions, synthetic and iris, lambda = 0 and 0.1, every schedule including the (non-private) oracle.
"""

import argparse
import time
from pathlib import Path

import pandas as pd

import dpgrid
from omegaconf import OmegaConf
from dpgrid.data import load
from dpgrid.data import tasks

PROTOCOL = OmegaConf.load(Path(__file__).with_suffix(".yaml"))  # schedules, datasets, the paper's Table 3
POINTS = 100  # validations per run (the figure's resolution)


def runs(dataset: str, strategy: str, epsilon: float, l2: float, args) -> pd.DataFrame:
    """The curves of every configuration of one schedule, all repetitions (config by config, so that each
    is validated about POINTS times whatever its number of iterations)."""
    common = [f"dataset={dataset}", f"strategy={strategy}", f"privacy.epsilon={epsilon}", f"dataset.l2={l2}",
              f"train.seeds={args.repeats}", f"train.epochs={args.max_iterations}", f"data.root={args.data_root}"]
    plan = dpgrid.plan(dpgrid.compose(common))
    curves = []
    for c in plan.configurations:
        steps = plan.record.schedule[c["config_id"]]["steps"] if plan.epsilon_spent is not None else POINTS  # oracle: every step
        cfg = dpgrid.compose([*common, f"grid.only=[{c['config_id']}]", f"train.eval_every={max(1, steps // POINTS)}"])
        out = Path(args.results) / dataset / f"l2_{l2:g}" / f"eps{epsilon:g}" / strategy / c["config_id"]
        result = dpgrid.run_grid(cfg, out, progress=False)
        curves.append(result.curves[result.curves.config_id == c["config_id"]].assign(
            schedule=f"sigma={c['sigma']:g}" if "sigma" in c else strategy))
    return pd.concat(curves, ignore_index=True)


def final_risk(curves: pd.DataFrame) -> pd.Series:
    """Median over repetitions of F(theta_T), per schedule."""
    last = curves.sort_values("step").groupby(["schedule", "seed"]).tail(1)
    return last.groupby("schedule").value.median()


def optimum(dataset: str, l2: float, data_root: str) -> float:
    """F* = min over theta of the regularised risk, by L-BFGS in float64 (non-private: for the comparison only)."""
    import torch

    data = load(dpgrid.compose([f"dataset={dataset}", f"strategy={PROTOCOL.schedules.ours}"]).dataset, data_root)
    x, y = data.x_train, data.y_train
    theta = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    solver = torch.optim.LBFGS([theta], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                               line_search_fn="strong_wolfe")

    def risk():
        solver.zero_grad()
        value = torch.nn.functional.softplus(-y * (x @ theta)).mean() + 0.5 * l2 * theta.pow(2).sum()
        value.backward()
        return value
    for _ in range(10):
        solver.step(risk)
    return float(risk().detach())


def table3(datasets: list, args) -> pd.DataFrame:
    rows = []
    for dataset in datasets:
        best = {l2: optimum(dataset, l2, args.data_root) for l2 in (0.0, 0.1)}  # which lambda: docs/pur/README.md
        ours, constant = PROTOCOL.schedules.ours, PROTOCOL.schedules.constants
        for epsilon in PROTOCOL.table3.epsilons:
            risks = pd.concat([final_risk(runs(dataset, s, epsilon, PROTOCOL.table3.l2, args)) for s in (ours, constant)])
            constants = risks[risks.index.str.startswith("sigma=")]
            paper_ours, paper_constant = PROTOCOL.table3.paper[dataset][epsilon]
            for schedule, risk, paper, which in (("ours", risks[ours], paper_ours, ours),
                                                 ("best_constant", constants.min(), paper_constant, constants.idxmin())):
                rows.append(dict(dataset=dataset, epsilon=epsilon, schedule=schedule, risk=risk, paper_risk=paper,
                                 difference=risk - paper, chosen=which, optimum_l2_0=best[0.0],
                                 optimum_l2_0_1=best[0.1], repetitions=args.repeats,
                                 max_iterations=args.max_iterations))
            print(rows[-2], rows[-1], flush=True)
    return pd.DataFrame(rows)


def figure1(args, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 8), squeeze=False)
    for row, dataset in enumerate(PROTOCOL.figure1.datasets):
        for col, l2 in enumerate(PROTOCOL.figure1.l2):
            ax = axes[row][col]
            curves = pd.concat([runs(dataset, s, PROTOCOL.figure1.epsilon, l2, args) for s in PROTOCOL.schedules.values()],
                               ignore_index=True)
            for schedule, g in curves.groupby("schedule"):
                by_step = g.groupby("step")
                stats = pd.DataFrame({"epsilon": by_step.epsilon.median(), "median": by_step.grad_norm.median(),
                                      "q1": by_step.grad_norm.quantile(0.25), "q3": by_step.grad_norm.quantile(0.75)})
                stats = stats[stats.epsilon > 0].dropna()
                names = {PROTOCOL.schedules.ours: "PUR (ours)", PROTOCOL.schedules.oracle: "oracle (not private)"}
                label = names.get(schedule, schedule)
                line, = ax.plot(stats.epsilon, stats["median"], label=label)
                ax.fill_between(stats.epsilon, stats.q1, stats.q3, alpha=0.2, color=line.get_color())
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{dataset}, λ = {l2:g}")
            ax.set_xlabel("cumulative ε")
            ax.set_ylabel("‖∇F(θ)‖")
            ax.legend(fontsize=7)
    fig.suptitle(f"‖∇F‖ against ε: median and interquartile range of {args.repeats} repetitions "
                 f"(at most {args.max_iterations:,} iterations)")
    fig.tight_layout()
    for suffix in ("png", "pdf"):
        fig.savefig(out / f"figure1.{suffix}", dpi=120)


def markdown(table: pd.DataFrame) -> str:
    lines = ["| dataset | ε | schedule | risk (dpgrid) | risk (paper) | difference | chosen σ | F* (λ = 0.1) | F* (λ = 0) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        chosen = r.chosen if r.schedule == "best_constant" else ""
        lines.append(f"| {r.dataset} | {r.epsilon:g} | {r.schedule} | {r.risk:.4f} | {r.paper_risk:.4f} | "
                     f"{r.difference:+.4f} | {chosen} | {r.optimum_l2_0_1:.4f} | {r.optimum_l2_0:.4f} |")
    return "\n".join(lines + ["", f"- {tasks.get('logistic').disclosure}"]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="10 repetitions, at most 5,000 iterations")
    parser.add_argument("--repeats", type=int, default=120, help="runs per configuration (the paper's 120)")
    parser.add_argument("--max-iterations", type=int, default=100_000, help="at most this many steps per run")
    parser.add_argument("--data-root", default="./data", help="data.root: where the datasets' files are read from")
    parser.add_argument("--results", default="outputs/pur", help="hydra.sweep.dir: the results tree")
    parser.add_argument("--datasets", nargs="+", help="only these (default: every dataset of the protocol whose data is there)")
    parser.add_argument("--table-only", action="store_true", help="Table 3 without Figure 1")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs/pur"),
                        help="where Table 3 and Figure 1 are written (default docs/pur)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.max_iterations = 10, 5_000
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    datasets = []
    for dataset in args.datasets or PROTOCOL.datasets:
        try:  # the file-based ones need their files under --data-root
            load(dpgrid.compose([f"dataset={dataset}", f"strategy={PROTOCOL.schedules.ours}"]).dataset, args.data_root)
            datasets.append(dataset)
        except dpgrid.DpgridError as e:
            print(f"skipped {dataset}: {e}")
    table = table3(datasets, args)
    table.to_csv(out / "table3.csv", index=False)
    (out / "table3.md").write_text(markdown(table))
    print(markdown(table))
    if not args.table_only:
        figure1(args, out)
    print(f"wrote {out / 'table3.csv'}, table3.md{'' if args.table_only else ', figure1.png, figure1.pdf'} in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
