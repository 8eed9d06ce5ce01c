"""`dpgrid tables` on a synthetic results tree whose values are known."""

import json
import re

import pandas as pd
import pytest

from dpgrid import DpgridError
from dpgrid.reproduction.paper import paper_results
from dpgrid.reporting.tables import write_tables
from dpgrid.results.seal import seal

from .command import dpgrid, one_line


LABELS = {"online": "Online", "fixed_threshold": "Fixed Threshold", "fixed_quantile": "Fixed Quantile", "nodp": "NoDP"}  # as plan.json records them


def make_grid(root, dataset, strategy, epsilon, k, configs, metric="accuracy", n_configs=None, budget="per_grid",
              sampling="poisson", protocol="paper", folder=None, settings=None, adapts=()):
    """configs: list of (config_id, {hp}, [values per seed], n_diverged). Files as a grid writes them: plan.json,
    runs.csv with every column a table reads, summary.csv, curves.csv."""
    folder = folder or root / dataset / strategy / f"eps={epsilon}" / budget / f"k={k}"
    folder.mkdir(parents=True)
    nodp = strategy == "nodp"
    privacy = dict(noise_multiplier=0.0 if nodp else 1.0, epsilon_spent=None if nodp else epsilon * 0.999,
                   epsilon_grid=None if nodp else epsilon * (0.999 if budget == "per_grid" else 7.5),
                   budget="non-private" if nodp else budget, sampling=sampling, accountant=None if nodp else "rdp")
    seeds = max(len(values) + diverged for *_, values, diverged in configs)
    settings = dict(settings or {})  # how it was trained (eval_every, epochs, batch_size, n_train, delta), as recorded
    delta = settings.pop("delta", 1e-5)
    with_seeds = None if nodp else privacy["epsilon_grid"] * (2.3 if seeds > 1 else 1)
    folder.joinpath("plan.json").write_text(json.dumps(dict(
        dataset=dataset, strategy=strategy, k=k, epsilon=None if nodp else epsilon, delta=None if nodp else delta,
        **settings,
        **privacy, n_configs=n_configs or len(configs), seeds=seeds, steps=100, epsilon_with_seeds=with_seeds,
        label=LABELS[strategy], private=not nodp, axes=list(configs[0][1]), adapts=list(adapts),
        dataset_epsilons=[1, 2, 3, 4] if dataset == "fashion_mnist" else [3, 5, 7, 9],
        configurations=[dict(config_id=c, **hp) for c, hp, *_ in configs]  # a partial grid lists the whole grid's:
        + [dict(config_id=f"other{i}", **configs[0][1]) for i in range((n_configs or len(configs)) - len(configs))],
        grid_only=[c for c, *_ in configs] if (n_configs or len(configs)) > len(configs) else None)))
    runs, summary = [], []
    for config_id, hp, values, diverged in configs:
        for seed, v in enumerate(values + [float("nan")] * diverged):
            runs.append(dict(dataset=dataset, strategy=strategy, epsilon=None if nodp else epsilon,
                             delta=None if nodp else delta, k=k, metric=metric, config_id=config_id, seed=seed, **settings,
                             best_value=v, diverged=seed >= len(values), **hp, **privacy, epsilon_with_seeds=with_seeds,
                             private=not nodp, protocol=protocol, steps=100,
                             **{f"final_{a}": {"clip": 0.1, "lr": 0.3}[a] for a in adapts}))
        ok = pd.Series(values, dtype=float)
        summary.append(dict(config_id=config_id, **hp, mean=ok.mean() if len(ok) else float("nan"),
                            std=ok.std(ddof=0) if len(ok) else float("nan"), n_seeds=len(values) + diverged,
                            n_diverged=diverged, best=False))
    summary = pd.DataFrame(summary)
    if summary["mean"].notna().any():
        best = summary["mean"].idxmin() if metric == "mse" else summary["mean"].idxmax()
        summary.loc[best, "best"] = True
    summary.to_csv(folder / "summary.csv", index=False)
    pd.DataFrame(runs).to_csv(folder / "runs.csv", index=False)
    steps = [50, 100]
    pd.DataFrame([dict(config_id=c, seed=s, step=t, value=60 + t / 10 + s, clip=0.1, lr=0.3, test_loss=1.0)
                  for c, _, values, diverged in configs for s in range(len(values) + diverged) for t in steps]
                 ).to_csv(folder / "curves.csv", index=False)
    seal(folder)  # as a grid seals its result files (dpgrid.results.seal)
    return folder


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "outputs"
    # online eps=3: best lr=0.316 at 91.69 +- 0.53 (paper 90.69 +- 0.53: diff 1.00 > combined 0.75)
    make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.16, 92.22], 0),
                                              ("lr3", {"lr": 0.1}, [80.0, 81.0], 0)])
    # online eps=5: 91.62 +- 0.10 at lr=1 (paper 91.62: diff 0, within)
    make_grid(root, "mnist", "online", 5, 9, [("lr5", {"lr": 1.0}, [91.52, 91.72], 0)], n_configs=9)
    # fixed_threshold eps=3: every seed of every configuration diverged
    make_grid(root, "mnist", "fixed_threshold", 3, 9, [("lr0_clip0", {"lr": 0.003162, "clip": 0.01}, [], 2)])
    make_grid(root, "mnist", "nodp", 3, 9, [("lr0", {"lr": 0.003162}, [98.0, 98.2], 0)])
    # fashion_mnist (MSE, printed x 10^2) at k = 7: hyperparameters only
    make_grid(root, "fashion_mnist", "online", 1, 7, [("lr3", {"lr": 0.316228}, [0.0250, 0.0270], 0)], "mse")
    return root


