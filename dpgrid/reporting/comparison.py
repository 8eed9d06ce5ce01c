"""dpgrid's grids next to the paper's published numbers and its main claim (dpgrid.reproduction.paper holds
them). `dpgrid tables` writes what these return as <dataset>_k<k>_vs_paper.{csv,md} and <dataset>_k<k>_claim.csv.

A cell matches the paper when |ours - paper| <= sqrt(std_ours^2 + std_paper^2). The claim, per epsilon and
rival, is confirmed when the claimed strategy is better by more than the combined std of the two cells,
refuted when worse by more, undecided in between."""

import math

import numpy as np
import pandas as pd

from dpgrid.data import tasks
from dpgrid.config.grid import AXIS_SYMBOL
from dpgrid.reporting.cells import MISSING, NOT_RUN, fmt_hp, fmt_value, label_of, private_strategies
from dpgrid.reproduction.paper import paper_claim


def same_value(ours, printed) -> bool:
    """A grid value and the paper's printed one (4 significant digits): equal within 0.2 %."""
    return bool(np.isclose(ours, printed, rtol=2e-3))


def comparison(grids: pd.DataFrame, paper: pd.DataFrame, dataset: str, k: int) -> pd.DataFrame:
    """Ours next to the paper's, per (epsilon, strategy) the paper reports, for the private strategies
    that have at least one grid in `grids`."""
    rows = []
    ran = {name for name, _, _ in private_strategies(grids)}  # the paper's cells of the strategies run here
    for p in paper[(paper.dataset == dataset) & (paper.k == k) & paper.strategy.isin(ran)].itertuples():
        cell = grids[(grids.strategy == p.strategy) & np.isclose(grids.epsilon, p.epsilon)]
        status = NOT_RUN if cell.empty else cell.status.iloc[0]
        ours = cell.iloc[0] if len(cell) else None
        row = dict(epsilon=p.epsilon, strategy=p.strategy, paper_value=p.value, paper_std=p.std,
                   configs_run=ours.configs_run if ours is not None else 0,
                   n_configs=ours.n_configs if ours is not None else math.nan,
                   value=ours.value if ours is not None else math.nan,
                   std=ours["std"] if ours is not None else math.nan, status=status,
                   config_id=ours.config_id if ours is not None else None,
                   n_seeds=ours.n_seeds if ours is not None else 0)
        axes = [a for a in ("lr", "clip", "quantile") if not pd.isna(getattr(p, a))]  # the paper's columns
        for axis in axes:
            row[f"paper_{axis}"] = getattr(p, axis)
            row[axis] = ours[axis] if ours is not None else math.nan
        row["same_hyperparameters"] = status == "ok" and all(same_value(row[a], row[f"paper_{a}"]) for a in axes)
        row["axes"], row["label"] = ",".join(axes), label_of(grids, p.strategy)
        row["difference"] = row["value"] - row["paper_value"]
        combined = math.sqrt(np.nan_to_num(row["std"]) ** 2 + np.nan_to_num(row["paper_std"]) ** 2)
        row["within_std"] = bool(abs(row["difference"]) <= combined) if not math.isnan(row["difference"]) else None
        rows.append(row)
    return pd.DataFrame(rows)


ONE_SEED = "undecided (one seed: no spread to judge by)"
PAPER_SEEDS = 5  # every cell of the paper's tables is a mean over 5 seeds


def verdict(advantage: float, combined_std: float, claimed: str, seeds: int) -> str:
    """The claimed strategy's advantage (positive: better) against the noise of the two cells; `seeds` is
    the fewer of the two cells' seeds (one seed has no spread to judge by)."""
    if math.isnan(advantage):
        return MISSING
    if seeds < 2:
        return ONE_SEED
    if advantage > combined_std:
        return f"confirmed ({claimed} better)"
    if advantage < -combined_std:
        return f"refuted ({claimed} worse)"
    return "undecided (within combined std)"


