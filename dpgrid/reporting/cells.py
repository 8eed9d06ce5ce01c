"""How grids are named and printed in tables and figures: cell formats, strategy labels and budget notes.
Everything about a strategy comes from the collected grids (their plan.json), never from a list here."""

import pandas as pd

from dpgrid import tasks

MISSING = "–"
NOT_RUN = "grid not run"  # why a cell is missing


def private_strategies(grids: pd.DataFrame) -> list:
    """[(name, label, axes)] of the private strategies among grids, by label."""
    rows = grids[grids.private.astype(bool)].drop_duplicates("strategy")
    return sorted(((r.strategy, r.label, [a for a in r.axes.split(",") if a]) for r in rows.itertuples()),
                  key=lambda t: t[1])


def label_of(grids: pd.DataFrame, strategy: str) -> str:
    found = grids.label[grids.strategy == strategy]
    return found.iloc[0] if len(found) else strategy


def budget_note(grids: pd.DataFrame) -> str:
    """The budget the grids of one table were run under, in words (tables and figure captions)."""
    budgets = set(grids[grids.private.astype(bool)].budget.dropna())
    if budgets == {"per_run"}:
        return "ε per run (privacy.budget=per_run): each run spends ε; the whole grid's true ε is the 'ε grid' column"
    if budgets == {"per_grid"} or not budgets:
        return "ε per grid: all runs of a grid together spend ε (honest tuning)"
    if budgets == {"selection"}:
        return ("ε per selection (privacy.selection=random_stopping): ε covers ONLY the selected configuration and "
                "its score (selection.json); the candidates' runs are the experimenter's private log")
    return ("MIXED budgets side by side (--mix-budgets): per_grid = all runs spend ε; per_run = each run does (see "
            "ε grid); selection = only the selected configuration and its score are covered")


# --- formatting -------------------------------------------------------------------------------------

def fmt_hp(v) -> str:
    return MISSING if pd.isna(v) else f"{v:.4g}"


def fmt_value(v, metric) -> str:
    """Accuracy in %, MSE x 10^2 (as the paper prints them)."""
    if pd.isna(v):
        return MISSING
    return f"{v * tasks.get(metric).table_scale:.2f}"


def to_latex(table: pd.DataFrame, title: str, footnotes: list) -> str:
    """booktabs tabular; the paper's symbols as math."""
    def tex(s):
        s = str(s).replace("×10²", r"$\times 10^2$").replace("–", "--").replace("±", r"$\pm$")
        for greek, cmd in (("ρ", r"$\rho$"), ("γ", r"$\gamma$"), ("ε", r"$\varepsilon$")):
            s = s.replace(greek, cmd)
        return s.replace("_", r"\_")
    lines = [f"% {title}", r"\begin{tabular}{" + "l" * len(table.columns) + "}", r"\toprule",
             " & ".join(tex(c) for c in table.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(tex(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"] + [f"% {tex(n)}" for n in footnotes]
    return "\n".join(lines) + "\n"
