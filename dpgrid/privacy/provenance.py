"""What covers a checkpoint (model.init): its privacy travels with it.

dpgrid's own release carries its statement in its metadata (what covers it, on which data, and the Poisson-subsampled
Gaussian steps that spent it). A grid fine-tuned from it is a second mechanism on that data, so its release is covered
by both together (`release_cover`: composed by the accountant where both record their steps, else by basic
composition, epsilons and deltas added); on other data each dataset is named with its own epsilon, and their
composition covers anyone in both. A file without such a statement is public by assumption, and every statement says
so; `model.init_covered_by` declares a checkpoint's privacy where its file does not carry it ({epsilon, delta,
dataset}), or declares a file public, which is refused where the file's own statement says otherwise: metadata is
never dropped in silence. Reads the file's header only (no torch: a config is checked before torch is loaded).
"""

import hashlib
import json
import math
from dataclasses import dataclass

from dpgrid import DpgridError


@dataclass(frozen=True)
class Provenance:
    """What covers a checkpoint's weights: `private` (epsilon and delta on `dataset`, whose files' fingerprint is
    `data_files`, JSON text; `events`: the (sample rate, noise multiplier, steps) its epsilon composes, where its
    statement records them; epsilon = inf for a model trained on its data without differential privacy) or not;
    `source`: where that is known from."""
    private: bool
    source: str
    epsilon: float = None
    delta: float = None
    dataset: str = None
    data_files: str = None
    events: tuple = None
    accountant: str = None

    def to_dict(self) -> dict:
        found = {"private": self.private, "source": self.source}
        if self.private:
            found.update(epsilon=None if math.isinf(self.epsilon) else self.epsilon, delta=self.delta,
                         dataset=self.dataset, data_files=json.loads(self.data_files) if self.data_files else None,
                         events=[list(e) for e in self.events] if self.events else None, accountant=self.accountant)
        return found

    def words(self) -> str:
        if not self.private:
            return f"public: {self.source}"
        if math.isinf(self.epsilon):
            return f"trained on {self.dataset} without differential privacy ({self.source}): no epsilon covers it"
        return f"private: covered by epsilon = {self.epsilon:.4g}, delta = {self.delta:g} on {self.dataset} ({self.source})"


ASSUMED_PUBLIC = "assumed public: its file carries no privacy statement (model.init_covered_by declares one)"


def checkpoint_provenance(path: str, declared) -> Provenance:
    """The checkpoint's privacy: its file's own statement (dpgrid's release metadata, or an export's), or what
    `declared` (model.init_covered_by) says, or public by assumption. DpgridError where the two contradict."""
    statement = file_statement(path)
    if statement is not None:
        if declared is not None:
            raise DpgridError(f"model.init_covered_by={declared!r}, but {path} carries dpgrid's own statement of what "
                              "covers it (its metadata): that statement stands; remove model.init_covered_by")
        covered = statement.get("covered_by")
        privacy = statement.get("privacy") or {}
        events = statement.get("events")
        return Provenance(True, "the statement in its metadata, written when dpgrid released it",
                          epsilon=float(covered["epsilon"]) if covered else math.inf,
                          delta=float(covered["delta"]) if covered else 0.0, dataset=str(statement.get("dataset")),
                          data_files=json.dumps(statement.get("data_files"), sort_keys=True),
                          events=tuple(tuple(e) for e in events) if events else None,
                          accountant=privacy.get("accountant"))
    if declared is None:
        return Provenance(False, ASSUMED_PUBLIC)
    if declared == "public":
        return Provenance(False, "declared public (model.init_covered_by=public)")
    return Provenance(True, "declared (model.init_covered_by)", epsilon=float(declared["epsilon"]),
                      delta=float(declared["delta"]), dataset=str(declared["dataset"]))


def file_statement(path: str):
    """The statement a .safetensors file's metadata holds under "dpgrid" (a release's, or an export's), or None."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "np") as f:
            text = (f.metadata() or {}).get("dpgrid")
    except (SafetensorError, OSError, ValueError):
        return None  # not a safetensors file: refused where the checkpoint is read
    try:
        statement = json.loads(text) if text else None
    except ValueError:
        raise DpgridError(f"model.init: {path} has a dpgrid statement in its metadata that is not JSON (damaged or "
                          "edited): its privacy cannot be read") from None
    if statement is not None and not (isinstance(statement, dict) and "covered_by" in statement
                                      and isinstance(statement.get("covered_by"), (dict, type(None)))):
        raise DpgridError(f"model.init: {path}'s dpgrid statement has no covered_by: its privacy cannot be read")
    return statement


def release_cover(covered: dict, events, accountant: str, provenance: Provenance, dataset: str, data_files) -> tuple:
    """(what covers a release of a grid that started from a checkpoint, the checkpoint's part in words and figures):
    `covered` the grid's own {epsilon, delta}, `events` its own steps, `data_files` its data's fingerprint. The same
    data (the same files): both mechanisms compose, by the accountant where both record their steps, else epsilons
    and deltas added; other data: the grid's own epsilon for its data, the checkpoint's for its own, and their
    composition for anyone in both."""
    if provenance is None or not provenance.private or covered is None:
        return covered, None
    if provenance.data_files is not None:  # the same files, byte for byte
        same = json.loads(provenance.data_files) == json.loads(json.dumps(data_files, sort_keys=True))
    else:  # declared by a dataset's name
        same = provenance.dataset == dataset
    if math.isinf(provenance.epsilon):
        total, how = None, "none: the checkpoint was trained on its data without differential privacy"
    elif events and provenance.events and accountant in ("rdp", "pld"):
        from dpgrid.privacy.accountants import composed_epsilon

        total = {"epsilon": composed_epsilon([*provenance.events, *events], covered["delta"], accountant),
                 "delta": covered["delta"]}
        how = f"the {accountant} accountant over both grids' steps"
    else:
        total = {"epsilon": covered["epsilon"] + provenance.epsilon, "delta": covered["delta"] + provenance.delta}
        how = "basic composition (the epsilons and the deltas add)"
    part = {"checkpoint": provenance.to_dict(), "same_data": same, "composed": total, "composed_by": how,
            "this_grid": covered}
    if same:
        return total, part
    return covered, part


def checksum(source) -> str:
    """A checkpoint's SHA-256 (the grid's identity): of its file, read afresh, or of its bytes already read (the one
    digest both the plan and the run that loads the checkpoint compare)."""
    digest = hashlib.sha256()
    if isinstance(source, (bytes, bytearray, memoryview)):
        digest.update(source)
        return digest.hexdigest()
    with open(source, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
