"""Tramèr & Boneh's main table (ICLR 2021), reproduced, then tuned honestly, with dpgrid's models scatternet_linear,
scatternet_cnn and tanh_cnn (docs/scatternet.md):

    python scripts/reproduce_scatternet.py --data-root DATA          # MNIST and FashionMNIST, every part, 5 seeds
    python scripts/reproduce_scatternet.py --data-root DATA --datasets cifar10      # with a copy of CIFAR-10
    python scripts/reproduce_scatternet.py --data-root DATA --parts paper --models scatternet_linear --seeds 2

For every (dataset, model) cell of scripts/reproduce_scatternet.yaml, three grids, each a `dpgrid.run_grid` (the runs
`dpgrid run` makes), into --results (default outputs/scatternet; a grid run again resumes):

- paper: the paper's setting, tuning not accounted, as in the paper: one configuration (its learning rate, clip 0.1,
  batch size, epochs, normalisation, momentum 0.9), (epsilon, delta) = (3, 1e-5) for each seed's run;
- composition: dpgrid, tuning paid: a grid over the learning rate (the authors' own search at that batch size) and
  the clip, its K runs composed within the same (3, 1e-5), chosen on the selection half of the test set and scored on
  its report half (data.validation=test_half). Each seed is one repetition of the whole tuned experiment: its K runs,
  the configuration its own selection-half scores choose, that run's report-half accuracy;
- random_stopping: the same grid, a random-stopping selection within (3, 1e-5) (truncated negative binomial, E[K] = K),
  chosen and scored on the halves too; each repetition a selection of its own (privacy.selection.stopping_seed), one
  seed per candidate, its chosen candidate's report-half accuracy.

Writes into --out (default docs/scatternet): table.csv (every cell, every part: each seed's final test accuracy, the
noise multiplier, what chose it, seconds) and table.md (the paper, the paper's setting, dpgrid tuning paid and the
difference, mean ± std over the seeds). The features of each dataset are computed by the first grid and kept
(dpgrid.data.features). A dataset whose files are missing under --data-root is skipped, with the path it needs.
"""

import argparse
import json
import math
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

import dpgrid

PROTOCOL = OmegaConf.load(Path(__file__).with_suffix(".yaml"))
PARTS = ("paper", "composition", "random_stopping")
LABELS = {"tanh_cnn": "end-to-end CNN", "scatternet_linear": "ScatterNet + linear", "scatternet_cnn": "ScatterNet + CNN"}
NAMES = {"mnist": "MNIST", "fashion_mnist_classes": "FashionMNIST", "cifar10": "CIFAR-10"}


def overrides(dataset: str, model: str, part: str, seeds: int, args, repetition: int = 0) -> list:
    """The command line of one grid."""
    s = PROTOCOL.settings[dataset][model]
    clip = float(PROTOCOL.clip)
    if part == "paper":
        lrs, clips = [float(s.lr)], [clip]
    else:
        lrs = [b * s.batch_size / 512 for b in args.base_lrs]
        clips = list(args.clips)
    steps_per_epoch = math.ceil({"cifar10": 50000}.get(dataset, 60000) / s.batch_size)
    norm = [f"model.{key}={s[key]}" for key in ("norm", "groups", "norm_noise") if key in s]
    tuned = [] if part == "paper" else ["data.validation=test_half"]
    if part == "random_stopping":  # one seed per candidate: a selection's seeds are paid for, each repetition its own
        tuned += [*PROTOCOL.tuning.selections[part], f"privacy.selection.stopping_seed={repetition}"]
        seeds = 1
    return [f"dataset={dataset}", f"model={model}", "strategy=fixed_threshold", "protocol=paper",
            f"+strategy.axes.lr=[{','.join(f'{v:g}' for v in lrs)}]", f"+strategy.axes.clip=[{','.join(f'{v:g}' for v in clips)}]",
            f"train.batch_size={s.batch_size}", f"train.epochs={s.epochs}", f"train.seeds={seeds}",
            f"train.eval_every={steps_per_epoch}", f"privacy.epsilon={PROTOCOL.epsilon}", f"privacy.delta={PROTOCOL.delta}",
            f"data.root={args.data_root}", *norm, *tuned, *args.set]


def released(out: Path) -> dict:
    """What the grid released (model.json): its configuration, each released seed's final test accuracy, its score
    (the mean over the released seeds of what chose it; on the report half under data.validation=test_half) and the
    epsilon that covers it."""
    record = json.loads((out / "model" / "model.json").read_text())
    return {"configuration": record["configuration"], "values": [m["test_value"] for m in record["models"]],
            "seeds": [m["seed"] for m in record["models"]], "score": record["score"]["value"],
            "covered_by": record["covered_by"]["epsilon"]}


