"""Running dpgrid with the examples/ plugin package on the search path, as a user would."""

from .command import dpgrid as run_dpgrid
from .conftest import ROOT

EXAMPLES = ROOT / "examples"
SEARCHPATH = f"hydra.searchpath=[file://{EXAMPLES / 'dpgrid_example' / 'conf'}]"


def dpgrid(*args, cwd=None):
    """`dpgrid *args` with the example package importable, as `pip install examples/` would make it."""
    return run_dpgrid(*args, cwd=cwd, path=[EXAMPLES])
