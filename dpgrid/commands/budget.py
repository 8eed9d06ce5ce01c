"""`dpgrid budget`: what the study has spent on each dataset (dpgrid.results.study), and `--forget`, the one way to
take grids out of it."""

import json
import math
import sys
from pathlib import Path

from dpgrid import DpgridError

USAGE = ("usage: dpgrid budget [--dataset NAME] [--data KEY] [--study NAME] [--since DATE] [--delta D] [--ledger DIR] "
         "[--json]\n"
         "       dpgrid budget --forget [--dataset NAME] [--data KEY] [--study NAME] [--before DATE] [--ledger DIR]")
HELP = f"""{USAGE}

Every grid that trains on a dataset is entered in that dataset's ledger on this machine (a private working file,
never released): what it spends there (its release's epsilon and delta, and its steps), when, its run directory and
command. `dpgrid budget` lists them per dataset and composes them: by Opacus's RDP accountant and by dp-accounting's
PLD accountant over every grid's steps, at delta D (default: the largest delta of the grids shown; grids whose steps
are not recorded, a selection's, add their epsilon and delta), the study's whole cost on those data. A grid trained
without differential privacy makes it infinite.

  --dataset NAME   only the datasets of this config name
  --data KEY       only the data of this local identity (the folder dpgrid budget names beside a dataset)
  --study NAME     only the grids of this study (privacy.study=NAME when they ran; a study budget counts every grid
                   on the data, whatever its study)
  --since DATE     only the grids entered on or after DATE (YYYY-MM-DD)
  --delta D        compose at this delta
  --ledger DIR     the ledger's folder (default: privacy.study_ledger's: $DPGRID_LEDGER, else the user's data folder)
  --json           one JSON object
  --forget         take the chosen grids out of the ledger, saying which (their spending is no longer composed:
                   the data were used all the same); with --before DATE, only those entered before DATE; a damaged
                   entry is forgotten with its data's other entries when --data KEY (or nothing) chooses them

privacy.study_budget=EPS refuses, before it trains, a grid that would take its study past EPS on its dataset.
The ledger cannot see data copied under another fingerprint (edited or converted files) or grids run elsewhere."""


def taken(args: list, flag: str):
    if flag not in args:
        return None
    at = args.index(flag)
    if at + 1 >= len(args) or args[at + 1].startswith("--"):
        raise DpgridError(f"{flag} needs a value; {USAGE.splitlines()[0]}")
    value = args[at + 1]
    del args[at:at + 2]
    return value


def date(value: str, flag: str) -> str:
    import datetime

    try:
        return datetime.date.fromisoformat(value).isoformat()
    except ValueError:
        raise DpgridError(f"{flag} {value!r} is not a date; give YYYY-MM-DD") from None


def budget_command(args: list) -> None:
    from dpgrid.results.study import accounts_of, composed, ledger_root, read_entries

    if {"-h", "--help"} & set(args):
        print(HELP)
        return
    args = list(args)
    forget, as_json = "--forget" in args, "--json" in args
    args = [a for a in args if a not in ("--forget", "--json")]
    dataset, data, study, since, before, delta, ledger = (taken(args, f) for f in (
        "--dataset", "--data", "--study", "--since", "--before", "--delta", "--ledger"))
    if args:
        raise DpgridError(f"dpgrid budget takes no {args[0]!r}; {USAGE.splitlines()[0]}")
    since, before = (date(v, f) if v else None for v, f in ((since, "--since"), (before, "--before")))
    if before and not forget:
        raise DpgridError("--before chooses what --forget forgets; to show grids from a date on, use --since")
    if delta is not None:
        try:
            delta = float(delta)
        except ValueError:
            delta = -1.0
        if not 0 < delta < 1:
            raise DpgridError(f"--delta must be in (0, 1), got {delta!r}")
    root = ledger_root(ledger)
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    chosen = []
    unfiltered = dataset is None and study is None and since is None and before is None
    for folder in [f for f in folders if data is None or f.name == data]:
        entries = [e for e in read_entries(folder, damaged_too=forget)
                   if (e.get("damaged") and unfiltered) or not e.get("damaged") and
                   (dataset is None or e.get("dataset") == dataset) and (study is None or e.get("study") == study)
                   and (since is None or e.get("when", "")[:10] >= since)
                   and (before is None or e.get("when", "")[:10] < before)]
        if entries:
            chosen.append((folder, entries))
    if forget:
        forgot(chosen, root)
        return
    report = []
    for folder, entries in chosen:
        at = delta or max((e["delta"] for e in entries if e.get("delta")), default=1e-5)
        total = composed(accounts_of(entries), at)
        report.append({"dataset": entries[0]["dataset"], "data": folder.name, "grids": entries, "composed": total})
    if as_json:
        print(json.dumps({"ledger": str(root), "datasets": report}, indent=2, default=str))
        return
    if not report:
        print(f"no grid in the ledger {root}" + (" that matches" if dataset or study or since else ""))
        return
    for found in report:
        print(f"{found['dataset']} (data {found['data']}): {len(found['grids'])} grid(s) in {root}")
        for e in found["grids"]:
            spent = "no epsilon (not differentially private)" if e.get("epsilon") is None else \
                f"epsilon = {e['epsilon']:.4g}, delta = {e['delta']:g}"
            checkpoint = " (+ its checkpoint's spending)" if e.get("checkpoint") else ""
            print(f"  {e.get('when', '?')[:16].replace('T', ' ')}  {e.get('strategy')}  {spent}{checkpoint}"
                  f"{'  study ' + e['study'] if e.get('study') else ''}\n    {e.get('grid')}\n    {e.get('command')}")
        total = found["composed"]
        rdp = "inf" if math.isinf(total["rdp"]) else f"{total['rdp']:.4g}"
        pld = "" if total["pld"] is None else (", inf (PLD)" if math.isinf(total["pld"]) else
                                               f", {total['pld']:.4g} (PLD, dp-accounting)")
        print(f"  composed, every grid above together: epsilon = {rdp} (RDP, Opacus){pld} at delta = "
              f"{total['delta']:g}")


def forgot(chosen: list, root: Path) -> None:
    """Take the chosen entries out of the ledger, saying which."""
    from dpgrid.results.files import environment
    from dpgrid.results.study import locked_dataset

    if not chosen:
        print(f"nothing to forget in the ledger {root}: no grid matches")
        return
    for folder, entries in chosen:
        with locked_dataset(folder):
            for e in entries:
                with environment(folder / e["file"]):
                    (folder / e["file"]).unlink(missing_ok=True)
        named = next((e["dataset"] for e in entries if not e.get("damaged")), "its dataset")
        print(f"forgot {len(entries)} grid(s) on {named} (data {folder.name}): "
              + "; ".join(f"{e.get('when', '?')[:10]} {e.get('grid')}" if not e.get("damaged") else
                          f"the damaged entry {e['file']}" for e in entries)
              + ". Their spending is no longer composed by dpgrid budget or privacy.study_budget; the data were used "
                "all the same.", file=sys.stdout)