def report_half(out: Path, dataset: str, data_root: str) -> list:
    """Each model a grid released, as dpgrid.load_model gives it, scored on the report half of the test set (what the
    tuned parts are scored on): the halves differ by a few tenths, so the paper's setting is compared on the same half.
    A feature stage's test features come from the features' cache (dpgrid.data.features), as the grid's did."""
    from dpgrid.data import load, test_halves
    from dpgrid.data.features import with_features
    from dpgrid.models.inputs import front_stage
    from dpgrid.training.train import evaluate

    models = [dpgrid.load_model(out, seed) for seed in released(out)["seeds"]]
    data = load(dpgrid.compose([f"dataset={dataset}"]).dataset, data_root)
    if front_stage(models[0]) is not None:
        data = with_features(front_stage(models[0]), data, dataset)[0]  # the same key as the grid's: read back
    halves = test_halves(data, dataset)
    return [evaluate(model, halves.x_report.to(torch.float32), halves.y_report, data.task)[0] for model in models]


def repetitions(runs: pd.DataFrame) -> pd.DataFrame:
    """Each seed of a composed grid as one repetition of the tuned experiment: among that seed's K runs, the one whose
    selection-half score (best_value) is best, diverged runs last; its configuration and report-half score."""
    chosen = (runs.assign(_diverged=runs.diverged.astype(bool), _score=-runs.best_value.astype(float))
              .sort_values(["seed", "_diverged", "_score"], kind="stable").groupby("seed").head(1))
    return chosen[["seed", "config_id", "lr", "clip", "best_value", "report_value"]].reset_index(drop=True)


def grid(dataset: str, model: str, part: str, args, out: Path, repetition: int = 0):
    return dpgrid.run_grid(dpgrid.compose(overrides(dataset, model, part, args.seeds, args, repetition)), out,
                           progress=not args.quiet)


def cell(dataset: str, model: str, part: str, args) -> dict:
    out = Path(args.results) / dataset / model / part
    started = time.perf_counter()
    if part == "paper":
        result = grid(dataset, model, part, args, out)
        chosen = released(out)
        covered = chosen["covered_by"]
        values, lrs, clips = chosen["values"], [chosen["configuration"].get("lr")], [chosen["configuration"].get("clip")]
        reported = report_half(out, dataset, args.data_root)
        runs_seconds = float(result.runs.seconds.sum())
    elif part == "composition":
        result = grid(dataset, model, part, args, out)
        covered = result.plan["epsilon_grid"]  # a repetition publishes one seed's choice: its K runs composed
        chosen = repetitions(result.runs)
        values, lrs, clips = chosen["report_value"].tolist(), chosen["lr"].tolist(), chosen["clip"].tolist()
        reported = values
        runs_seconds = float(result.runs.seconds.sum())
    else:
        selections, runs_seconds = [], 0.0
        for r in range(args.seeds if args.repetitions is None else args.repetitions):
            result = grid(dataset, model, part, args, out / f"repetition{r}", r)
            selections.append(released(out / f"repetition{r}"))
            runs_seconds += float(result.runs.seconds.sum())
        values = reported = [chosen["score"] for chosen in selections]  # one seed: its report-half score
        lrs, clips = ([chosen["configuration"].get(axis) for chosen in selections] for axis in ("lr", "clip"))
        covered = max(chosen["covered_by"] for chosen in selections)
    seconds = time.perf_counter() - started
    plan = result.plan
    return {"dataset": dataset, "model": model, "part": part, "mean": float(pd.Series(values).mean()),
            "std": float(pd.Series(values).std(ddof=0)), "seeds": len(values),
            "values": " ".join(f"{v:.2f}" for v in values), "report_mean": float(pd.Series(reported).mean()),
            "report_std": float(pd.Series(reported).std(ddof=0)), "report_values": " ".join(f"{v:.2f}" for v in reported),
            "lr": " ".join(f"{v:g}" for v in lrs),
            "clip": " ".join(f"{v:g}" for v in clips), "configurations": plan["n_configs"],
            "grid_lrs": " ".join(f"{v:g}" for v in sorted({c["lr"] for c in plan["configurations"]})),
            "grid_clips": " ".join(f"{v:g}" for v in sorted({c["clip"] for c in plan["configurations"]})),
            "noise_multiplier": plan["noise_multiplier"], "paper_nu": PROTOCOL.settings[dataset][model].paper_nu,
            "statistics": json.dumps(plan.get("statistics") or []), "epsilon_covered": covered,
            "scored_on": "test" if part == "paper" else "report half of test",
            "seconds": round(seconds, 1), "runs_seconds": round(runs_seconds, 1),
            "paper": float(PROTOCOL.paper[dataset][model])}


def missing(dataset: str, root: str) -> str:
    """Why a dataset cannot run here ('' when its files are there)."""
    from dpgrid.data import load

    try:
        load(dpgrid.compose([f"dataset={dataset}"]).dataset, root)
    except dpgrid.DpgridError as e:
        return str(e)
    return ""