def write(root, **kwargs):
    lines = []
    kwargs.setdefault("figures", False)  # the tables' tests; the figures' own tests draw them
    written = write_tables(root, report=lines.append, **kwargs)
    return written, lines


def test_paper_layout_cells(tree):
    write_tables(tree, figures=False)
    table = pd.read_csv(tree / "tables" / "mnist_k9.csv")  # the raw numbers
    assert list(table["ε"]) == [3, 5]  # the levels run, and no other
    row3, row5 = (table[table["ε"] == e].iloc[0] for e in (3, 5))
    assert row3["Online ρ"] == pytest.approx(0.316228) and row3["Online acc"] == pytest.approx(91.69)
    assert row3["Online std"] == pytest.approx(0.53) and row5["Online acc"] == pytest.approx(91.62)
    assert pd.isna(row3["Fixed Threshold ρ"]) and pd.isna(row3["Fixed Threshold acc"])
    assert not any(c.startswith("Adam WOSM") for c in table.columns)  # no grid of it here: no column
    assert "budget" not in table.columns  # one budget: said in the caption, not in a column
    md = (tree / "tables" / "mnist_k9.md").read_text()
    assert "| 3 | – | – | – | – | 0.316 | 91.69 ± 0.53 | 6.89 |" in md  # mean ± std in one cell, the same decimals
    assert "| 5 | – | – | – | – | 1 | 91.62 ± 0.10 | 11.49 |" in md
    assert "–: all seeds diverged: Fixed Threshold at ε = 3" in md and "–: grid not run: Fixed Threshold at ε = 5" in md
    assert "Best NoDP (non-private, no ε): ρ = 0.00316, 98.10." in md
    assert "Partial grids (the best of the configurations run, with the whole grid's noise): Online at ε = 5 (1 of 9 " \
           "configurations)." in md
    tex = (tree / "tables" / "mnist_k9.tex").read_text()
    for part in (r"\toprule", r"\bottomrule", r"\caption{mnist, k = 9:", r"\label{tab:mnist_k9:", r"91.69\,$\pm$\,0.53", r"$\rho$", "Fixed Threshold & -- & -- & -- & --", "Online & 0.316 &  & 91.69",
                 r"\textit{$\varepsilon$ = 3}"):
        assert part in tex, part
    assert r"\begin{tabular}{@{}lrrrr@{}}" in tex  # strategies as rows; numbers right-aligned
    assert not any(line.startswith("%") for line in tex.splitlines())  # footnotes that render, not comments
    assert "privacy." not in tex and "_" not in tex.replace(r"\_", "").split(r"\label")[0]  # words, not config keys


def test_the_best_value_of_each_row_is_marked(tree):
    make_grid(tree, "mnist", "fixed_threshold", 5, 9, [("lr0_clip5", {"lr": 0.003162, "clip": 3.162}, [91.0, 92.0], 0)])
    write_tables(tree, figures=False)
    md = (tree / "tables" / "mnist_k9.md").read_text()
    assert "| 5 | 0.00316 | 3.16 | 91.50 ± 0.50 | 11.49 | 1 | **91.62 ± 0.10** | 11.49 |" in md
    assert r"\textbf{91.62\,$\pm$\,0.10}" in (tree / "tables" / "mnist_k9.tex").read_text()
    assert "**91.69" not in md  # a row with one strategy's value marks nothing


