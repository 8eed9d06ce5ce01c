"""How grids are named and printed in tables and figures: cell formats, strategy labels, budget notes, and a paper
table (`Table`) rendered three ways: CSV with the raw numbers, Markdown to read, LaTeX (booktabs) to print as it is.
Everything about a strategy comes from the collected grids (their plan.json), never from a list here."""

import re
from dataclasses import dataclass, field

import pandas as pd

from dpgrid.data import tasks
from dpgrid.config.grid import AXIS_SYMBOL
from dpgrid.privacy import ACCOUNTING

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


ACCOUNTANT_NAMES = {"rdp": "Rényi DP accountant", "pld": "privacy-loss-distribution accountant",
                    "prv": "PRV accountant", "zcdp": "zCDP conversion"}
BUDGET_WORDS = {"per_grid": "ε per grid: all runs of a grid together spend ε (honest tuning)",
                "per_run": "ε per run: each run spends ε on its own; the whole grid's ε is the 'ε grid' column"}


def budget_note(grids: pd.DataFrame) -> str:
    """The budget the grids of one table were run under, in words (tables and figure captions): a selection's in
    the one wording of what its epsilon covers (its accounting method's `covers`)."""
    private = grids[grids.private.astype(bool)]
    notes = [BUDGET_WORDS[b] for b in ("per_grid", "per_run") if (private.budget == b).any()]
    selections = private[private.budget == "selection"]
    for name in sorted(set(selections.selection.dropna().astype(str)) if "selection" in selections else ()):
        method = ACCOUNTING.get(name)
        covers = method.covers if method is not None and method.covers else f"what its method {name} states"
        notes.append(f"ε per selection ({name.replace('_', ' ')}): ε covers {covers}")
    said = ("Budgets side by side: " if len(notes) > 1 else "") + "; ".join(notes) if notes else BUDGET_WORDS["per_grid"]
    return said + adjacency_note(private)


def adjacency_note(private: pd.DataFrame) -> str:
    """The neighbouring datasets the private grids' epsilons are for, in their accounting methods' own words."""
    from dpgrid.privacy.method import AccountingMethod

    names = set(private.selection.dropna().astype(str)) if "selection" in private else set()
    words = sorted({(ACCOUNTING.get(name) or AccountingMethod).adjacency.words for name in names or {""}})
    return f"; neighbouring datasets: {' / '.join(words)}" if len(private) else ""


# what makes two grids' values comparable, beside the budget: a table shows grids that differ in one of these on
# separate rows (dpgrid.reporting.grids reads them), naming it as SETTING_NAMES does in its key column, its caption and
# the figures' titles
SETTINGS = ("protocol", "delta", "epochs", "batch_size", "steps", "eval_every", "model", "start", "validation")
SETTING_NAMES = {"protocol": "protocol", "delta": "δ", "epochs": "epochs", "batch_size": "B", "steps": "T",
                 "eval_every": "eval. every", "model": "model", "start": "start", "validation": "scored on"}


def variant_words(row, grids: pd.DataFrame) -> str:
    """What a grid trained that others of `grids` did not, in words ('' where they all trained alike): each setting
    that differs among them (SETTINGS), its start (a checkpoint, a part, LoRA) in its own words."""
    return "; ".join(str(getattr(row, key)) if key == "start" else f"{SETTING_NAMES[key]} {fmt_setting(getattr(row, key))}"
                     for key in SETTINGS if key in grids and grids[key].astype(str).nunique() > 1)


def grid_name(row, grids: pd.DataFrame) -> str:
    """A grid's strategy label, with what tells it apart from the others of `grids` (a fine-tuned grid from one from
    scratch, two numbers of epochs): how captions and titles name it."""
    variant = variant_words(row, grids)
    return f"{row.label}, {variant}" if variant else str(row.label)


