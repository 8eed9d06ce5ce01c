"""The paper's side: its published numbers (dpgrid/reproduction/reference/paper_results.csv), its main claim
(dpgrid/reproduction/reference/paper_claim.json) and the layout of its tables. dpgrid's grids are compared with
them by dpgrid.reporting.comparison."""

import json
from importlib import resources

import pandas as pd


def reference(name: str):
    return resources.files("dpgrid.reproduction.reference").joinpath(name)


def paper_results() -> pd.DataFrame:
    with reference("paper_results.csv").open() as f:
        return pd.read_csv(f, comment="#")


def paper_claim() -> dict:
    """{"strategy": ..., "rivals": [...], "source": ...}: who the paper says is at least as good as whom."""
    return json.loads(reference("paper_claim.json").read_text())


def hyperparameters_only(paper: pd.DataFrame, dataset: str, k: int) -> bool:
    """Whether the paper's table of (dataset, k) shows the best hyperparameters only (its Tables 2-4, k = 7):
    dpgrid's table of that cell then follows the same layout. Any other grid shows its scores."""
    cell = paper[(paper.dataset == dataset) & (paper.k == k)]
    return bool(len(cell)) and bool(cell.value.isna().all())