@pytest.mark.skipif(not __import__("shutil").which("pdflatex"), reason="pdflatex is not installed (TeX Live)")
def test_the_latex_table_compiles_and_fits_a_column(tree, tmp_path):
    """Every built-in strategy's block in one table, with per-run grids' extra column: it compiles, and fits one column
    of a two-column paper (no overfull box), since strategies are rows; two trees' tables have different labels."""
    import subprocess

    make_grid(tree, "mnist", "fixed_threshold", 5, 9, [("lr0_clip5", {"lr": 0.003162, "clip": 3.162}, [91.0, 92.0], 0)])
    make_grid(tree, "mnist", "fixed_quantile", 5, 9, [("lr0_q4", {"lr": 0.003162, "quantile": 0.9}, [91.0, 92.0], 0)])
    for strategy in ("adamwosm", "dpadam", "per_layer"):
        LABELS.setdefault(strategy, strategy.replace("_", " ").title())
        make_grid(tree, "mnist", strategy, 5, 9, [("clip3", {"clip": 0.316}, [90.123, 99.876], 0)])
    write_tables(tree, figures=False)
    other = tmp_path / "second" / "outputs"
    make_grid(other, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.16, 92.22], 0)])
    write_tables(other, figures=False)
    labels = [re.search(r"\\label\{(.*)\}", (t / "tables" / "mnist_k9.tex").read_text()).group(1) for t in (tree, other)]
    assert labels[0] != labels[1]
    document = tmp_path / "paper.tex"
    tables = "".join(f"\\input{{{t / 'tables' / 'mnist_k9.tex'}}}\n" for t in (tree, other))
    document.write_text("\\documentclass[twocolumn]{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                        f"{tables}\\end{{document}}\n")
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document.name], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 1000
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log and "multiply defined" not in log, log[-3000:]


def test_delta_and_how_grids_were_trained_are_stated_and_never_compared_in_one_row(tmp_path):
    """Two online grids at one epsilon that differ in their validation interval stand on two rows, each naming its
    interval; what they share is said in the caption, delta included, and a weak delta is said to be weak."""
    root = tmp_path / "outputs"
    shared = dict(epochs=2, batch_size=128, n_train=1437, delta=0.01)
    make_grid(root, "digits", "online", 3, 3, [("lr1", {"lr": 0.316}, [80.0, 81.0], 0)], settings={**shared, "eval_every": 5},
              folder=root / "a")
    make_grid(root, "digits", "online", 3, 3, [("lr1", {"lr": 0.316}, [70.0, 71.0], 0)], settings={**shared, "eval_every": 50},
              folder=root / "b")
    make_grid(root, "digits", "fixed_threshold", 3, 3, [("lr1_clip1", {"lr": 0.316, "clip": 1.0}, [75.0, 76.0], 0)],
              settings={**shared, "eval_every": 50}, folder=root / "c")
    written, lines = write(root)
    assert lines == []
    table = pd.read_csv(root / "tables" / "digits_k3.csv")
    assert sorted(table["eval_every"].astype(int)) == [5, 50]
    five, fifty = (table[table.eval_every.astype(int) == e].iloc[0] for e in (5, 50))
    assert five["Online acc"] == pytest.approx(80.5) and pd.isna(five["Fixed Threshold acc"])
    assert fifty["Online acc"] == pytest.approx(70.5) and fifty["Fixed Threshold acc"] == pytest.approx(75.5)
    md = (root / "tables" / "digits_k3.md").read_text()
    assert "All grids: 2 epochs, expected batch B = 128, T = 100 steps per run, protocol paper, δ = 0.01." in md
    assert "never compared in one row: eval. every as the row says" in md
    assert "δ = 0.01 is not below 1/N = 1/1,437: a weak guarantee" in md
    assert "**80.50" not in md  # a row of one strategy marks nothing: the two intervals are not compared
    results = pd.read_csv(root / "tables" / "results.csv")
    assert set(results.delta) == {0.01} and results.weak_delta.all() and set(results.eval_every) == {5, 50}
    assert set(results.selection) == {"composition"}


def test_only_the_papers_own_k7_tables_drop_the_scores(tmp_path):
    """The hyperparameters-only layout is the paper's (its Tables 2-4): a dataset the paper has no table of
    shows its scores at k = 7 too, and is compared with nothing."""
    root = tmp_path / "outputs"
    make_grid(root, "digits", "online", 3, 7, [("lr3", {"lr": 0.316228}, [91.0, 93.0], 0)])
    written = write_tables(root, figures=False)
    table = pd.read_csv(root / "tables" / "digits_k7.csv")
    assert table.loc[table["ε"] == 3, "Online acc"].item() == pytest.approx(92.0)
    assert not any("vs_paper" in str(p) for p in written)


