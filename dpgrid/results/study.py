"""The study's whole cost: every grid that trains on a dataset is entered in that dataset's ledger, and the ledger
composes them (`dpgrid budget`; privacy.study_budget refuses a grid that would take it past a budget).

dpgrid's epsilon covers one grid. A study is many grids on the same private data (a sweep of strategies and
epsilons, a grid run again with other settings, a fine-tuning), and choosing among them is one more use of the data:
what the study as a whole spent on a dataset is the composition of every grid that trained on it. On public benchmark
data that total is information; on private data it is the guarantee.

The ledger is a private working file, on this machine, never released: a folder (privacy.study_ledger; by default
$DPGRID_LEDGER, else $XDG_DATA_HOME/dpgrid/ledger, else ~/.local/share/dpgrid/ledger) with one folder per dataset,
named by the dataset's local identity (a digest of its files' fingerprint, as a run directory's resume check knows
them; of its loader and arguments where it reads no file: scikit-learn's bundled sets), and in it one JSON file per
grid (`entry`): what it spends on the dataset (its release's epsilon and delta, and the Poisson-subsampled Gaussian
steps that compose to it, where it records them), when it was first entered, its run directory, command, config hash
and study name, and, where it was fine-tuned from a private checkpoint whose data may share examples with these, the
checkpoint's accounts. An entry is written before the grid trains (a grid killed halfway has spent what it trained,
and is counted whole), by write-then-rename, named by what makes it one release (`entry_of`): a resumed grid, the jobs
of a grid split with grid.only, a seeded grid run again in another folder (the same runs) write the same entry once;
a secure grid's new release (its noise drawn anew) and another audit write another. Concurrent grids (a sweep, SLURM
jobs) write different files, under a lock (flock) on the dataset's folder, so that a study budget's check and the
entry it admits are one step and no entry is lost. What it cannot see: the same data copied under another fingerprint (edited files,
another format), and grids run on other machines (their ledgers are theirs).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.results.files import environment, write_json

ENTRY = "entry-*.json"


def ledger_root(setting=None) -> Path:
    """Where the ledger lives: privacy.study_ledger where set, else $DPGRID_LEDGER, else the user's data folder."""
    if setting:
        return Path(os.path.expanduser(str(setting)))
    if os.environ.get("DPGRID_LEDGER"):
        return Path(os.path.expanduser(os.environ["DPGRID_LEDGER"]))
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "dpgrid" / "ledger"


def training_files(data_files: dict, train_files) -> dict:
    """The fingerprint of the files that hold the training split (a loader's `Data.train_files`; all of them where it
    does not say): what the ledger keys the data by, whatever public files are read beside them."""
    return {name: data_files[name] for name in train_files} if train_files else dict(data_files)


def data_identity(dataset, data_files: dict, n_train: int) -> str:
    """The dataset's local identity: a digest of its training files' contents (their SHA-256s, whatever their names or
    folders: a copy of the same bytes, or another dataset config reading them, is the same data), or, where the loader
    reads no file, of its loader, arguments and N."""
    if data_files:
        basis = {"files": sorted(f["sha256"] for f in data_files.values())}
    else:
        basis = {"loader": dataset.load.target, "arguments": json.loads(json.dumps(dict(dataset.load.arguments),
                                                                                    default=str)), "n_train": n_train}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def entry_of(spec, out: Path, data_files: dict, command: str = None) -> dict:
    """What the grid in `out` spends on its dataset, as its ledger entry."""
    from dpgrid.privacy.provenance import release_cover

    from dpgrid.data import tasks
    from dpgrid.results import ledger

    plan = spec.plan
    cover = release_cover(spec)
    # a task whose own figures are computed from the private data (the PUR track's): no epsilon covers its release
    private = plan.private and plan.epsilon_spent is not None and not tasks.get(spec.dataset.task).disclosure
    own = {"epsilon": plan.epsilon_with_seeds, "delta": plan.delta} if private else None
    checkpoint = None
    provenance = spec.start.init_provenance
    if provenance is not None and provenance.private and not spec.start.init_disjoint:
        checkpoint = {"config_hash": provenance.config_hash, "accounts": [dict(a) for a in provenance.accounts]}
    # What makes two grids one release: a seeded grid's runs follow from public names, so the same config (and seed
    # count) trains the same runs wherever it runs, and spends once; a secure grid's each release draws new noise
    # (its ledger's release id); an audit's canaries are its seed's.
    release = [spec.config_hash, plan.seeds, ledger.release_id(out) if ledger.kept(spec) else "",
               getattr(spec.observer, "seed", "")]
    return {"dataset": plan.dataset, "data": data_identity(spec.dataset, data_files, plan.n_train),
            "release": release,
            "study": spec.study.name, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "grid": str(Path(out).absolute()), "command": command or " ".join(["dpgrid", *sys.argv[1:]]),
            "config_hash": spec.config_hash, "strategy": plan.strategy, "selection": plan.selection,
            "accountant": plan.accountant, "epsilon": None if own is None else own["epsilon"],
            "delta": None if own is None else own["delta"],
            "events": [list(e) for e in plan.method.released_steps(plan)] if private and
            plan.method.released_steps(plan) else None,
            "private": bool(private), "checkpoint": checkpoint, "covered_by": cover.covered}


def entry_name(entry: dict) -> str:
    """A grid's entry's file name, from what makes it one release (entry_of): a resumed grid, a split one's jobs, a
    seeded grid run again elsewhere write the same; a secure grid's new release, another audit, another."""
    return "entry-" + hashlib.sha256(json.dumps(entry["release"]).encode()).hexdigest()[:16] + ".json"


