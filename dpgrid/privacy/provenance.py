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
    """What covers a checkpoint's weights: `private` or not, `source`: where that is known from, and `accounts`: each
    group of examples whose privacy its training spent, as {dataset: a dataset's config name, epsilon (None: trained
    on them without differential privacy), delta, events: the [sample rate, noise multiplier, steps] its epsilon
    composes (None where not recorded)}, one per dataset its chain of fine-tunings declared disjoint, one where they
    were composed. `epsilon`, `delta`, `dataset`, `events`: those of anyone in every account (the events chained, the
    epsilons and deltas added where they cannot be; inf where one account has no epsilon). A statement of an earlier
    release may hold a fingerprint of its training files: it is never read."""
    private: bool
    source: str
    accounts: tuple = ()
    accountant: str = None
    config_hash: str = None  # of the grid that released it, where its statement says (the study's ledger holds it)

    @property
    def epsilon(self) -> float:
        epsilons = [a["epsilon"] for a in self.accounts]
        return math.inf if any(e is None for e in epsilons) else float(sum(epsilons))

    @property
    def delta(self) -> float:
        return float(sum(a["delta"] or 0.0 for a in self.accounts))

    @property
    def dataset(self) -> str:
        return " + ".join(dict.fromkeys(str(a["dataset"]) for a in self.accounts))

    @property
    def events(self):
        if not self.accounts or any(not a.get("events") for a in self.accounts):
            return None
        return tuple(tuple(e) for a in self.accounts for e in a["events"])

    def to_dict(self) -> dict:
        found = {"private": self.private, "source": self.source}
        if self.private:
            found.update(epsilon=None if math.isinf(self.epsilon) else self.epsilon, delta=self.delta,
                         dataset=self.dataset, events=[list(e) for e in self.events] if self.events else None,
                         accountant=self.accountant, accounts=[dict(a) for a in self.accounts])
        return found

    def words(self) -> str:
        if not self.private:
            return f"public: {self.source}"
        if math.isinf(self.epsilon):
            return f"trained on {self.dataset} without differential privacy ({self.source}): no epsilon covers it"
        if len(self.accounts) > 1:
            return (f"private: " + "; ".join(f"epsilon = {a['epsilon']:.4g}, delta = {a['delta']:g} on {a['dataset']}"
                                             for a in self.accounts) + f", declared disjoint ({self.source})")
        return f"private: covered by epsilon = {self.epsilon:.4g}, delta = {self.delta:g} on {self.dataset} ({self.source})"


ASSUMED_PUBLIC = "assumed public: its file carries no privacy statement (model.init_covered_by declares one)"


def account(dataset, covered, events) -> dict:
    """One account: `covered` {epsilon, delta} or None (no epsilon), on `dataset`, spent by `events`."""
    return {"dataset": None if dataset is None else str(dataset),
            "epsilon": None if covered is None else float(covered["epsilon"]),
            "delta": 0.0 if covered is None else float(covered["delta"]),
            "events": [list(e) for e in events] if events else None}


def statement_accounts(path, statement: dict) -> tuple:
    """The accounts a dpgrid statement records: its own `accounts`, or, for a statement an earlier dpgrid wrote, its
    one cover, or its cover and its checkpoint's where it was fine-tuned on data it said were other (an export holds
    both); DpgridError where an earlier statement says so without its checkpoint's figures (a model/ weights file)."""
    if isinstance(statement.get("accounts"), list) and statement["accounts"]:
        return tuple(account(a.get("dataset"), None if a.get("epsilon") is None else a, a.get("events"))
                     for a in statement["accounts"])
    own = account(statement.get("dataset"), statement.get("covered_by"), statement.get("events"))
    part = statement.get("checkpoint")
    if isinstance(part, dict) and part.get("same_data") is False:
        earlier = part.get("checkpoint") or {}
        return (account(earlier.get("dataset"), earlier if earlier.get("epsilon") is not None else None,
                        earlier.get("events")), own)
    if "fine-tuned from a private checkpoint" in str(statement.get("why")) and "other data" in str(statement.get("why")):
        raise DpgridError(f"model.init: {path} was released by an earlier dpgrid, fine-tuned on other data than its "
                          "checkpoint's, and its metadata does not carry the checkpoint's epsilon; start from its "
                          "export instead (dpgrid model RUN_DIR --out FILE), which does")
    return (own,)