def test_k7_layout_is_hyperparameters_only_and_mse_is_scaled(tree):
    write_tables(tree, figures=False)
    table = pd.read_csv(tree / "tables" / "fashion_mnist_k7.csv")
    assert list(table["ε"]) == [1]
    assert table.loc[0, "Online ρ"] == pytest.approx(0.316228)
    assert not any("mse" in c or "std" in c for c in table.columns)
    results = pd.read_csv(tree / "tables" / "results.csv")
    fm = results[results.dataset == "fashion_mnist"].iloc[0]
    assert fm.value == pytest.approx(0.026) and fm.metric == "mse"


def test_comparison_with_the_paper(tree):
    write_tables(tree, figures=False)
    comp = pd.read_csv(tree / "tables" / "mnist_k9_vs_paper.csv")
    assert len(comp) == 8  # the 2 strategies run here x 4 epsilons of Table 8
    online3 = comp[(comp.strategy == "online") & (comp.epsilon == 3)].iloc[0]
    assert online3.paper_value == 90.69 and online3.difference == pytest.approx(1.0)
    assert not online3.within_std and online3.same_hyperparameters
    online5 = comp[(comp.strategy == "online") & (comp.epsilon == 5)].iloc[0]
    assert online5.difference == pytest.approx(0.0) and online5.within_std
    ft3 = comp[(comp.strategy == "fixed_threshold") & (comp.epsilon == 3)].iloc[0]
    assert ft3.status == "all seeds diverged" and pd.isna(ft3.difference)
    md = (tree / "tables" / "mnist_k9_vs_paper.md").read_text()
    assert "| 3 | Online | ρ=0.316 | 90.69 ± 0.53 | ρ=0.316 | 91.69 ± 0.53 | 1.00 | no |" in md
    assert "| 7 | Online | ρ=1 | 92.94 ± 0.90 | – | – (grid not run) | – | – |" in md
    assert "| 5 | Online | ρ=1 | 91.62 ± 0.83 | ρ=1 (1 of 9 configurations run) | 91.62 ± 0.10 | 0.00 | yes |" in md


def test_the_papers_claim_is_tested_per_epsilon_with_the_metrics_direction(tree):
    make_grid(tree, "mnist", "fixed_threshold", 5, 9, [("lr0_clip5", {"lr": 0.003162, "clip": 3.162}, [91.0, 92.0], 0)])
    # fashion_mnist, MSE (lower is better): online worse than fixed_threshold by more than the noise
    make_grid(tree, "fashion_mnist", "online", 3, 9, [("lr6", {"lr": 3.162}, [0.0200, 0.0202], 0)], "mse")
    make_grid(tree, "fashion_mnist", "fixed_threshold", 3, 9,
              [("lr4_clip2", {"lr": 0.3162, "clip": 0.1}, [0.0150, 0.0152], 0)], "mse")
    for eps in (1, 3):  # the paper's eps = 1 row of fixed_quantile diverged: no hyperparameters, no value
        make_grid(tree, "fashion_mnist", "fixed_quantile", eps, 9,
                  [("lr5_q0", {"lr": 1.0, "quantile": 0.1}, [0.0030, 0.0028], 0)], "mse")
    write_tables(tree, figures=False)
    claim = pd.read_csv(tree / "tables" / "mnist_k9_claim.csv").set_index(["epsilon", "rival"])
    eps5 = claim.loc[(5, "fixed_threshold")]  # ours 91.62 +- 0.10 vs 91.5 +- 0.5; paper 91.62 +- 0.83 vs 88.69 +- 0.57
    assert eps5.advantage == pytest.approx(0.12) and eps5.combined_std == pytest.approx((0.1 ** 2 + 0.5 ** 2) ** 0.5)
    assert eps5.verdict.startswith("undecided") and eps5.paper_verdict.startswith("confirmed")
    assert eps5.paper_advantage == pytest.approx(2.93)
    assert pd.isna(claim.loc[(3, "fixed_threshold")].advantage)  # every seed of ours diverged: no verdict
    assert ("fixed_quantile" not in claim.index.get_level_values("rival"))  # not run: not compared
    fashion = pd.read_csv(tree / "tables" / "fashion_mnist_k9_claim.csv").set_index(["epsilon", "rival"]).loc[
        (3, "fixed_threshold")]
    assert fashion.advantage == pytest.approx(-0.005) and fashion.verdict.startswith("refuted")
    assert fashion.paper_advantage == pytest.approx(0.0154 - 0.0074) and fashion.paper_verdict.startswith("confirmed")
    md = (tree / "tables" / "fashion_mnist_k9_vs_paper.md").read_text()
    assert "| 3 | fixed_threshold | -0.50 ± 0.01 | refuted (online worse) | 0.80 ± 0.11 | confirmed (online better) |" in md
    assert "| 1 | Fixed Quantile | – | – (diverged) | lr5_q0 | 0.29 ± 0.01 | – | – |" in md


