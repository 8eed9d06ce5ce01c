"""The sampling tests of `dpgrid audit` (docs/audit.md, "Reading the sampling off the batches") on batches alone, with
no training, so that every grid's draws are its own: dpgrid's Poisson sampler (seeded, each grid from its own seeds, and
secure) over many grids, for the tests' false alarms, and the broken plugins' samplers (tests/audited: round(q N)
examples drawn afresh each step; one permutation per epoch cut into batches of round(q N)), for how often they are
caught. Each grid is the default audit's of a k = 2 grid on digits (N = 1,437, B = 128): 4 runs of T steps (1 epoch:
T = 12; 10 epochs: T = 113), pooled as the audit pools them, each test at its share of the audit's 95 % (0.05 over
the 8 tests of a linear strategy), and at 5 % alone.

    python scripts/sampling_study.py [--grids 1000] [--plugin-grids 100]   # about 20 minutes on 2 busy CPU cores

Writes docs/audit/sampling.csv and prints it as markdown.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from selection_study import markdown  # (scripts/ is on the path of a script run from it)

from dpgrid.audit.mechanism import overlap_test, size_test
from dpgrid.privacy.randomness import SecureRandom, derive_seed
from dpgrid.training import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "audited"))
from broken_strategies import FixedSizeBatches, ShuffledBatches  # noqa: E402  (the plugins' own samplers)

N, B, RUNS = 1437, 128, 4
SHARE = 0.05 / 8  # one test's share of the default audit's 95 %, Bonferroni over its 8 tests


def sampler(name: str, grid: int, run: int):
    """Run `run` of grid `grid`'s endless batches as `name` draws them (seeded: from the grid's and run's own seed)."""
    seeded = torch.Generator().manual_seed(derive_seed("sampling study", name, grid, run))
    if name == "poisson, seeded":
        return train.batches(N, B / N, B, "poisson", seeded)
    if name == "poisson, secure":
        return train.batches(N, B / N, B, "poisson", SecureRandom())
    plugin = {"fixed size": FixedSizeBatches, "shuffled": ShuffledBatches}[name]
    return plugin.batches(N, round(B / N * N), seeded)


def grid_p_values(name: str, grid: int, steps: int) -> tuple:
    """(spread, its p-value, overlap, its p-value) of one grid's runs, pooled, as dpgrid.audit.mechanism measures them
    from what GradientCanaries records (each step's size and overlap with the batch before)."""
    sizes, overlaps = [], []
    for run in range(RUNS):
        drawn = sampler(name, grid, run)
        previous = None
        for _ in range(steps):
            batch = next(drawn)
            if previous is not None:
                overlaps.append((int(torch.isin(batch, previous).sum()), len(previous), len(batch)))
            sizes.append(len(batch))
            previous = batch
    spread, _, p_spread = size_test(np.array(sizes), N, B / N, SHARE)
    overlap, _, p_overlap = overlap_test(np.array(overlaps), N, SHARE)
    return spread, p_spread, overlap, p_overlap


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--grids", type=int, default=1000, help="grids of each honest sampler at each length")
    parser.add_argument("--plugin-grids", type=int, default=100, help="grids of each plugin's sampler at each length")
    args = parser.parse_args()
    rows = []
    for name, grids in [("poisson, seeded", args.grids), ("poisson, secure", args.grids),
                        ("fixed size", args.plugin_grids), ("shuffled", args.plugin_grids)]:
        for epochs in (1, 10):
            steps = math.ceil(epochs * N / B)
            start = time.perf_counter()
            found = np.array([grid_p_values(name, grid, steps) for grid in range(grids)])
            spread, p_spread, overlap, p_overlap = found.T
            rows.append(dict(sampler=name, epochs=epochs, steps=steps, grids=grids,
                             spread_flagged=int((p_spread < SHARE).sum()),
                             overlap_flagged=int((p_overlap < SHARE).sum()),
                             either_flagged=int(((p_spread < SHARE) | (p_overlap < SHARE)).sum()),
                             spread_at_5pc=int((p_spread < 0.05).sum()), overlap_at_5pc=int((p_overlap < 0.05).sum()),
                             median_spread=round(float(np.median(spread)), 3),
                             median_overlap=round(float(np.median(overlap)), 4),
                             seconds=round(time.perf_counter() - start, 1)))
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    (ROOT / "docs" / "audit").mkdir(parents=True, exist_ok=True)
    frame.to_csv(ROOT / "docs" / "audit" / "sampling.csv", index=False)
    print(markdown(frame))


if __name__ == "__main__":
    main()