def checkpoint_provenance(path: str, declared) -> Provenance:
    """The checkpoint's privacy: its file's own statement (dpgrid's release metadata, or an export's), or what
    `declared` (model.init_covered_by) says, or public by assumption. DpgridError where the two contradict."""
    statement = file_statement(path)
    if statement is not None:
        if declared is not None:
            raise DpgridError(f"model.init_covered_by={declared!r}, but {path} carries dpgrid's own statement of what "
                              "covers it (its metadata): that statement stands; remove model.init_covered_by")
        privacy = statement.get("privacy") or {}
        return Provenance(True, "the statement in its metadata, written when dpgrid released it",
                          statement_accounts(path, statement), privacy.get("accountant"),
                          statement.get("config_hash") if isinstance(statement.get("config_hash"), str) else None)
    if declared is None:
        return Provenance(False, ASSUMED_PUBLIC)
    if declared == "public":
        return Provenance(False, "declared public (model.init_covered_by=public)")
    return Provenance(True, "declared (model.init_covered_by)", (account(declared["dataset"], declared, None),))


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
    Gaussian steps whose composition it is (`events`, or None), where the grid started from a private checkpoint,
    `checkpoint`: that part in words and figures (model.json's `checkpoint`), and `accounts`: what a model fine-tuned
    from the release composes with (Provenance.accounts; None where no epsilon covers it)."""
    covered: dict = None
    events: list = None
    checkpoint: dict = None
    accounts: list = None


def release_cover(spec) -> ReleaseCover:
    """What covers the release of the compiled grid `spec`: its own epsilon with seeds, composed with every account of
    a private checkpoint unless the user declared the two datasets disjoint (model.init_disjoint), by the accountant
    where every account records its steps, else epsilons and deltas added. Declared disjoint: the grid's own epsilon
    for its data, the checkpoint's accounts for theirs (carried on, so that a later fine-tuning composes them), and the
    composition of all for anyone in all."""
    plan, start = spec.plan, spec.start
    private = plan.private and plan.epsilon_spent is not None
    covered = {"epsilon": plan.epsilon_with_seeds, "delta": plan.delta} if private else None
    events = plan.method.released_steps(plan) if private else None
    own = account(plan.dataset, covered, events)
    provenance = start.init_provenance
    if provenance is None or not provenance.private or covered is None:
        return ReleaseCover(covered, events, None, [own] if covered is not None else None)
    total, how = composed_accounts([*provenance.accounts, own], plan.delta, plan.accountant)
    composed = not start.init_disjoint
    if not composed:
        basis = "declared disjoint by the user (model.init_disjoint=true)"
    elif provenance.dataset == plan.dataset:
        basis = f"the checkpoint was trained on {plan.dataset} too"
    else:
        basis = (f"the checkpoint was trained on {provenance.dataset}, this grid on {plan.dataset}: nothing public "
                 "tells whether they share examples (model.init_disjoint=true declares they do not)")
    covered_all = None if total["epsilon"] is None else {"epsilon": total["epsilon"], "delta": total["delta"]}
    part = {"checkpoint": provenance.to_dict(), "declared_disjoint": not composed, "why": basis,
            "composed": covered_all, "composed_by": how, "this_grid": covered}
    if not composed:
        return ReleaseCover(covered, None, part, [*[dict(a) for a in provenance.accounts], own])
    return ReleaseCover(covered_all, total["events"], part, [total])


def composed_accounts(accounts: list, delta: float, accountant: str) -> tuple:
    """(the account of anyone in every one of `accounts`, how it was composed): by the accountant (rdp or pld) over
    every account's steps where each records them, at `delta`; else basic composition (epsilons and deltas added);
    no epsilon where one account has none."""
    dataset = " + ".join(dict.fromkeys(str(a["dataset"]) for a in accounts))
    if any(a["epsilon"] is None for a in accounts):
        return ({"dataset": dataset, "epsilon": None, "delta": 0.0, "events": None},
                "none: the checkpoint was trained on its data without differential privacy")
    if all(a.get("events") for a in accounts) and accountant in ("rdp", "pld"):
        from dpgrid.privacy.accountants import composed_epsilon

        steps = [e for a in accounts for e in a["events"]]
        return ({"dataset": dataset, "epsilon": composed_epsilon(steps, delta, accountant), "delta": delta,
                 "events": [list(e) for e in steps]}, f"the {accountant} accountant over every grid's steps")
    return ({"dataset": dataset, "epsilon": sum(a["epsilon"] for a in accounts),
             "delta": sum(a["delta"] for a in accounts), "events": None},
            "basic composition (the epsilons and the deltas add)")


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