def test_a_claim_on_one_seed_is_undecided_whatever_the_difference():
    from dpgrid.reporting.comparison import ONE_SEED, claims

    comp = pd.DataFrame(dict(epsilon=3.0, strategy=["online", "fixed_threshold", "fixed_quantile"],
                             value=[90.0, 80.0, 85.0], std=[0.0, 0.0, 0.5], n_seeds=[1, 1, 2],
                             paper_value=[90.0, 86.0, 85.0], paper_std=[0.5, 0.5, 0.4]))
    claim = claims(comp, "accuracy").set_index("rival")
    assert claim.verdict.tolist() == [ONE_SEED, ONE_SEED] and claim.advantage.tolist() == [10.0, 5.0]
    assert claim.paper_verdict.tolist() == ["confirmed (online better)", "confirmed (online better)"]
    comp.loc[[0, 1], "n_seeds"], comp.loc[[0, 1], "std"] = 2, 0.3  # two seeds each: judged by the combined std
    assert claims(comp, "accuracy").verdict.tolist() == ["confirmed (online better)"] * 2


def test_the_clip_panel_has_no_offset_tick_labels(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from dpgrid.reporting import figures
    steps = range(0, 500, 50)  # C_t moving in its 7th digit: matplotlib's default would print 1e-6+1.0075e-1
    pd.DataFrame(dict(config_id="lr4", seed=0, step=list(steps), value=[50 + s / 10 for s in steps],
                      clip=[0.10075 + 1e-7 * i for i in range(len(steps))], lr=[0.3 + 1e-3 * i for i in range(len(steps))])
                 ).to_csv(tmp_path / "curves.csv", index=False)
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path, dpi, *rest: (fig.canvas.draw(), drawn.append(fig), [path])[2])
    row = SimpleNamespace(path=str(tmp_path), config_id="lr4", adapts="clip,lr", metric="accuracy", budget="per_grid",
                          dataset="mnist", label="Online", epsilon=3.0, k=9, private=True, axes="lr", lr=0.3)
    figures.plot_learning_curve(row, tmp_path / "curve.png")
    clip_axis = drawn[0].axes[1]
    assert clip_axis.get_ylabel() == "$C_t$" and clip_axis.yaxis.get_offset_text().get_text() == ""
    assert all("e" not in t.get_text() for t in clip_axis.get_yticklabels())


@pytest.mark.slow  # renders every figure of the tree, PNG and PDF (4 s; tests/test_figures.py renders a smaller one)
def test_figures_are_written(tree):
    pytest.importorskip("matplotlib")
    written = write_tables(tree)
    figures = tree / "tables" / "figures"
    for name in ("mnist_k9.png", "mnist_k9.pdf", "fashion_mnist_k7.png", "curves/mnist_online_eps3_per_grid_k9.png"):
        assert (figures / name).stat().st_size > 1000, name
    assert figures / "curves" / "mnist_online_eps3_per_grid_k9.png" in written


def test_paper_reference_data_matches_the_paper_file():
    paper = paper_results()
    t8 = paper[(paper.table == 8) & (paper.epsilon == 3)].set_index("strategy")
    assert t8.loc["online", "value"] == 90.69 and t8.loc["online", "std"] == 0.53
    assert t8.loc["fixed_threshold", "lr"] == 0.1 and t8.loc["fixed_threshold", "clip"] == 0.1  # 100.0 x 10^-3
    t9 = paper[(paper.table == 9) & (paper.epsilon == 1)].set_index("strategy")
    assert pd.isna(t9.loc["fixed_quantile", "value"])  # all FixedQuantile runs diverge at eps = 1
    assert t9.loc["online", "value"] == pytest.approx(0.0257)  # printed as 2.57 (mse x 10^2)
    from .conftest import ROOT
    text = (ROOT.parent / "shared" / "papers" / "galli2024-online-sensitivity-optimization.md")
    if text.exists():
        body = text.read_text()
        assert "| 3 | 0.316 | 90.69 | 0.53 | 100.0 | 0.1000 | 86.83 | 0.70 |" in body
        assert "| 9 | 0.1 | 86.43 | 0.08 |" in body


@pytest.mark.slow
def test_tables_command(tree):
    r = dpgrid("tables", tree)
    assert r.returncode == 0 and "wrote" in r.stdout
    r = dpgrid("tables", tree / "nope")
    assert r.returncode == 2 and "no results directory" in r.stderr


