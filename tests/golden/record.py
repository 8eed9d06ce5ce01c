"""Record the golden regression data: every built-in strategy on digits, k = 3, 1 epoch, 1 seed,
epsilon = 3, validation every 4 steps (3 validations per run), into tests/golden/<strategy>/.

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
OVERRIDES = ["grid.k=3", "train.epochs=1", "train.seeds=1", "privacy.epsilon=3", "train.eval_every=4"]
FILES = ("runs.csv", "curves.csv")


def strategies() -> list:
    return sorted(p.stem for p in (CONF / "strategy").glob("*.yaml"))


def run_all(results: Path, names: list) -> dict:
    """{strategy: its grid's folder}, from one `dpgrid run -m` over the strategies."""
    subprocess.run([sys.executable, "-m", "dpgrid.cli", "run", "-m", f"strategy={','.join(names)}", *OVERRIDES,
                    f"hydra.sweep.dir={results}"], check=True, capture_output=True)
    return {name: next(results.glob(f"digits/{name}/*/k3")) for name in names}


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
