"""What a dataset's `task` means, defined once: its per-sample training loss, its validation metric
(name, unit, which direction is better) and how tables print it. Engines, training, summaries, tables
and figures all ask the task; a new task is one more entry of TASKS."""

from dataclasses import dataclass
from typing import Callable

from dpgrid import DpgridError

# Tensors in, tensors out; torch is imported by the caller (this module stays light for the early checks).


def cross_entropy(out, y):
    from torch.nn.functional import cross_entropy as ce
    return ce(out, y, reduction="none")


def image_mse(out, y):
    return (out - y).pow(2).flatten(1).mean(1)


def logistic_loss(out, y):
    """log(1 + exp(-y z.theta)) for labels y in {-1, +1} (the regulariser is the model's `penalty`)."""
    from torch.nn.functional import softplus
    return softplus(-y * out.squeeze(-1))


def correct(out, y, losses):
    return (out.argmax(1) == y).sum()


def summed_loss(out, y, losses):
    return losses.sum()


@dataclass(frozen=True)
class Task:
    name: str                  # the dataset config's `task`
    metric: str                # runs.csv's `metric` column
    unit: str                  # how a value is described to a user
    higher_is_better: bool
    loss: Callable             # (outputs, targets) -> per-sample losses (b,)
    score: Callable            # (outputs, targets, losses) -> the batch's contribution to the metric's sum
    scale: float = 1.0         # metric value = scale * sum / N (accuracy in %)
    table_scale: float = 1.0   # tables print value x table_scale (the paper prints MSE x 10^2)
    table_name: str = ""       # the column name in tables
    table_decimals: int = 2    # every value of the metric in a table: the same rounding down a column
    valid: tuple = (0.0, float("inf"))  # the range a value can take; a runs.csv value outside is refused
    targets_are_inputs: bool = False  # reconstruction: the loader's labels are replaced by the inputs
    has_classes: bool = False  # labels are class indices 0..classes-1 (checked at load)
    disclosure: str = ""       # what of the private data its tables show that no epsilon covers (a footnote)
    features_dtypes: tuple = ("float32",)  # what a loader may return (torch dtype names, the first preferred); checked at load
    labels_dtype: str = "int64"      # None: the targets are the inputs (whatever the loader returned)

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher_is_better else a < b


TASKS = {task.name: task for task in (
    Task("classification", "accuracy", "accuracy %", True, cross_entropy, correct, scale=100.0, table_name="acc",
         has_classes=True, valid=(0.0, 100.0), features_dtypes=("float32", "int64")),  # int64: token ids
    Task("reconstruction", "mse", "MSE", False, image_mse, summed_loss, table_scale=100.0, table_name="mse×10²",
         targets_are_inputs=True, labels_dtype=None),
    Task("logistic", "risk", "empirical risk", False, logistic_loss, summed_loss, table_name="risk", table_decimals=4,
         disclosure="not private (no ε covers them, as in the PUR paper): the risk values and curves, evaluated on the "
                    "private training data, and the features' standardisation, made with that data's own mean and "
                    "variance", features_dtypes=("float64",), labels_dtype="float64"),
)}
BY_METRIC = {task.metric: task for task in TASKS.values()}


def get(name: str) -> Task:
    """The task of a dataset config's `task` (or of a runs.csv `metric`)."""
    task = TASKS.get(name) or BY_METRIC.get(name)
    if task is None:
        raise DpgridError(f"unknown task {name!r}; valid: {', '.join(TASKS)}")
    return task