def test_tables_carry_the_budget_and_per_run_grids_their_true_epsilon(tmp_path):
    root = tmp_path / "outputs"
    make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.0, 92.0], 0)], budget="per_run")
    write(root)
    table = pd.read_csv(root / "tables" / "mnist_k9.csv")
    row3 = table[table["ε"] == 3].iloc[0]
    assert row3["Online ε grid"] == pytest.approx(22.5)  # the grid's cost beside the per-run ε
    for name in ("mnist_k9.md", "mnist_k9.tex"):
        text = (root / "tables" / name).read_text().replace("$\\varepsilon$", "ε").replace("\\_", "_")
        assert "ε per run: each run spends ε on its own" in text
    assert not (root / "tables" / "mnist_k9_vs_paper.csv").exists() or "per_run" not in \
        (root / "tables" / "mnist_k9_vs_paper.md").read_text()


def test_mixing_per_grid_and_per_run_grids_needs_asking(tree):
    make_grid(tree, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.0, 92.0], 0)], budget="per_run")
    with pytest.raises(DpgridError, match="mnist k=9: grids of different budgets .* would share a table"):
        write(tree)
    write(tree, mix_budgets=True)
    table = pd.read_csv(tree / "tables" / "mnist_k9.csv")
    threes = table[table["ε"] == 3]
    assert sorted(threes.budget) == ["per_grid", "per_run"]  # budgets that differ: a column
    assert sorted(threes["Online acc"]) == pytest.approx([91.5, 91.69])
    assert "Budgets side by side: ε per grid" in (tree / "tables" / "mnist_k9.md").read_text()


def test_shuffled_grids_claim_nothing_and_are_left_out(tmp_path):
    root = tmp_path / "outputs"
    make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [91.0, 92.0], 0)], sampling="shuffle (not DP)")
    _, lines = write(root)
    assert not (root / "tables" / "mnist_k9.csv").exists()  # no epsilon with a DP grid: no row, so no table
    assert lines == ["mnist k=9: no grid of this table has a result to show (each row's footnote says why, in "
                     "results.csv's status): no table written"]
    assert pd.read_csv(root / "tables" / "results.csv").status.tolist() == ["not DP (sampling=shuffle)"]


def test_privacy_figures_come_from_the_runs_and_must_agree_with_the_plan(tree):
    folder = tree / "mnist" / "online" / "eps=3" / "per_grid" / "k=9"
    plan = json.loads((folder / "plan.json").read_text())
    (folder / "plan.json").write_text(json.dumps({**plan, "noise_multiplier": 0.01}))
    _, lines = write(tree)
    assert lines == [f"skipped the grid in {folder}: plan.json says noise_multiplier = 0.01 but runs.csv says 1.0; "
                     "the results were not made with this plan (remove the wrong file, or run the grid again)"]
    results = pd.read_csv(tree / "tables" / "results.csv")
    assert not ((results.strategy == "online") & (results.epsilon == 3)).any()


@pytest.mark.parametrize("name, content, message", [
    ("plan.json", "", "damaged file .*plan.json \\(empty\\); run the grid's command again to rewrite it"),
    ("plan.json", "{not json", "damaged file .*plan.json \\(unreadable"),
    ("runs.csv", "", "runs.csv is not the file its grid wrote \\(edited after it was sealed"),
    ("summary.csv", "", "summary.csv is not the file its grid wrote"),  # published beside runs.csv: sealed too
])
def test_damaged_files_skip_their_grid_with_one_line(tree, name, content, message):
    folder = tree / "mnist" / "online" / "eps=3" / "per_grid" / "k=9"
    (folder / name).write_text(content)
    _, lines = write(tree)
    if message is None:
        assert lines == []
        return
    assert len(lines) == 1 and __import__("re").search(message, lines[0]), lines


@pytest.mark.parametrize("name, edit", [
    ("runs.csv", lambda text: text.replace("91.16", "99.16", 1)),
    ("runs.csv", lambda text: text + text.splitlines()[-1] + "\n"),  # a row added
    ("curves.csv", lambda text: text.replace("65.0", "95.0", 1)),
    ("summary.csv", lambda text: text.replace("lr4", "lr3", 1)),
])
def test_an_edited_result_file_is_never_published(tree, name, edit):
    """runs.csv, curves.csv and summary.csv as their grid sealed them (digests.json), or the grid is skipped in one
    line naming the file: no edited number is published under the grid's epsilon (a figure included)."""
    folder = tree / "mnist" / "online" / "eps=3" / "per_grid" / "k=9"
    path = folder / name
    path.write_text(edit(path.read_text()))
    _, lines = write(tree, figures=name == "curves.csv")  # the learning curve is the figure curves.csv makes
    assert len(lines) == 1 and f"{path} " in lines[0] and "its grid" in lines[0], lines
    results = pd.read_csv(tree / "tables" / "results.csv")
    assert not ((results.strategy == "online") & (results.epsilon == 3) & (results.dataset == "mnist")).any()
    assert not (tree / "tables" / "figures" / "curves" / "mnist_online_eps3_per_grid_k9.png").exists()


