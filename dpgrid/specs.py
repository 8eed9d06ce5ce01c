"""What a compiled grid keeps of its dataset config: plain, frozen, typed values (the model config's is a
dpgrid.plugins.Target). Built once by `compile`; the loader and the run read these, never the config node."""

from dataclasses import dataclass
from typing import Any, Optional

from dpgrid.plugins import target_of


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset config, compiled: its loader and the public constants a run reads of it (docs/extending.md, "A
    dataset"); the figures a plan reads (N, epsilons, ...) are the plan's."""
    name: str
    task: str
    load: Any                      # dpgrid.plugins.Target: the loader and its keyword arguments (root is dpgrid's)
    classes: Optional[int] = None  # labels are 0..classes-1 (checked at load)
    features: Optional[int] = None
    normalize: str = "unit"        # or standardize, with the published mean and std
    mean: Optional[float] = None
    std: Optional[float] = None
    seconds_per_step: Optional[float] = None  # time estimates (dpgrid plan)
    stacked_seconds_per_step: Optional[float] = None


def dataset_spec(node) -> DatasetSpec:
    """The DatasetSpec of a dataset config node (itself for a DatasetSpec)."""
    if isinstance(node, DatasetSpec):
        return node
    name = str(node.name)
    number = lambda key, kind: kind(node[key]) if node.get(key) is not None else None  # noqa: E731
    return DatasetSpec(name=name, task=str(node.task), load=target_of(node.load, f"dataset={name}: load"),
                       classes=number("classes", int), features=number("features", int),
                       normalize=str(node.get("normalize", "unit")), mean=number("mean", float), std=number("std", float),
                       seconds_per_step=number("seconds_per_step", float),
                       stacked_seconds_per_step=number("stacked_seconds_per_step", float))
