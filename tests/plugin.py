"""Running dpgrid with the examples/ plugin package on the search path, as a user would."""

import os
import subprocess
import sys

from .conftest import ROOT

EXAMPLES = ROOT / "examples"
SEARCHPATH = f"hydra.searchpath=[file://{EXAMPLES / 'dpgrid_example' / 'conf'}]"


def dpgrid(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "dpgrid.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)