@contextmanager
def locked_dataset(folder: Path):
    """An exclusive lock on a dataset's ledger folder (flock: the kernel releases it when its holder dies)."""
    import fcntl

    with environment(folder):
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def read_entries(folder: Path, damaged_too: bool = False) -> list:
    """The entries of one dataset's folder, oldest first; a damaged entry is named in one line (`damaged_too`: kept,
    as {"file", "damaged": True}, for --forget)."""
    entries = []
    for path in sorted(Path(folder).glob(ENTRY)):
        try:
            entry = json.loads(path.read_text())
            if isinstance(entry, dict) and "release" not in entry and "config_hash" in entry and "grid" in entry:
                entry["release"] = [entry["config_hash"], entry["grid"]]  # an earlier dpgrid's entry: one per directory
            if not isinstance(entry, dict) or not isinstance(entry.get("release"), list):
                raise ValueError("not an entry")
        except (OSError, ValueError):
            if damaged_too:
                entries.append({"file": path.name, "damaged": True, "when": ""})
                continue
            raise DpgridError(f"{path} is damaged (not the JSON dpgrid wrote): the study's ledger cannot compose it; "
                              f"restore it from a copy, or forget it (dpgrid budget --forget --data {Path(folder).name})"
                              ) from None
        entries.append({**entry, "file": path.name})
    return sorted(entries, key=lambda e: (e.get("when", ""), e["file"]))


def accounts_of(entries: list) -> list:
    """What the entries spend together: each grid's own ({epsilon, delta, events}, epsilon None where no epsilon
    covers it) and each checkpoint's accounts whose grid the ledger does not hold already (by config hash)."""
    held = {e["config_hash"] for e in entries}
    accounts = [{"epsilon": e["epsilon"], "delta": e["delta"] or 0.0, "events": e["events"],
                 "grid": e["grid"]} for e in entries]
    for e in entries:
        checkpoint = e.get("checkpoint")
        if checkpoint and checkpoint.get("config_hash") not in held:
            accounts += [{"epsilon": a["epsilon"], "delta": a["delta"] or 0.0, "events": a.get("events"),
                          "grid": f"the checkpoint of {e['grid']}"} for a in checkpoint["accounts"]]
            held.add(checkpoint.get("config_hash"))
    return accounts


def composed(accounts: list, delta: float) -> dict:
    """The composition of `accounts` at `delta`: {"rdp": epsilon by Opacus's RDP accountant, "pld": by dp-accounting's
    PLD accountant, "delta": delta plus the deltas of accounts that record no steps (added, with their epsilons: basic
    composition)}; an epsilon is inf where an account has none, and "pld" is None where PLD cannot compose them (an
    account without steps)."""
    if any(a["epsilon"] is None for a in accounts):
        return {"rdp": math.inf, "pld": math.inf, "delta": delta, "grids": len(accounts)}
    steps = [e for a in accounts if a.get("events") for e in a["events"]]
    basic = [a for a in accounts if not a.get("events")]
    added_epsilon, added_delta = sum(a["epsilon"] for a in basic), sum(a["delta"] for a in basic)
    found = {"delta": delta + added_delta, "grids": len(accounts)}
    if not steps:
        return {**found, "rdp": added_epsilon, "pld": added_epsilon if not basic else None}
    from dpgrid.privacy.accountants import composed_epsilon

    found["rdp"] = composed_epsilon(steps, delta, "rdp") + added_epsilon
    found["pld"] = composed_epsilon(steps, delta, "pld") + added_epsilon if not basic else None
    return found


@contextmanager
def entering(spec, out: Path, data_files: dict):
    """Around the first writes of the grid in `out`: under its dataset folder's lock, privacy.study_budget's check
    before (a DpgridError in one line where the grid would take the study past its budget: nothing is written), the
    grid's entry in its dataset's ledger after, once (a resumed grid keeps the entry it has): the check and the entry
    it admits are one step for concurrent grids."""
    entry = entry_of(spec, out, data_files)
    folder = ledger_root(spec.study.ledger) / entry["data"]
    with locked_dataset(folder):
        entries = [e for e in read_entries(folder) if e["file"] != entry_name(entry)]
        budget = spec.study.budget
        if budget is not None:  # every grid the ledger holds on these data: only dpgrid budget --forget scopes it
            delta = spec.plan.delta if spec.plan.private else 1e-5
            before = composed(accounts_of(entries), delta) if entries else {"rdp": 0.0, "delta": delta}
            after = composed(accounts_of([*entries, entry]), delta)
            if after["rdp"] > budget:
                spent = f"{before['rdp']:.4g}" if math.isfinite(before["rdp"]) else "inf (a grid without differential privacy)"
                raise DpgridError(
                    f"privacy.study_budget={budget:g}: {len(entries)} grid(s) on {entry['dataset']} have spent epsilon "
                    f"= {spent} (delta = {before['delta']:g}; the study's ledger: dpgrid budget); this grid would take "
                    f"it to {after['rdp']:.4g} (delta = {after['delta']:g}), past the budget "
                    f"({max(0.0, budget - before['rdp']):.4g} left); nothing was written")
        yield
        path = folder / entry_name(entry)
        if not path.exists():  # a resumed grid (or another job of a split one): entered once, when it was first
            write_json(path, entry)


def enter(spec, out: Path, data_files: dict) -> None:
    """The grid's entry in its dataset's ledger, after the study budget's check (entering, with nothing around)."""
    with entering(spec, out, data_files):
        pass
