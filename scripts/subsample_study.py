"""Tuning on a subsample against dpgrid's other ways of tuning, at equal total (epsilon, delta): the study behind
docs/selection.md, "Tuning on a subsample".

    python scripts/subsample_study.py                      # digits: about 25 minutes on 2 CPU cores
    python scripts/subsample_study.py --mnist DATA_ROOT --repeats 2   # MNIST (image_mlp, 2 epochs): about 1.5 hours
    python scripts/subsample_study.py --rule               # the carry-over rule on digits: about 5 minutes

For each epsilon in {1, 3, 8}, fixed_threshold (K = k^2 configurations of lr x clip) and each procedure:
- composition: every configuration trained with its seeds, all K x seeds runs composed (privacy.account_seeds=true,
  so the released model, the best configuration's seeds, is covered by epsilon itself);
- random stopping on the full data (truncated negative binomial, eta = 0, E[K] = K candidates of `seeds` runs);
- tuning on a subsample at q1 = 0.1, 0.2, 0.5: random stopping over the grid on the tuning set (rs), or every
  configuration on it (grid), then the chosen configuration's seeds on the full data.
The score is what the procedure releases: the released configuration's test accuracy, mean over its seeds; the
random procedures are repeated (privacy.selection.stopping_seed 0..R-1: other candidates, another tuning set) and their
scores averaged. Compute: run-steps (runs x T) and example-steps (run-steps x expected batch, relative to the
composition grid), and the CPU seconds of the whole command (planning included; process time, both cores).

--rule: is the configuration chosen on X1 the one that is best on X? Every configuration trained on X1 (the
tuning phase of tuning_search=composition at the shared nu) against every configuration trained on X at that nu:
the rank correlation of their scores and the regret (the best score on X minus that of the configuration chosen
on X1).

Writes docs/selection/subsample_<dataset>.csv (and subsample_rule.csv) and prints them as markdown.
"""

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
from selection_study import markdown  # (scripts/ is on the path of a script run from it)

import dpgrid

OUT = Path(__file__).resolve().parents[1] / "docs" / "selection"
EPSILONS = (1, 3, 8)
GRID = "strategy=fixed_threshold"  # K = k^2 configurations of lr x clip: the grid where tuning costs the most
RATES = (0.1, 0.2, 0.5)


def procedures(repeats: int) -> list:
    """(name, q1 or None, overrides, repetitions)."""
    found = [("composition", None, ["privacy.account_seeds=true"], 1),
             ("random stopping", None, ["privacy.selection=random_stopping"], repeats)]
    for search, name in (("random_stopping", "rs"), ("composition", "grid")):
        for rate in RATES:
            found.append((f"subsample {name}", rate, ["privacy.selection=subsample_tuning", f"privacy.selection.tuning_rate={rate}",
                                                       f"privacy.selection.tuning_search={search}"], repeats))
    return found


def measured(out: Path, cpu_seconds: float) -> dict:
    """What one procedure released and what it cost, from its run directory."""
    plan = json.loads((out / "plan.json").read_text())
    runs = pd.read_csv(out / "runs.csv") if (out / "runs.csv").exists() else pd.DataFrame()
    batch = plan["batch_size"]
    if plan.get("tuning"):
        released = json.loads((out / "selection.json").read_text())
        score = (released.get("final") or {}).get("score")
        nu = f"{plan['tuning']['tuning']['noise_multiplier']:.3g} / {plan['tuning']['final']['noise_multiplier']:.3g}"
        batches = runs.phase.map({"tuning": plan["tuning"]["tuning"]["batch_size"],
                                  "final": plan["tuning"]["final"]["batch_size"]})
    elif plan.get("selection") == "random_stopping":
        score = (json.loads((out / "selection.json").read_text()).get("chosen") or {}).get("score")
        nu, batches = f"{plan['noise_multiplier']:.3g}", pd.Series(batch, index=runs.index)
    else:
        summary = pd.read_csv(out / "summary.csv")
        score = float(summary[summary.best]["mean"].iloc[0]) if summary.best.any() else None
        nu, batches = f"{plan['noise_multiplier']:.3g}", pd.Series(batch, index=runs.index)
    steps = runs.steps.astype(float) if len(runs) else pd.Series(dtype=float)
    return dict(score=score, nu=nu, epsilon_spent=plan["epsilon_spent"], run_steps=float(steps.sum()),
                example_steps=float((steps * batches).sum()), cpu_seconds=cpu_seconds)


