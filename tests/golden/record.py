"""Record the golden regression data: every built-in strategy on digits, k = 3, 1 epoch, 1 seed,
epsilon = 3, validation every 4 steps (3 validations per run), into tests/golden/<strategy>/; the strategies
of the logistic-regression task (noisy gradient descent) on iris, 1 seed, epsilon = 3, at most 200 iterations.

    python tests/golden/record.py

Run it only when a change is MEANT to change numbers, in a commit of its own that says why; never
in the same commit as a refactor (tests/test_golden.py is the guard that a refactor changes none).
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONF = HERE.parents[1] / "conf"
# float64: the recorded numbers then differ between CPUs, BLAS builds and thread counts by rounding only
# (about 1e-13 relative after an epoch), far below what any change to the algorithm moves them by.
OVERRIDES = {"digits": ["grid.k=3", "train.epochs=1", "train.seeds=1", "privacy.epsilon=3", "train.eval_every=4",
                        "train.float64=true"],
             "iris": ["train.seeds=1", "privacy.epsilon=3", "train.eval_every=20", "train.epochs=200",
                      "train.float64=true"]}
FILES = ("runs.csv", "curves.csv")


def strategies() -> list:
    return sorted(p.stem for p in (CONF / "strategy").glob("*.yaml"))


def dataset_of(name: str) -> str:
    """digits, or iris for a strategy that refuses digits (one of the logistic-regression task)."""
    import dpgrid
    from dpgrid.strategies import resolve

    cfg = dpgrid.compose([f"strategy={name}", *OVERRIDES["digits"]])
    runs_on = resolve(cfg.strategy).tasks
    return "digits" if runs_on is None or cfg.dataset.task in runs_on else "iris"


def in_a_process(*args) -> None:
    subprocess.run([sys.executable, "-m", "dpgrid.commands.cli", *args], check=True, capture_output=True)


def run_all(results: Path, names: list, dpgrid=in_a_process, extra: tuple = ()) -> dict:
    """{strategy: its grid's folder}, from one `dpgrid run -m` over the strategies of each dataset (`extra`: more
    overrides that must not change the numbers, e.g. train.parallel_runs)."""
    by_dataset = {}
    for name in names:
        by_dataset.setdefault(dataset_of(name), []).append(name)
    for dataset, group in by_dataset.items():
        dpgrid("run", "-m", f"dataset={dataset}", f"strategy={','.join(group)}", *OVERRIDES[dataset], *extra,
               f"hydra.sweep.dir={results}")
    return {name: next(results.glob(f"*/{name}/*/k*")) for name in names}


def main() -> None:
    names = strategies()
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder in run_all(Path(tmp), names).items():
            (HERE / name).mkdir(exist_ok=True)
            for file in FILES:
                shutil.copyfile(folder / file, HERE / name / file)
    print(f"recorded {', '.join(names)} into {HERE}")


if __name__ == "__main__":
    main()
