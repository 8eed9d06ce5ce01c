"""Liu-Talwar random stopping vs composition (moments accountant): Mohapatra et al. 2022, Figure 1.

For DP-SGD runs with noise multiplier sigma, expected batch L and T steps on n examples:
  left:   LT's blowup for one candidate: its final epsilon_f (Theorem 1, gamma = 1) over the epsilon of
          the same run accounted on its own at delta_f;
  middle: epsilon_f of LT for gamma in {1, 0.1, 0.01, 0.001} (1/gamma candidates in expectation);
  right:  how many runs composition can account for within LT's epsilon_f at gamma = 1.
Both sides use dpgrid's RDP accountant (Opacus). Prints a table; --plot writes PNG and PDF.

    python scripts/selection_cost.py [--sigma 4 --lot 250 --steps 10000 --delta 1e-6] [--plot DIR]
"""

import argparse
import math

import pandas as pd

from dpgrid.privacy import liu_talwar_parameters, rdp_epsilon

# A dense grid of Renyi orders: at large n (tiny q) the best order is large, and a coarse grid bends the curves.
ORDERS = [1 + x / 10 for x in range(1, 100)] + list(range(12, 64)) + list(range(64, 1025, 8))
SIZES = [5_000, 10_000, 50_000, 100_000, 500_000, 950_000]
GAMMAS = [1.0, 0.1, 0.01, 0.001]


def lt_epsilon(sample_rate, sigma, steps, delta_f, gamma, delta_2=1e-20):
    """epsilon_f of LT when every candidate is this run: epsilon_f = 3 e1 + 3 sqrt(2 d1), with d1 from
    delta_f = sqrt(2 d1) Upsilon + delta_2, Upsilon = log(1 / delta_2) / gamma (Theorem 1)."""
    _, delta_1, _ = liu_talwar_parameters(0.0, delta_f, round(1 / gamma), delta_2)
    return 3 * rdp_epsilon(sample_rate, sigma, steps, delta_1, ORDERS) + 3 * math.sqrt(2 * delta_1)


def composable_runs(sample_rate, sigma, steps, delta, budget):
    """The largest K with K composed runs within `budget` (doubling, then bisection)."""
    def fits(k):
        return rdp_epsilon(sample_rate, sigma, k * steps, delta, ORDERS) <= budget
    if not fits(1):
        return 0
    high = 1
    while fits(2 * high):
        high *= 2
    low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def table(sigma, lot, steps, delta) -> pd.DataFrame:
    rows = []
    for n in SIZES:
        q = lot / n
        single = rdp_epsilon(q, sigma, steps, delta, ORDERS)
        lt = {g: lt_epsilon(q, sigma, steps, delta, g) for g in GAMMAS}
        rows.append(dict(n=n, epsilon_one_run=single, blowup=lt[1.0] / single,
                         **{f"lt_epsilon_gamma={g:g}": e for g, e in lt.items()},
                         composable_runs=composable_runs(q, sigma, steps, delta, lt[1.0])))
    return pd.DataFrame(rows)


def plot(df, directory):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(df.n, df.blowup, "o-")
    axes[0].set(xscale="log", xlabel="dataset size n", ylabel="LT epsilon / one run's epsilon",
                title="LT's minimal blowup (gamma = 1)")
    for g in GAMMAS:
        axes[1].plot(df.n, df[f"lt_epsilon_gamma={g:g}"], "o-", label=f"gamma = {g:g}")
    axes[1].set(xscale="log", yscale="log", xlabel="dataset size n", ylabel="LT's final epsilon",
                title="LT's cost barely grows with 1/gamma")
    axes[1].legend()
    axes[2].plot(df.n, df.composable_runs, "o-")
    axes[2].set(xscale="log", xlabel="dataset size n", ylabel="runs composable (MA)",
                title="runs within LT's minimal cost")
    fig.tight_layout()
    for ext in ("png", "pdf"):
        fig.savefig(f"{directory}/selection_cost.{ext}")
    print(f"figure: {directory}/selection_cost.png")


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--sigma", type=float, default=4.0, help="noise multiplier of every run")
    parser.add_argument("--lot", type=int, default=250, help="expected batch size L")
    parser.add_argument("--steps", type=int, default=10_000, help="steps T of one run")
    parser.add_argument("--delta", type=float, default=1e-6, help="delta_f of the whole selection (1e-6 matches the paper)")
    parser.add_argument("--plot", metavar="DIR", help="write selection_cost.png/.pdf into DIR")
    args = parser.parse_args()
    df = table(args.sigma, args.lot, args.steps, args.delta)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
        print(df.to_string(index=False))
    if args.plot:
        plot(df, args.plot)


if __name__ == "__main__":
    main()