def study(dataset: list, k: int, repeats: int) -> pd.DataFrame:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for epsilon in EPSILONS:
            for name, rate, overrides, reps in procedures(repeats):
                found = []
                for rep in range(reps):
                    out = Path(tmp) / f"{epsilon}_{name.replace(' ', '_')}_{rate}_{rep}"
                    cfg = dpgrid.compose([*dataset, GRID, f"grid.k={k}", f"privacy.epsilon={epsilon}",
                                          f"privacy.selection.stopping_seed={rep}", *overrides])
                    start = time.process_time()
                    dpgrid.run_grid(cfg, out, progress=False)
                    found.append(measured(out, time.process_time() - start))
                scores = pd.Series([f["score"] for f in found], dtype=float)
                rows.append(dict(epsilon=epsilon, procedure=name, q1=rate, nu=found[0]["nu"],
                                 epsilon_spent=round(found[0]["epsilon_spent"], 4), score=scores.mean(),
                                 score_std=scores.std(ddof=0), repetitions=reps,
                                 **{key: sum(f[key] for f in found) / reps for key in ("run_steps", "example_steps",
                                                                                        "cpu_seconds")}))
                print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    composition = frame[frame.procedure == "composition"].set_index("epsilon").example_steps
    frame["compute"] = frame.example_steps / frame.epsilon.map(composition)
    return frame


def rule(dataset: list, k: int, seeds: int) -> pd.DataFrame:
    """The carry-over rule, measured: every configuration on X1 against every configuration on X, one nu."""
    from scipy.stats import spearmanr

    from dpgrid.config import compile
    from dpgrid.runner import train

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for epsilon in EPSILONS:
            for rate in RATES:
                base = [*dataset, GRID, f"grid.k={k}", f"train.seeds={seeds}",
                        f"privacy.epsilon={epsilon}"]
                tuned = Path(tmp) / f"tuned_{epsilon}_{rate}"
                dpgrid.run_grid(dpgrid.compose([*base, "privacy.selection=subsample_tuning", f"privacy.selection.tuning_rate={rate}",
                                                "privacy.selection.tuning_search=composition"]), tuned, progress=False)
                nu = json.loads((tuned / "plan.json").read_text())["noise_multiplier"]
                spec = compile(dpgrid.compose([*base, "privacy.account_seeds=true"]))
                spec = replace(spec, plan=replace(spec.plan, noise_multiplier=nu))  # the full grid at the tuning's nu
                full = Path(tmp) / f"full_{epsilon}_{rate}"
                train(spec, full, progress=False)
                on_x1 = pd.read_csv(tuned / "runs.csv").query("phase == 'tuning'").groupby("config_id").best_value.mean()
                on_x = pd.read_csv(full / "runs.csv").groupby("config_id").best_value.mean().reindex(on_x1.index)
                rows.append(dict(epsilon=epsilon, q1=rate, nu=round(nu, 4), spearman=spearmanr(on_x1, on_x).statistic,
                                 best_on_x=on_x.max(), chosen_on_x1=on_x[on_x1.idxmax()],
                                 regret=on_x.max() - on_x[on_x1.idxmax()], median_on_x=on_x.median()))
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--mnist", metavar="DATA_ROOT", help="MNIST under DATA_ROOT/MNIST (model=image_mlp, 2 epochs)")
    parser.add_argument("--rule", action="store_true", help="the carry-over rule on digits")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions of the random procedures")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.rule:
        frame, name = rule(["dataset=digits"], 7, 3), "subsample_rule"
    elif args.mnist:
        frame, name = study(["dataset=mnist", "model=image_mlp", f"data.root={args.mnist}", "train.epochs=2"],
                            5, args.repeats), "subsample_mnist"
    else:
        frame, name = study(["dataset=digits"], 7, args.repeats), "subsample_digits"
    frame.to_csv(OUT / f"{name}.csv", index=False)
    print(markdown(frame))


if __name__ == "__main__":
    main()