def claims(comp: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per epsilon and rival: the claimed strategy's advantage over the rival (in the metric's units, positive =
    better), its combined std sqrt(std^2 + std_rival^2) and the verdict, for dpgrid's cells and the paper's."""
    claim = paper_claim()
    sign = 1.0 if tasks.get(metric).higher_is_better else -1.0
    rows = []
    for epsilon, cells in comp.groupby("epsilon", sort=True):
        by = cells.set_index("strategy")
        if claim["strategy"] not in by.index:
            continue
        claimed = by.loc[claim["strategy"]]
        for rival in (r for r in claim["rivals"] if r in by.index):
            row = dict(epsilon=epsilon, rival=rival)
            for who, value, std in (("", "value", "std"), ("paper_", "paper_value", "paper_std")):
                advantage = sign * (claimed[value] - by.loc[rival, value])
                combined = math.sqrt(np.nan_to_num(claimed[std]) ** 2 + np.nan_to_num(by.loc[rival, std]) ** 2)
                seeds = PAPER_SEEDS if who == "paper_" else min(claimed.n_seeds, by.loc[rival, "n_seeds"])
                row.update({f"{who}advantage": advantage, f"{who}combined_std": combined,
                            f"{who}verdict": verdict(advantage, combined, claim["strategy"], seeds)})
            rows.append(row)
    return pd.DataFrame(rows)


def claims_markdown(claim: pd.DataFrame, metric: str) -> str:
    better, claimed = "higher" if tasks.get(metric).higher_is_better else "lower", paper_claim()["strategy"]
    lines = ["", f"#### The paper's claim: {claimed} at least as good as each rival (advantage = {claimed}'s margin, "
                 f"{better} metric is better; verdict against the combined std)", "",
             "| ε | rival | ours: advantage ± combined std | ours: verdict | paper: advantage ± combined std | "
             "paper: verdict |", "|---|---|---|---|---|---|"]
    for r in claim.itertuples():
        ours = MISSING if pd.isna(r.advantage) else f"{fmt_value(r.advantage, metric)} ± {fmt_value(r.combined_std, metric)}"
        paper = (MISSING if pd.isna(r.paper_advantage)
                 else f"{fmt_value(r.paper_advantage, metric)} ± {fmt_value(r.paper_combined_std, metric)}")
        lines.append(f"| {r.epsilon:g} | {r.rival} | {ours} | {r.verdict} | {paper} | {r.paper_verdict} |")
    return "\n".join(lines) + "\n"


def comparison_markdown(comp: pd.DataFrame, metric: str, title: str) -> str:
    lines = [f"### {title}", "", "| ε | strategy | paper hyperparameters | paper | ours: hyperparameters | ours | "
             "difference | within combined std |", "|---|---|---|---|---|---|---|---|"]
    for r in comp.itertuples():
        axes = [a for a in r.axes.split(",") if a]  # none where the paper reports no value (a diverged grid)
        paper_hp = MISSING if not axes else ", ".join(f"{AXIS_SYMBOL[a]}={fmt_hp(getattr(r, 'paper_' + a))}" for a in axes)
        ours_hp = (MISSING if r.status != "ok" else r.config_id if not axes  # the paper names no hyperparameters
                   else ", ".join(f"{AXIS_SYMBOL[a]}={fmt_hp(getattr(r, a))}" for a in axes))
        paper_v = (f"{fmt_value(r.paper_value, metric)} ± {fmt_value(r.paper_std, metric)}"
                   if not pd.isna(r.paper_value) else f"{MISSING} (diverged)")
        ours_v = (f"{fmt_value(r.value, metric)} ± {fmt_value(r.std, metric)}" if r.status == "ok"
                  else f"{MISSING} ({r.status})")
        diff = fmt_value(r.difference, metric) if not pd.isna(r.difference) else MISSING
        within = MISSING if r.within_std is None or pd.isna(r.within_std) else ("yes" if r.within_std else "no")
        if r.status == "ok" and r.configs_run < r.n_configs:
            ours_hp += f" ({r.configs_run:.0f} of {r.n_configs:.0f} configurations run)"
        lines.append(f"| {r.epsilon:g} | {r.label} | {paper_hp} | {paper_v} | {ours_hp} | {ours_v} | "
                     f"{diff} | {within} |")
    return "\n".join(lines) + "\n"
