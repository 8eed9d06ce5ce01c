"""Public pretraining, then private fine-tuning tuned honestly: the study behind docs/finetuning.md.

    python scripts/finetuning_study.py DATA_ROOT            # FashionMNIST -> MNIST, image_mlp: about 42 minutes, 2 cores

DATA_ROOT holds FashionMNIST/raw and MNIST/raw (torchvision's layout). First a non-private grid on FashionMNIST's
ten classes (public data: strategy=nodp, model=image_mlp, 3 epochs, 1 seed) releases its best model: the public
checkpoint. Then, on MNIST (the private data, 2 epochs), for each epsilon in {1, 3, 8}, each way of training and
each way of tuning:
- from scratch: every parameter from the model's random start;
- full fine-tuning: every parameter from the checkpoint (model.init);
- last layer: the checkpoint, only the classifier (train.trainable=["3.*"]);
- LoRA: the checkpoint, rank-8 adapters on the hidden layer (model.lora.targets=["1"]) and the classifier;
tuned by fixed_threshold over K = 9 configurations (lr x clip, grid.k=3) with 5 seeds, accounted by composition (the
released model's configuration chosen on the test set among all K, every run composed: privacy.account_seeds=true)
or by random stopping (truncated negative binomial, eta = 0; privacy.selection.stopping_seed 0..R-1 averaged).
The score is what the grid releases: the released configuration's test accuracy, mean over its 5 seeds. Compute:
run-steps and the CPU seconds of the grid (process time, both cores).

Writes docs/finetuning/study.csv and prints it as markdown.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
from selection_study import markdown  # (scripts/ is on the path of a script run from it)

import dpgrid

OUT = Path(__file__).resolve().parents[1] / "docs" / "finetuning"
EPSILONS = (1, 3, 8)
PRIVATE = ["dataset=mnist", "model=image_mlp", "train.epochs=2", "strategy=fixed_threshold", "grid.k=3"]


def arms(checkpoint: Path) -> list:
    """(name, overrides) of each way of training."""
    init = [f"model.init={checkpoint}", "model.init_disjoint=true"]  # FashionMNIST shares no example with MNIST
    return [("scratch", []), ("full fine-tuning", init), ("last layer", [*init, 'train.trainable=["3.*"]']),
            ("LoRA r=8", [*init, "model.lora.rank=8", 'model.lora.targets=["1"]'])]


def pretrain(root: str, out: Path) -> Path:
    cfg = dpgrid.compose(["dataset=fashion_mnist_classes", "model=image_mlp", "strategy=nodp", "train.epochs=3",
                          "train.seeds=1", f"data.root={root}"])
    start = time.process_time()
    dpgrid.run_grid(cfg, out, progress=False)
    summary = pd.read_csv(out / "summary.csv")
    print(f"public pretraining: FashionMNIST test accuracy {float(summary[summary.best]['mean'].iloc[0]):.2f} %, "
          f"{time.process_time() - start:.0f} CPU s", flush=True)
    return out / "model" / "seed0.safetensors"


def measured(out: Path) -> dict:
    plan = json.loads((out / "plan.json").read_text())
    runs = pd.read_csv(out / "runs.csv")
    if plan.get("selection") == "random_stopping":
        score = (json.loads((out / "selection.json").read_text()).get("chosen") or {}).get("score")
    else:
        summary = pd.read_csv(out / "summary.csv")
        score = float(summary[summary.best]["mean"].iloc[0]) if summary.best.any() else None
    return dict(score=score, nu=plan["noise_multiplier"], epsilon_spent=plan["epsilon_spent"],
                trainable=(plan.get("start") or {}).get("trainable_parameters", plan["model_parameters"]),
                run_steps=float(runs.steps.sum()))


def study(root: str, repeats: int) -> pd.DataFrame:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = pretrain(root, Path(tmp) / "public")
        for epsilon in EPSILONS:
            for arm, overrides in arms(checkpoint):
                for selection, extra, reps in (("composition", ["privacy.account_seeds=true"], 1),
                                               ("random stopping", ["privacy.selection=random_stopping"], repeats)):
                    found = []
                    for rep in range(reps):
                        out = Path(tmp) / f"{epsilon}_{arm}_{selection}_{rep}".replace(" ", "_")
                        seed = [f"privacy.selection.stopping_seed={rep}"] if selection == "random stopping" else []
                        cfg = dpgrid.compose([*PRIVATE, f"data.root={root}", f"privacy.epsilon={epsilon}", *extra,
                                              *seed, *overrides])
                        start = time.process_time()
                        dpgrid.run_grid(cfg, out, progress=False)
                        found.append({**measured(out), "cpu_seconds": time.process_time() - start})
                    scores = pd.Series([f["score"] for f in found], dtype=float)
                    rows.append(dict(epsilon=epsilon, training=arm, selection=selection, nu=round(found[0]["nu"], 4),
                                     trainable=found[0]["trainable"], score=round(scores.mean(), 2),
                                     score_std=round(scores.std(ddof=0), 2), repetitions=reps,
                                     run_steps=sum(f["run_steps"] for f in found) / reps,
                                     cpu_seconds=round(sum(f["cpu_seconds"] for f in found) / reps, 1)))
                    print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("data_root", help="the folder holding FashionMNIST/raw and MNIST/raw")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of random stopping")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    frame = study(args.data_root, args.repeats)
    frame.to_csv(OUT / "study.csv", index=False)
    print(markdown(frame))


if __name__ == "__main__":
    main()
