"""Datasets as whole tensors on the run's device: a dataset config's `load` node + data.root -> Data.

The package: this module (Data, `load`, the checks of what a loader returns, the data's identity), the built-in
loaders (`datasets`: the paper's image and text sets; `binary`: the PUR track's two-class sets) and `tasks` (what a
task trains on and measures). The loaders are plugins: `load._target_` names one, a user's anywhere importable.
torch is imported where a tensor is made or checked, so that reading a task (dpgrid.data.tasks, e.g. by the tables)
loads none.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrid import DpgridError
from dpgrid.data import tasks
from dpgrid.plugins import call
from dpgrid.specs import dataset_spec

if TYPE_CHECKING:
    import torch


@dataclass
class Data:
    x_train: torch.Tensor
    y_train: torch.Tensor  # targets: class indices, or the inputs themselves for reconstruction
    x_test: torch.Tensor
    y_test: torch.Tensor
    task: str              # a dpgrid.data.tasks name: "classification" (accuracy %) or "reconstruction" (MSE)
    files: dict = field(default_factory=dict)  # {name relative to data.root: path}: the data's identity
    # data.validation=test_half: the test set's report half (x_test, y_test are then its selection half); None: the
    # whole test set selects and reports
    x_report: torch.Tensor = None
    y_report: torch.Tensor = None
    # the names (keys of `files`) that hold the training split: the data's private identity (the study's ledger keys
    # a dataset by them, so that another test split or another copy of a public resource is the same data); None: all
    train_files: tuple = None
    statistics: dict = field(default_factory=dict)  # {buffer name: tensor}: what the grid's models estimated of x_train
                                                    # privately, once (dpgrid.models.inputs); every run starts with it

    @property
    def n_train(self) -> int:
        return len(self.x_train)

    def in_float64(self) -> "Data":
        """The same data with every floating-point tensor in float64 (labels stay integers)."""
        up = lambda t: t if t is None or not t.is_floating_point() else t.double()  # noqa: E731
        return Data(up(self.x_train), up(self.y_train), up(self.x_test), up(self.y_test), self.task, self.files,
                    up(self.x_report), up(self.y_report), self.train_files,
                    {key: up(value) for key, value in self.statistics.items()})


VALIDATION = ("test", "test_half")  # data.validation: what chooses the best configuration and the default seed


def test_halves(data: Data, dataset_name: str) -> Data:
    """data.validation=test_half: the public test set split into a selection half (x_test, y_test: what every
    validation, the best configuration and the default seed are chosen on) and a report half (x_report, y_report:
    what every reported score is measured on). Fixed and seeded by the dataset's name, so every grid on a dataset uses
    the same halves; stratified by class where the task has classes (each class split in two, the odd example to the
    report half), else a random half. No privacy is spent on either: the test set is public."""
    import torch

    from dpgrid.privacy.randomness import derive_seed

    generator = torch.Generator().manual_seed(derive_seed(dataset_name, "validation", "test_half"))
    n = len(data.x_test)
    if tasks.get(data.task).has_classes:
        labels = data.y_test.cpu()
        groups = [torch.nonzero(labels == c).squeeze(1) for c in torch.unique(labels)]
    else:
        groups = [torch.arange(n)]
    selection, report = [], []
    for group in groups:
        shuffled = group[torch.randperm(len(group), generator=generator)]
        selection.append(shuffled[:len(group) // 2])
        report.append(shuffled[len(group) // 2:])
    selection, report = (torch.sort(torch.cat(part)).values.to(data.x_test.device) for part in (selection, report))
    if not len(selection) or not len(report):
        raise DpgridError(f"data.validation=test_half: the test split of {dataset_name} holds {n} example(s), too few "
                          "to split in two halves; use data.validation=test")
    return Data(data.x_train, data.y_train, data.x_test[selection], data.y_test[selection], data.task, data.files,
                data.x_test[report], data.y_test[report], data.train_files, data.statistics)


def load(dataset, root, device="cpu") -> Data:
    """Call the dataset's loader (`dataset.load._target_`, with root and the node's other keys), check
    what it returns, and put it on `device` with the dataset's task and normalisation. `dataset`: its DatasetSpec,
    or its config node."""
    dataset = dataset_spec(dataset)
    data = call(dataset.load, f"dataset={dataset.name}: load", root=str(root))
    if not isinstance(data, Data):
        raise DpgridError(f"dataset={dataset.name}: load._target_ returned {type(data).__name__}, "
                          "not a dpgrid.Data")
    x_tr, y_tr, x_te, y_te = data.x_train, data.y_train, data.x_test, data.y_test
    check_loaded(dataset, root, x_tr, y_tr, x_te, y_te)
    x_tr, y_tr, x_te, y_te = (t.to(device) for t in (x_tr, y_tr, x_te, y_te))
    if tasks.get(dataset.task).targets_are_inputs:
        y_tr, y_te = x_tr, x_te  # the targets stay in [0, 1] (the autoencoder ends in a sigmoid)
    if dataset.normalize == "standardize":
        # Published constants, never statistics computed here from the private training set.
        mean, std = float(dataset.mean), float(dataset.std)
        x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return Data(x_tr, y_tr, x_te, y_te, dataset.task, data.files, train_files=data.train_files)


def check_loaded(dataset, root, x_tr, y_tr, x_te, y_te) -> None:
    """Whatever the loader: non-empty splits, as many targets as inputs, and class labels in
    0..classes-1 (a label outside would crash training midway, or count silently as a miss)."""
    import torch

    name, classes, features = dataset.name, dataset.classes, dataset.features
    task = tasks.get(dataset.task)
    casts = {"float32": "float", "float64": "double", "int64": "long"}
    for what, tensors, needed in (("features", (x_tr, x_te), task.features_dtypes),
                                  ("labels", (y_tr, y_te), (task.labels_dtype,) if task.labels_dtype else ())):
        found = {str(t.dtype).removeprefix("torch.") for t in tensors if isinstance(t, torch.Tensor)}
        if needed and (len(found) != 1 or not found <= set(needed) or
                       not all(isinstance(t, torch.Tensor) for t in tensors)):
            fix = f"{'x' if what == 'features' else 'y'}.{casts[needed[0]]}()"
            raise DpgridError(f"dataset={name}: its loader returned {what} of dtype {', '.join(sorted(found)) or 'not a tensor'}; "
                              f"task {task.name} needs {' or '.join(needed)} ({fix} in the loader)")
    if features is not None and x_tr.dim() == 2 and x_tr.shape[1] != int(features):
        raise DpgridError(f"{name}'s data under {root} has {x_tr.shape[1]} features, its config says "
                          f"dataset.features={features}")
    for split, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        where = f"{name}'s {split} split under {root}"
        if len(x) == 0:
            raise DpgridError(f"{where} holds no examples")
        for what, t in (("features", x), ("targets", y)):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                i = int((~torch.isfinite(t.reshape(len(t), -1))).any(dim=1).nonzero()[0][0])
                raise DpgridError(f"{where}: example {i} has {what} that are NaN or infinite")
        if len(x) != len(y):
            raise DpgridError(f"{where}: {len(x)} inputs but {len(y)} labels")
        if tasks.get(dataset.task).has_classes and classes is not None:
            bad = ((y < 0) | (y >= int(classes))).nonzero()
            if len(bad):
                i = int(bad[0][0])
                raise DpgridError(f"{where}: label {int(y[i])} of example {i} is outside 0..{int(classes) - 1}")


# --- the data's identity: what a run directory records instead of data.root --------------------------

def fingerprint(files: dict) -> dict:
    """{name: {"bytes": size, "sha256": checksum}}; checksums are cached per (path, inode, size, mtime, ctime): a file
    whose bytes changed has another ctime, even where its size and mtime were put back (touch -r), and is read
    afresh."""
    cache_path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpgrid" / "checksums.json"
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    result, changed = {}, False
    for name, path in sorted(files.items()):
        path = Path(path)  # any path-like a loader returns
        stat = path.stat()
        key = f"{path.resolve()}|{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}"
        if key not in cache:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            cache[key], changed = digest.hexdigest(), True
        result[name] = {"bytes": stat.st_size, "sha256": cache[key]}
    if changed:
        try:  # an optimisation only: a cache that cannot be written is skipped
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, cache_path)
        except OSError:
            pass
    return result