def table(rows: pd.DataFrame) -> str:
    """The side-by-side table: the paper; the paper's setting (tuning not accounted) on the whole test set and on its
    report half; dpgrid tuning paid (composition, random stopping: the report half); the differences on that half."""
    def shown(r, prefix=""):
        if r is None:
            return "–"
        mean, std = r[f"{prefix}mean"], r[f"{prefix}std"]
        return f"{mean:.2f} ± {std:.2f}" if int(r["seeds"]) > 1 else f"{mean:.2f} (1 seed)"

    def difference(tuned, paper):
        if tuned is None or paper is None or "report_mean" not in paper or pd.isna(paper["report_mean"]):
            return "–"
        spread = math.hypot(tuned["report_std"], paper["report_std"]) if int(tuned["seeds"]) > 1 else None
        return f"{tuned['report_mean'] - paper['report_mean']:+.2f}" + (f" (±{spread:.2f})" if spread else "")

    lines = ["| dataset | model | paper (Table 1) | paper's setting, tuning not accounted: test set | the same, report "
             "half | tuning paid, composition: report half | tuning paid, random stopping: report half | difference: "
             "composition | difference: random stopping |", "|---|---|---|---|---|---|---|---|---|"]
    for (dataset, model), group in rows.groupby(["dataset", "model"], sort=False):
        parts = {r.part: r for _, r in group.iterrows()}
        paper, comp, rs = parts.get("paper"), parts.get("composition"), parts.get("random_stopping")
        lines.append(f"| {NAMES.get(dataset, dataset)} | {LABELS[model]} | {group.iloc[0]['paper']:.1f} | {shown(paper)} | "
                     f"{shown(paper, 'report_')} | {shown(comp)} | {shown(rs)} | {difference(comp, paper)} | "
                     f"{difference(rs, paper)} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data", help="where MNIST/, FashionMNIST/ (and cifar-10-batches-py/) lie")
    parser.add_argument("--datasets", nargs="+", default=["mnist", "fashion_mnist_classes"], choices=list(PROTOCOL.settings),
                        help="the datasets whose cells run (default: MNIST and FashionMNIST)")
    parser.add_argument("--models", nargs="+", default=list(LABELS), choices=list(LABELS),
                        help="the models whose cells run (default: all three)")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                        help="the paper's setting, the grid composed, the grid by random stopping (default: all)")
    parser.add_argument("--seeds", type=int, default=int(PROTOCOL.seeds),
                        help="seeds per configuration (default 5, as the paper's spread needs)")
    parser.add_argument("--repetitions", type=int, default=None,
                        help="random stopping's repetitions, each a selection of its own (default: --seeds)")
    parser.add_argument("--base-lrs", nargs="+", type=float, default=list(PROTOCOL.tuning.base_lrs),
                        help="the tuning grid's learning rates per 512 examples of batch (the authors' search)")
    parser.add_argument("--clips", nargs="+", type=float, default=list(PROTOCOL.tuning.clips),
                        help="the tuning grid's clipping thresholds")
    parser.add_argument("--results", default="outputs/scatternet",
                        help="where each grid's run directory goes (a grid run again resumes there)")
    parser.add_argument("--out", default="docs/scatternet", help="where table.csv and table.md are written")
    parser.add_argument("--set", nargs="*", default=[], help="more overrides for every grid, e.g. train.device=cuda")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args()
    started, rows = time.perf_counter(), []
    datasets = [d for d in args.datasets if not skipped(d, args.data_root)]
    for part in args.parts:  # the reproduction first, then the tuning that pays
        for dataset in datasets:
            for model in args.models:
                row = cell(dataset, model, part, args)
                rows.append(row)
                print(f"{dataset} {model} {part}: {row['mean']:.2f} ± {row['std']:.2f} ({row['values']}); nu = "
                      f"{row['noise_multiplier']:.4g} (the paper's {row['paper_nu']}); {row['seconds']:.0f} s", flush=True)
                write(rows, args, time.perf_counter() - started)  # what is done so far, if the rest is stopped
    if rows:
        print(table(pd.DataFrame(rows)))
        print(f"{len(rows)} grids in {(time.perf_counter() - started) / 60:.1f} min; written to {args.out}")


def skipped(dataset: str, root: str) -> bool:
    why = missing(dataset, root)
    if why:
        print(f"{dataset}: skipped: {why}")
    return bool(why)


def write(rows: list, args, seconds: float) -> None:
    frame = pd.DataFrame(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "table.csv", index=False)
    (out / "table.md").write_text(table(frame) + f"\n\n{len(frame)} grids in {seconds / 60:.1f} min "
                                  f"({' '.join(args.set) or 'the default device'}).\n")


if __name__ == "__main__":
    main()