def settings_note(private: pd.DataFrame, varying: list) -> str:
    """How the table's grids were trained: what they share, and what differs (a key column each); a weak delta."""
    said = []
    for key, text in (("epochs", "{} epoch{}"), ("batch_size", "expected batch B = {}"), ("steps", "T = {} steps per run"),
                      ("eval_every", "validation every {} steps"), ("protocol", "protocol {}"), ("delta", "δ = {}")):
        values = private[key].dropna()
        if key not in varying and len(values):
            value = fmt_setting(values.iloc[0])
            said.append(text.format(value, "" if value == "1" else "s"))
    text = ("All grids: " + ", ".join(said) + ".") if said else ""
    trained = [f"model {private[key].dropna().iloc[0]}" if key == "model" else str(private[key].dropna().iloc[0])
               for key in ("model", "start") if key in private and key not in varying and len(private[key].dropna())]
    if trained:
        text += f" They train {', '.join(trained)}."
    if varying and set(varying) - {"budget"}:
        text += (" Grids trained differently are never compared in one row: "
                 + ", ".join(SETTING_NAMES.get(c, c) for c in varying if c != "budget") + " as the row says.")
    if "start" in private and private.start.astype(str).str.contains("(private", regex=False).any():
        text += " A grid that starts from a private checkpoint (start: private) spends its own ε, shown as ε (and ε seeds)."
    if "validation" in private and (private.validation == "test_half").any():
        text += (" Scored on the report half of the test set (data.validation=test_half): a fixed, stratified half "
                 "chose each configuration, the other half, which chose nothing, measured the scores shown (unbiased; "
                 "on half the examples, a score's standard error is √2 times the whole test set's)" +
                 ("; the other grids chose and scored on the whole test set (optimistic)" if
                  (private.validation == "test").any() else "") + ".")
    weak = private[private.weak_delta.fillna(False).astype(bool)]
    if len(weak):
        n = weak.n_train.dropna()
        text += (f" δ = {fmt_setting(weak.delta.iloc[0])} is not below 1/N" + (f" = 1/{int(n.iloc[0]):,}" if len(n) else "")
                 + ": a weak guarantee (it allows revealing an example outright with probability δ).")
    return text.strip()


# --- formatting -------------------------------------------------------------------------------------

def fmt_setting(value) -> str:
    """A setting as a caption says it: whole numbers whole, a small delta as 1e-5."""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value)}"
    return re.sub(r"e-0*(\d)", r"e-\1", f"{value:g}") if isinstance(value, float) else str(value)


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

    def shows_a_result(self) -> bool:
        """Whether any cell outside the row keys holds something (a table of empty cells is not written)."""
        return any(self.rows[row].get(column.csv) is not None for row in range(len(self.rows))
                   for _, columns in self.blocks for column in columns)

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
    """A booktabs table a paper prints as it is: caption and label, a row per privacy level and strategy (strategies as
    rows: the table grows down, not across, so it fits a column however many strategies it holds), numbers
    right-aligned, the best value of each level in bold, footnotes below (they render). A hyperparameter that is not
    one of a strategy's axes is left blank; a missing cell is "–" with its footnote. Needs \\usepackage{booktabs}."""
    names = list(dict.fromkeys(c.name for _, columns in table.blocks for c in columns))
    kinds = {c.name: c.kind for _, columns in table.blocks for c in columns}
    axes = list(AXIS_SYMBOL.values())  # the built-in axes in their order (rho, C, gamma), then a strategy's own
    names.sort(key=lambda n: (("hp", "value", "epsilon").index(kinds[n]), axes.index(n) if n in axes else len(axes)))
    spec = "@{}l" + "r" * len(names) + "@{}"  # no padding outside the first and last columns (booktabs' style)
    lines = [r"\begin{table}[t]", r"\centering", r"\footnotesize", rf"\caption{{{tex(table.caption)}}}",
             rf"\label{{{table.label}}}", r"\setlength{\tabcolsep}{3pt}", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(["Strategy"] + [header_tex(n) for n in names]) + r" \\"]
    for i in range(len(table.rows)):
        # each privacy level (and setting) heads its strategies' rows: a column the width of "epsilon = 3" saved
        level = ", ".join(f"{c.name} = {table.text(i, c)}" if c.kind == "key" and c.name == "ε" else
                          f"{c.name} {table.text(i, c)}" for c in table.keys)
        lines += [r"\midrule", rf"\multicolumn{{{1 + len(names)}}}{{l}}{{\textit{{{tex(level)}}}}} \\"]
        for block, columns in table.blocks:
            by_name = {c.name: c for c in columns}
            cells = [tex(block)]
            cells += [bold(tex(table.text(i, by_name[n])).replace(r" $\pm$ ", r"\,$\pm$\,"),  # thin spaces: narrower
                           (i, by_name[n].csv) in table.best, r"\textbf{", "}") if n in by_name else "" for n in names]
            lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.notes:
        lines += [r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize"]
        lines += [tex(n) + (r"\par" if i < len(table.notes) - 1 else "") for i, n in enumerate(table.notes)]
        lines.append(r"\end{minipage}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def header_tex(name: str) -> str:
    """A column's header: a one-letter symbol in math (C), anything else as text with its symbols."""
    return f"${name}$" if len(name) == 1 and name.isascii() else tex(name)


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
