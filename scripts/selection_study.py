"""Composition or random stopping? The study behind docs/selection.md.

    python scripts/selection_study.py            # both parts, about 10 minutes on 2 CPU cores
    python scripts/selection_study.py --plan     # part A only (no training, about 2 minutes)
    python scripts/selection_study.py --profile  # parts C and D: the profile bound (7.5 minutes on 2 CPU cores)

A. The noise multiplier nu each way of tuning needs for the same (epsilon, delta), from dpgrid's plans (no
   training): MNIST and FashionMNIST, k = 5, 7, 9, epsilon = 3, 9, for every grid size K the private strategies
   have (k, 5k, k^2), one run per configuration (composition) or per candidate (stopping, E[K] = K).
B. Measured on digits (the offline set), every private strategy, epsilon = 3 and 9, delta = 1e-5: the selected
   configuration's score under composition (each configuration trained once, the K runs composed; the best one
   chosen) and under truncated-negative-binomial stopping (eta = 0, E[K] = K, candidates of one run), each
   procedure repeated 5 times (composition: training seeds 0-4; stopping: privacy.selection.stopping_seed 0-4).
C. nu by random stopping under the Renyi analysis and the profile bound, per stopping rule, for MNIST at
   epsilon = 1, 3, 8 and E[K] = 7, 25, 49 candidates of one run, beside composition of K runs.
D. Part B's stopping procedures again, accounted by the profile bound (less noise at the same epsilon).
Writes docs/selection/plan.csv and digits.csv (A, B), profile.csv and digits_profile.csv (C, D) and prints them
as markdown.
"""

import argparse
import tempfile
from pathlib import Path

import pandas as pd

import dpgrid
from dpgrid.config.groups import options
from dpgrid.privacy import alternatives

OUT = Path(__file__).resolve().parents[1] / "docs" / "selection"
REPEATS = 5


def private_strategies() -> list:
    """The private DP-SGD strategies (the noise schedules train logistic regression, not digits)."""
    from dpgrid.strategies import resolve

    return [s for s in options("strategy") if (cls := resolve(dpgrid.compose([f"strategy={s}"]).strategy)).private
            and cls.accounting == "composition"]


def plan_table() -> pd.DataFrame:
    rows = []
    for dataset in ("mnist", "fashion_mnist"):
        for k in (5, 7, 9):
            for epsilon in (3, 9):
                by_size = {}
                for strategy in private_strategies():
                    cfg = dpgrid.compose([f"dataset={dataset}", f"strategy={strategy}", f"grid.k={k}", "train.seeds=1",
                                          f"privacy.epsilon={epsilon}", "grid.allow_large=true"])
                    by_size.setdefault(dpgrid.plan(cfg).n_configs, (cfg, []))[1].append(strategy)
                for size, (cfg, strategies) in sorted(by_size.items()):
                    plan = dpgrid.plan(cfg)
                    nus = {name.split(",")[0]: nu for name, nu in alternatives(plan, 0.0, float(size)).items()}
                    rows.append(dict(dataset=dataset, k=k, epsilon=epsilon, K=size, strategies=" ".join(strategies),
                                     **nus))  # (one run per configuration: both composition rows coincide)
    return pd.DataFrame(rows)


def selected_score(cfg_overrides: list, out: Path) -> tuple:
    """(the selected configuration's score, nu, candidates drawn or K) of one procedure."""
    result = dpgrid.run_grid(dpgrid.compose(cfg_overrides), out, progress=False)
    if "selection" in result.plan and result.plan["selection"] == "random_stopping":
        import json

        released = json.loads((out / "selection.json").read_text())
        score = released["chosen"]["score"] if released["chosen"] else float("nan")
        drawn = json.loads((out / "candidates.json").read_text())["candidates"]  # private: a study of the method
        return score, result.plan["noise_multiplier"], len(drawn)
    return None, result.plan["noise_multiplier"], result.runs


PROTOCOL = "protocol=literal"  # docs/selection.md was measured with plain SGD; pinned so that it regenerates


def digits_table(accounting: list = ()) -> pd.DataFrame:
    """Part B; `accounting`: overrides for the stopping procedures (PROFILE: part D)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in private_strategies():
            for epsilon in (3, 9):
                common = [f"strategy={strategy}", f"privacy.epsilon={epsilon}", PROTOCOL]
                _, nu_c, runs = selected_score([*common, f"train.seeds={REPEATS}"], Path(tmp) / f"{strategy}{epsilon}c")
                composed = runs.loc[runs.groupby("seed").best_value.idxmax()].best_value  # the best config per seed
                picks = [selected_score([*common, "train.seeds=1", "privacy.selection=random_stopping", *accounting,
                                         f"privacy.selection.stopping_seed={r}"], Path(tmp) / f"{strategy}{epsilon}s{r}")
                         for r in range(REPEATS)]
                stopped = pd.Series([p[0] for p in picks])
                rows.append(dict(strategy=strategy, epsilon=epsilon, K=runs.config_id.nunique(),
                                 nu_composition=nu_c, composition_mean=composed.mean(), composition_std=composed.std(ddof=0),
                                 nu_stopping=picks[0][1], stopping_mean=stopped.mean(), stopping_std=stopped.std(ddof=0),
                                 candidates_drawn=" ".join(str(p[2]) for p in picks)))
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


PROFILE = ["privacy.selection.selection_accountant=profile", "privacy.accountant=pld"]


def profile_table() -> pd.DataFrame:
    from dpgrid.privacy import calibrate
    from dpgrid.privacy.random_stopping import COVERS, parameters, selection_noise

    rows = []
    for epsilon in (1, 3, 8):
        plan = dpgrid.plan(dpgrid.compose(["dataset=mnist", "train.seeds=1", f"privacy.epsilon={epsilon}"]))
        for mean in (7, 25, 49):
            row = dict(epsilon=epsilon, K=mean, composition=calibrate(epsilon, plan.sample_rate, mean * plan.steps,
                                                                       plan.delta))
            for rule in COVERS["profile"]:
                stopping = parameters(rule, 0.0, mean, plan.delta, rounds=2 * mean)
                for analysis in ("rdp", "profile"):
                    if rule in COVERS[analysis]:
                        row[f"{rule} {analysis}"] = selection_noise(plan.sample_rate, plan.steps, epsilon, plan.delta,
                                                                    stopping, analysis)
            rows.append(row)
            print(row, flush=True)
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    cell = lambda v: f"{v:.3g}" if isinstance(v, float) else ("unreachable" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)])


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--plan", action="store_true", help="part A only (no training)")
    parser.add_argument("--profile", action="store_true", help="parts C and D only (the profile bound)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.profile:
        table = profile_table()
        table.to_csv(OUT / "profile.csv", index=False)
        print(markdown(table), flush=True)
        digits = digits_table(PROFILE)
        digits.to_csv(OUT / "digits_profile.csv", index=False)
        print(markdown(digits))
        return
    plan = plan_table()
    plan.to_csv(OUT / "plan.csv", index=False)
    print(markdown(plan), flush=True)
    if not args.plan:
        digits = digits_table()
        digits.to_csv(OUT / "digits.csv", index=False)
        print(markdown(digits))


if __name__ == "__main__":
    main()
