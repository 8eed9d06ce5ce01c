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


MODEL_KEYS = ("init", "init_covered_by", "init_disjoint", "lora")  # dpgrid's keys in every model config (conf/config.yaml): not the callable's arguments


def own_keys(model_cfg):
    """A model config without dpgrid's keys (MODEL_KEYS): what its callable takes (resolved where it sits)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(model_cfg, DictConfig) and any(key in model_cfg for key in MODEL_KEYS):
        return OmegaConf.create({key: value for key, value in OmegaConf.to_container(model_cfg, resolve=True).items()
                                 if key not in MODEL_KEYS})
    if isinstance(model_cfg, dict):
        return {key: value for key, value in model_cfg.items() if key not in MODEL_KEYS}
    return model_cfg


@dataclass(frozen=True)
class Study:
    """The study a grid belongs to in its dataset's ledger (privacy.study, privacy.study_budget, privacy.study_ledger;
    dpgrid.results.study): its name, the epsilon it may spend on the dataset (None: no budget) and where the ledger
    lives (None: the default place)."""
    name: Optional[str] = None
    budget: Optional[float] = None
    ledger: Optional[str] = None


@dataclass(frozen=True)
class Start:
    """What a run's model starts from and which part of it trains (model.init, model.lora, train.trainable; applied
    by dpgrid.models.finetuning.prepare)."""
    init: Optional[str] = None         # a .safetensors checkpoint's path, as given
    init_sha256: Optional[str] = None  # its checksum: the grid's identity, so a changed file is another grid
    init_provenance: object = None     # what covers it (dpgrid.privacy.provenance.Provenance): its file's statement, or declared
    init_disjoint: bool = False        # the user's word that this grid's data shares no example with the checkpoint's
    lora_rank: int = 0                 # 0: no adapters
    lora_alpha: float = 1.0
    lora_targets: tuple = ()           # module-name globs of the Linear layers that get adapters
    trainable: tuple = ("*",)          # parameter-name globs of the parameters that train
    trainable_parameters: Optional[int] = None  # how many numbers train (counted when the model is built)
    trained: tuple = ()                # the names of the parameters that train (adapters included), as built

    @property
    def is_default(self) -> bool:
        """Every parameter trains from the model's own random start."""
        return self.init is None and not self.lora_rank and self.trainable == ("*",)

    def to_dict(self) -> dict:
        """What plan.json and model.json say of it (only what is set away from training every parameter from a
        random start)."""
        found = {}
        if self.init:
            provenance = self.init_provenance
            found["init"] = {"path": self.init, "sha256": self.init_sha256,
                             "covered": provenance.words() if provenance is not None else
                             "public by assumption: epsilon covers what training on the private data changed",
                             **({"provenance": provenance.to_dict()} if provenance is not None else {}),
                             **({"disjoint": "declared by the user (model.init_disjoint=true): this grid's data "
                                             "shares no example with the checkpoint's"} if self.init_disjoint else {})}
        if self.lora_rank:
            found["lora"] = {"rank": self.lora_rank, "alpha": self.lora_alpha, "targets": list(self.lora_targets),
                             "merged": True}
        if self.trainable != ("*",):
            found["trainable"] = list(self.trainable)
        if found and self.trainable_parameters is not None:
            found["trainable_parameters"] = self.trainable_parameters
            found["trained"] = list(self.trained)
        return found