def test_a_grid_whose_first_run_is_still_training_is_skipped_as_such(tree):
    folder = tree / "mnist" / "online" / "eps=3" / "per_grid" / "k=9"
    (folder / "runs.csv").unlink()  # plan.json written, no run finished: not a damaged file
    _, lines = write(tree)
    assert lines == [f"skipped the grid in {folder}: {folder} holds no finished run yet"]


@pytest.mark.slow
def test_no_readable_grid_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DpgridError, match="no readable grid under"):
        write(tmp_path / "empty")
    r = dpgrid("tables", tmp_path / "empty")
    assert r.returncode == 2 and one_line(r.stderr) and "no readable grid" in r.stderr


@pytest.mark.slow
def test_a_full_disk_during_tables_is_one_line_and_leaves_no_empty_file(tree, monkeypatch):
    import errno
    import os

    calls, real = [0], os.fsync

    def fsync(fd):  # the fourth file written finds the disk full
        calls[0] += 1
        if calls[0] == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    r = dpgrid("tables", tree)
    assert r.returncode == 1 and one_line(r.stderr) and "no space left on the device" in r.stderr, r.stderr
    assert all(p.stat().st_size > 0 for p in (tree / "tables").rglob("*") if p.is_file())
    assert not list((tree / "tables").rglob(".*.tmp"))


def test_a_read_only_tree_is_refused_before_any_table_is_written(tree, monkeypatch):
    import os

    from dpgrid import EnvironmentFault

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **k: False if str(p).startswith(str(tree)) else real(p, m, **k))
    with pytest.raises(EnvironmentFault, match=r"cannot write .*tables: .* is not writable; choose a writable"):
        write(tree)
    assert not (tree / "tables").exists()


def test_every_table_states_what_its_seeds_cost(tree):
    write_tables(tree, figures=False)
    results = pd.read_csv(tree / "tables" / "results.csv")
    online3 = results[(results.strategy == "online") & (results.epsilon == 3)].iloc[0]
    assert online3.epsilon_with_seeds == pytest.approx(3 * 0.999 * 2.3) and online3.accountant == "rdp"
    table = pd.read_csv(tree / "tables" / "mnist_k9.csv")
    assert table[table["ε"] == 3].iloc[0]["Online ε seeds"] == pytest.approx(3 * 0.999 * 2.3)
    markdown = (tree / "tables" / "mnist_k9.md").read_text()
    assert "each value is a mean over seeds, which costs more than ε" in markdown and "| 3 | – | – | – | – | 0.316 | 91.69 ± 0.53 | 6.89 |" in markdown
    assert "seeds not (what the means over seeds cost" in (tree / "tables" / "mnist_k9_vs_paper.md").read_text()


def test_a_plan_that_understates_the_seeds_is_refused(tree):
    folder = tree / "mnist" / "online" / "eps=5" / "per_grid" / "k=9"
    plan = json.loads((folder / "plan.json").read_text())
    (folder / "plan.json").write_text(json.dumps({**plan, "seeds": 1}))
    _, lines = write(tree)
    assert any("holds 2 seeds of a configuration but plan.json was written for 1" in line for line in lines), lines
    del plan["epsilon_with_seeds"]
    (folder / "plan.json").write_text(json.dumps(plan))
    _, lines = write(tree)
    assert any("plan.json says epsilon_with_seeds = None but runs.csv says" in line for line in lines), lines


def edit_runs(folder, change, reseal: bool = True):
    """runs.csv edited, and by default sealed again as the edit left it (an adversary who rewrites digests.json too:
    the checks behind the seal are what is tested)."""
    runs = pd.read_csv(folder / "runs.csv", dtype={"config_id": str})
    change(runs).to_csv(folder / "runs.csv", index=False)
    if reseal:
        seal(folder)


def edit_plan(folder, **changes):
    plan = json.loads((folder / "plan.json").read_text())
    plan.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del plan[key]
    (folder / "plan.json").write_text(json.dumps(plan))


