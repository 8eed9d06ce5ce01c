"""How grids are named and printed in tables and figures: cell formats, strategy labels, budget notes, and a paper
table (`Table`) rendered three ways: CSV with the raw numbers, Markdown to read, LaTeX (booktabs) to print as it is.
Everything about a strategy comes from the collected grids (their plan.json), never from a list here."""

from dataclasses import dataclass, field

import pandas as pd

from dpgrid import tasks

MISSING = "–"
NOT_RUN = "grid not run"  # why a cell is missing
EPSILON_DECIMALS = 2      # every epsilon column of a table: ε seeds, ε grid
HP_DIGITS = 3             # hyperparameters: significant digits (log-spaced values: 0.00316, 0.316, 31.6)


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
        return ("ε per selection (privacy.selection=random_stopping or subsample_tuning): ε covers ONLY the selected "
                "configuration and its score (selection.json) and, after tuning on a subsample, the final model whose "
                "score the table shows; the candidates' runs are the experimenter's private log")
    return ("MIXED budgets side by side (--mix-budgets): per_grid = all runs spend ε; per_run = each run does (see "
            "ε grid); selection = only the selected configuration and its score are covered")


# --- formatting -------------------------------------------------------------------------------------

def fmt_hp(v) -> str:
    """A hyperparameter: HP_DIGITS significant digits, the same rule for every one."""
    return MISSING if pd.isna(v) else f"{v:.{HP_DIGITS}g}"


def fmt_value(v, metric) -> str:
    """A metric value as tables print it: accuracy in %, MSE x 10^2 (as the paper), with the task's decimals."""
    if pd.isna(v):
        return MISSING
    task = tasks.get(metric)
    return f"{v * task.table_scale:.{task.table_decimals}f}"


def fmt_epsilon(v) -> str:
    return MISSING if pd.isna(v) else f"{v:.{EPSILON_DECIMALS}f}"


# --- a paper table ----------------------------------------------------------------------------------

@dataclass
class Column:
    name: str          # its header under its block ("ρ", "acc", "ε seeds"), or a row key's ("ε")
    kind: str          # key | hp | value | epsilon
    csv: str           # its column in the CSV (flat: "Online ρ", "Online acc", "Online std")


@dataclass
class Table:
    """Rows of cells under column blocks, one block per strategy. A cell is a raw number, (mean, std) for a value,
    a text (row keys), or None (missing, its reason in a footnote)."""
    title: str
    caption: str
    label: str
    metric: str
    keys: list                                   # [Column] of the row keys (ε, and what else varies)
    blocks: list = field(default_factory=list)   # [(label, [Column])]
    rows: list = field(default_factory=list)     # [{column csv name: cell}]
    best: set = field(default_factory=set)       # {(row index, column csv name)}: the best value of its row
    notes: list = field(default_factory=list)

    def columns(self) -> list:
        return self.keys + [c for _, columns in self.blocks for c in columns]

    def text(self, row: int, column: Column) -> str:
        cell = self.rows[row].get(column.csv)
        if cell is None or (not isinstance(cell, (tuple, str)) and pd.isna(cell)):
            return MISSING
        if column.kind == "value":
            mean, std = cell
            return fmt_value(mean, self.metric) + ("" if pd.isna(std) else f" ± {fmt_value(std, self.metric)}")
        if column.kind == "hp":
            return fmt_hp(cell)
        if column.kind == "epsilon":
            return fmt_epsilon(cell)
        return str(cell)


def to_csv_frame(table: Table) -> pd.DataFrame:
    """The raw numbers, one column each (a value's mean and std apart): for programs, not for print."""
    records = []
    for row in table.rows:
        record = {}
        for column in table.columns():
            cell = row.get(column.csv)
            if column.kind == "value":
                mean, std = cell if cell is not None else (None, None)
                record[column.csv], record[column.csv.rsplit(" ", 1)[0] + " std"] = mean, std
            else:
                record[column.csv] = cell
        records.append(record)
    names = [n for c in table.columns() for n in ([c.csv, c.csv.rsplit(" ", 1)[0] + " std"] if c.kind == "value"
                                                    else [c.csv])]
    return pd.DataFrame(records, columns=names)


def to_markdown(table: Table) -> str:
    header = [c.name if not block else f"{block} {c.name}" for block, c in labelled(table)]
    lines = [f"### {table.title}", "", table.caption, "", "| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if c.kind != "key" else "---" for c in table.columns()) + "|"]
    for i in range(len(table.rows)):
        cells = [bold(table.text(i, c), (i, c.csv) in table.best, "**", "**") for c in table.columns()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + [f"- {n}" for n in table.notes]) + "\n"


def to_latex(table: Table) -> str:
    """A booktabs table a paper prints as it is: caption and label, numbers right-aligned, a header per strategy
    block, the best value of each row in bold, footnotes below (they render). Needs \\usepackage{booktabs}."""
    keys = len(table.keys)
    spec = "l" * keys + "".join("r" * len(columns) for _, columns in table.blocks)
    groups, rules, start = [""] * keys, [], keys + 1
    for block, columns in table.blocks:
        groups.append(rf"\multicolumn{{{len(columns)}}}{{c}}{{{tex(block)}}}")
        rules.append(rf"\cmidrule(lr){{{start}-{start + len(columns) - 1}}}")
        start += len(columns)
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{tex(table.caption)}}}", rf"\label{{{table.label}}}",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(groups) + r" \\", " ".join(rules),
             " & ".join(f"${c.name}$" if len(c.name) == 1 and c.name.isascii() else tex(c.name)  # C, a symbol
                        for c in table.columns()) + r" \\", r"\midrule"]
    for i in range(len(table.rows)):
        lines.append(" & ".join(bold(tex(table.text(i, c)), (i, c.csv) in table.best, r"\textbf{", "}")
                                for c in table.columns()) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.notes:
        lines += [r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize"]
        lines += [tex(n) + (r"\par" if i < len(table.notes) - 1 else "") for i, n in enumerate(table.notes)]
        lines.append(r"\end{minipage}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def labelled(table: Table) -> list:
    return [("", c) for c in table.keys] + [(block, c) for block, columns in table.blocks for c in columns]


def bold(text: str, marked: bool, before: str, after: str) -> str:
    return f"{before}{text}{after}" if marked and text != MISSING else text


TEX_SYMBOLS = {"ρ": r"$\rho$", "γ": r"$\gamma$", "ε": r"$\varepsilon$", "σ": r"$\sigma$", "δ": r"$\delta$",
               "ν": r"$\nu$", "±": r"$\pm$", "×10²": r"$\times 10^2$", "–": "--", "≥": r"$\geq$", "≤": r"$\leq$",
               "·": r"$\cdot$", "²": r"$^2$", "×": r"$\times$"}


def tex(text) -> str:
    """Plain text with the paper's symbols, escaped for LaTeX."""
    out = []
    for ch in str(text).replace("×10²", "\0"):
        if ch == "\0":
            out.append(TEX_SYMBOLS["×10²"])
        elif ch in "\\":
            out.append(r"\textbackslash{}")
        elif ch in "&%$#_{}":
            out.append("\\" + ch)
        elif ch in "~^":
            out.append(r"\textasciitilde{}" if ch == "~" else r"\textasciicircum{}")
        else:
            out.append(TEX_SYMBOLS.get(ch, ch))
    return "".join(out)
