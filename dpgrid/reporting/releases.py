"""What covers each grid's released model, as the tables and figures say it: the epsilon its sealed model/model.json
states (`covered_by`: the epsilon with seeds, or both grids' steps composed for a grid fine-tuned from a private
checkpoint on the same data), beside what a row or a point already shows, and which grids released none."""

import math
from pathlib import Path

import pandas as pd

from dpgrid import DpgridError
from dpgrid.reporting.cells import fmt_epsilon, grid_name

UNRELEASED = "no model/: train.save_models=none, or the grid has not finished"
BOTH_GRIDS = ("both grids together cover a model fine-tuned from a private checkpoint on the same data "
              "(model.json's covered_by)")


def release_of(folder: Path, plan: dict) -> dict:
    """Whether the grid released a model (model/), and the epsilon that covers it as its sealed statement says (NaN
    where no epsilon covers it, a non-private grid's). A statement edited since its seal, or sealed with another
    plan.json, is refused: the grid is skipped in one line naming the file."""
    from dpgrid.results.files import read_json
    from dpgrid.results.statement import MODEL, STATEMENT, grid_plan, seal_of

    path = folder / MODEL / STATEMENT
    if not path.exists():  # train.save_models=none, a grid still training, a selection that released nothing
        return {"released": False, "epsilon_released": math.nan}
    record = read_json(path, "restore it from a copy, or run the grid's command again")
    if not isinstance(record.get("seal"), dict) or record["seal"].get("statement") != seal_of(record)["statement"]:
        raise DpgridError(f"{path} was edited after the release (it does not match its seal): the epsilon that "
                          "covers the model cannot be vouched for; restore it from a copy")
    if record.get("plan") != grid_plan(plan):
        raise DpgridError(f"{path} was sealed with another plan.json (a model/ from another grid, or plan.json was "
                          "edited): the epsilon that covers the model cannot be vouched for")
    covered = record.get("covered_by")
    epsilon = covered.get("epsilon") if isinstance(covered, dict) else None
    return {"released": True, "epsilon_released": float(epsilon) if isinstance(epsilon, (int, float)) else math.nan}


def released(grids: pd.DataFrame) -> pd.Series:
    """Which grids released a model (a row without the column: none)."""
    return grids.released.fillna(False).astype(bool) if "released" in grids else pd.Series(False, index=grids.index)


def covered_beyond(grids: pd.DataFrame, shown: pd.Series) -> pd.DataFrame:
    """The grids whose released model is covered by more than `shown` (per grid: the epsilon its row or point
    already states): a grid fine-tuned from a private checkpoint on the same data."""
    mine = grids[released(grids)]
    return mine[mine.epsilon_released.astype(float) > shown[mine.index].astype(float).fillna(math.inf) * (1 + 1e-9)]


def unreleased_words(grids: pd.DataFrame, among: pd.DataFrame) -> str:
    """The grids of `grids` that released no model, named as `among` tells them apart ('' where every one did)."""
    none = grids[~released(grids)]
    return (f"No released model ({UNRELEASED}): " + "; ".join(f"{grid_name(r, among)} at ε = {r.epsilon:g}"
                                                             for r in none.itertuples()) + ".") if len(none) else ""


def table_note(private: pd.DataFrame, model_column: bool, seeds_shown: bool) -> str:
    """A table caption's sentence on what covers each grid's released model."""
    if not released(private[private.status == "ok"]).any():
        return ""  # a footnote names the grids that released nothing
    if model_column:
        return ("ε model: the ε that covers each grid's released model (model.json's covered_by); a grid fine-tuned "
                "from a private checkpoint on the same data is covered by both grids together, more than its own ε.")
    return ("Each grid's released model (model/) is covered by the ε its row shows"
            + (" (its ε seeds)." if seeds_shown else "."))


def figure_sentence(shown: pd.DataFrame) -> str:
    """A metric figure caption's sentences: what covers each point's released model where that is more than its mean
    costs, and which grids released none."""
    beyond = covered_beyond(shown, shown.epsilon_with_seeds)
    text = ""
    if len(beyond):
        text += (" The released model of " + "; ".join(
            f"{grid_name(r, shown)} at ε = {r.epsilon:g} is covered by ε = {fmt_epsilon(r.epsilon_released)}"
            for r in beyond.itertuples()) + f", more than its mean: {BOTH_GRIDS}.")
    if released(shown).sum() > len(beyond):
        text += f" {'Every other' if len(beyond) else 'Each'} grid's released model is covered by the ε its mean costs."
    unreleased = unreleased_words(shown, shown)
    return text + (f" {unreleased}" if unreleased else "")


def curve_sentence(grid_row) -> str:
    """A learning curve's caption sentence on what covers its grid's released model."""
    row = pd.DataFrame([{"released": getattr(grid_row, "released", False),
                         "epsilon_released": getattr(grid_row, "epsilon_released", math.nan),
                         "epsilon_with_seeds": getattr(grid_row, "epsilon_with_seeds", math.nan)}])
    if not released(row).iloc[0]:
        return f" The grid released no model ({UNRELEASED})."
    if len(covered_beyond(row, row.epsilon_with_seeds)):
        return f" Its released model (model/) is covered by ε = {fmt_epsilon(row.epsilon_released.iloc[0])}: {BOTH_GRIDS}."
    return " Its released model (model/) is covered by the same ε."