@pytest.mark.parametrize("damage, message", [
    (lambda f: edit_plan(f, epsilon=1), "plan.json says epsilon = 1 but runs.csv says 3"),
    (lambda f: edit_plan(f, strategy="fixed_threshold"), "plan.json says strategy = fixed_threshold but runs.csv says online"),
    (lambda f: edit_plan(f, k=5), "plan.json says k = 5 but runs.csv says 9"),
    (lambda f: edit_plan(f, n_configs=None), "plan.json lacks n_configs"),
    (lambda f: edit_runs(f, lambda r: pd.concat([r, r.iloc[[0]]])), "lr4 seed 0 twice"),
    (lambda f: edit_runs(f, lambda r: r.assign(config_id=["lr4", "lr4", "lr9", "lr3"])), "configuration 'lr9' is not in this grid"),
    (lambda f: edit_runs(f, lambda r: r.assign(best_value=[float("inf"), 1, 2, 3])), "best_value = 'inf'"),
    (lambda f: edit_runs(f, lambda r: r.assign(best_value=["abc", 1, 2, 3])), "best_value = 'abc' is not a number"),
    (lambda f: (edit_plan(f, config_hash="aaaa"), edit_runs(f, lambda r: r.assign(config_hash=["aaaa", "aaaa", "aaaa", "bbbb"]))),
     "config_hash bbbb is not this grid's aaaa"),
])
def test_tables_publish_only_what_the_runs_produced(tree, damage, message):
    folder = tree / "mnist" / "online" / "eps=3" / "per_grid" / "k=9"
    damage(folder)
    _, lines = write(tree)
    assert len(lines) == 1 and message in lines[0] and str(folder) in lines[0], lines
    results = pd.read_csv(tree / "tables" / "results.csv")
    assert not ((results.dataset == "mnist") & (results.strategy == "online") & results.epsilon.isin([1, 3])).any()


def test_the_k7_table_says_where_its_scores_are(tree):
    write_tables(tree, figures=False)
    assert "each cell's score (mean and std over seeds) is in results.csv" in (tree / "tables" / "fashion_mnist_k7.md").read_text()


@pytest.mark.parametrize("adapts", ["clip,lr", ""])
def test_the_curve_figures_title_fits_inside_the_figure(tmp_path, monkeypatch, adapts):
    """A single-panel figure (a strategy that adapts nothing) is one column wide: its title must not be cut."""
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from dpgrid.reporting import figures
    steps = range(0, 500, 50)
    pd.DataFrame(dict(config_id="lr4_clip3", seed=0, step=list(steps), value=[50 + s / 10 for s in steps], clip=0.1,
                      lr=0.3)).to_csv(tmp_path / "curves.csv", index=False)
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path, dpi, *rest: (fig.canvas.draw(), drawn.append(fig), [path])[2])
    row = SimpleNamespace(path=str(tmp_path), config_id="lr4_clip3", adapts=adapts, metric="accuracy", budget="per_grid",
                          dataset="fashion_mnist", label="Fixed Threshold", epsilon=3.0, k=9, private=True,
                          axes="lr,clip", lr=0.3, clip=0.1)
    figures.plot_learning_curve(row, tmp_path / "curve.png")
    fig = drawn[0]
    title = fig.axes[0].title.get_window_extent()
    box = fig.bbox
    assert box.x0 <= title.x0 and title.x1 <= box.x1 and box.y0 <= title.y0 and title.y1 <= box.y1, (title, box)


def test_fine_tuning_variants_of_one_cell_stand_on_rows_of_their_own(tmp_path):
    """Full, last-layer and LoRA grids from one checkpoint, one cell each: three rows told apart by what they train,
    named in the key column and the caption, and three series in the figure."""
    root = tmp_path / "outputs"
    starts = {"full": {"init": {"sha256": "ab" * 32}},
              "last": {"init": {"sha256": "ab" * 32}, "trainable": ["2.*"]},
              "lora": {"init": {"sha256": "ab" * 32, "provenance": {"private": True, "dataset": "digits"}},
                       "lora": {"rank": 8, "targets": ["0"]}}}
    for i, (name, start) in enumerate(starts.items()):
        folder = make_grid(root, "mnist", "online", 3, 9, [("lr4", {"lr": 0.316228}, [90.0 + i, 91.0 + i], 0)],
                           folder=root / name)
        edit_plan(folder, start=start)
    figures = pytest.importorskip("matplotlib") and True
    _, lines = write(root, figures=figures)
    assert lines == []
    table = pd.read_csv(root / "tables" / "mnist_k9.csv")
    assert sorted(table.start) == ["from abababab", "from abababab (private, digits); LoRA r=8 on 0",
                                   "from abababab; trains 2.*"]
    md = (root / "tables" / "mnist_k9.md").read_text()
    assert "start as the row says" in md and "private checkpoint" in md
    caption = (root / "tables" / "figures" / "mnist_k9.txt").read_text()
    assert caption  # the figure is drawn, its series one per start
