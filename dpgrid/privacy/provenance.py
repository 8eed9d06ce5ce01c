"""What covers a checkpoint (model.init): its privacy travels with it.

dpgrid's own release carries its statement in its metadata (what covers it, the dataset's config name, and the
Poisson-subsampled Gaussian steps that spent it). A grid fine-tuned from it is a second mechanism, and dpgrid cannot
tell from anything public whether its data shares examples with the checkpoint's (a digest of the training files
would tell, but releasing one is itself a disclosure: it differs between any two neighbouring datasets). So the two
are composed unless the user declares them disjoint (`model.init_disjoint=true`): a checkpoint's epsilon is never
dropped without the user's word (`release_cover`: composed by the accountant where both record their steps, else by
basic composition, epsilons and deltas added). Declared disjoint, each dataset is named with its own epsilon, and their
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
    """What covers a checkpoint's weights: `private` (epsilon and delta on `dataset`, a dataset's config name;
    `events`: the (sample rate, noise multiplier, steps) its epsilon composes, where its statement records them;
    epsilon = inf for a model trained on its data without differential privacy) or not; `source`: where that is
    known from. A statement of an earlier release may hold a fingerprint of its training files: it is never read."""
    private: bool
    source: str
    epsilon: float = None
    delta: float = None
    dataset: str = None
    events: tuple = None
    accountant: str = None

    def to_dict(self) -> dict:
        found = {"private": self.private, "source": self.source}
        if self.private:
            found.update(epsilon=None if math.isinf(self.epsilon) else self.epsilon, delta=self.delta,
                         dataset=self.dataset, events=[list(e) for e in self.events] if self.events else None, accountant=self.accountant)
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


@dataclass(frozen=True)
class ReleaseCover:
    """What covers a grid's release: `covered` ({epsilon, delta}, or None where no epsilon does), the Poisson-subsampled
    Gaussian steps whose composition it is (`events`, or None), and, where the grid started from a private checkpoint,
    `checkpoint`: that part in words and figures (model.json's `checkpoint`)."""
    covered: dict = None
    events: list = None
    checkpoint: dict = None


def release_cover(spec) -> ReleaseCover:
    """What covers the release of the compiled grid `spec`: its own epsilon with seeds, composed with a private
    checkpoint's unless the user declared the two datasets disjoint (model.init_disjoint), by the accountant where
    both record their steps, else epsilons and deltas added. Declared disjoint: the grid's own epsilon for its data,
    the checkpoint's for its own, and their composition for anyone in both."""
    plan, start = spec.plan, spec.start
    private = plan.private and plan.epsilon_spent is not None
    covered = {"epsilon": plan.epsilon_with_seeds, "delta": plan.delta} if private else None
    events = plan.method.released_steps(plan) if private else None
    provenance = start.init_provenance
    if provenance is None or not provenance.private or covered is None:
        return ReleaseCover(covered, events)
    if math.isinf(provenance.epsilon):
        total, how = None, "none: the checkpoint was trained on its data without differential privacy"
    elif events and provenance.events and plan.accountant in ("rdp", "pld"):
        from dpgrid.privacy.accountants import composed_epsilon

        total = {"epsilon": composed_epsilon([*provenance.events, *events], covered["delta"], plan.accountant),
                 "delta": covered["delta"]}
        how = f"the {plan.accountant} accountant over both grids' steps"
    else:
        total = {"epsilon": covered["epsilon"] + provenance.epsilon, "delta": covered["delta"] + provenance.delta}
        how = "basic composition (the epsilons and the deltas add)"
    composed = not start.init_disjoint
    if not composed:
        basis = "declared disjoint by the user (model.init_disjoint=true)"
    elif provenance.dataset == plan.dataset:
        basis = f"the checkpoint was trained on {plan.dataset} too"
    else:
        basis = (f"the checkpoint was trained on {provenance.dataset}, this grid on {plan.dataset}: nothing public "
                 "tells whether they share examples (model.init_disjoint=true declares they do not)")
    part = {"checkpoint": provenance.to_dict(), "same_data": composed, "why": basis, "composed": total,
            "composed_by": how, "this_grid": covered}
    if not composed:
        return ReleaseCover(covered, None, part)
    chained = [*[list(e) for e in provenance.events], *events] if (
        total is not None and events and provenance.events and how.startswith("the ")) else None
    return ReleaseCover(total, chained, part)


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
