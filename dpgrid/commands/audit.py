"""`dpgrid audit OVERRIDES`: the grid those overrides configure, run once more with m canaries each included by a
secret coin, and a measured lower bound on epsilon beside the epsilon its plan claims (docs/audit.md).

    dpgrid audit strategy=fixed_threshold privacy.epsilon=1 [--canaries 1000] [--threat white_box|black_box]
                 [--confidence 0.95] [--seed S] [hydra.run.dir=DIR]

The grid trains in the audit's own directory (hydra.run.dir, by default audits/ mirroring outputs/), never in another
run directory; what it releases (the released configuration's models; a selection's chosen candidate's) is all the
canaries are scored on. The result is audit.json there and one line on the console.
"""

import json
import math
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.audit.verdict import summary_line, verdict_line
from dpgrid.results.files import write_json

OPTIONS = {"--canaries": int, "--threat": str, "--confidence": float, "--seed": int}
DEFAULTS = {"--canaries": 1000, "--threat": "white_box", "--confidence": 0.95, "--seed": None}


def parse(args: list) -> tuple:
    """({option: value}, the Hydra overrides)."""
    options, overrides, rest = dict(DEFAULTS), [], list(args)
    while rest:
        arg = rest.pop(0)
        name, _, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in OPTIONS:
            if not value:
                if not rest:
                    raise DpgridError(f"dpgrid audit: {name} needs a value")
                value = rest.pop(0)
            try:
                options[name] = OPTIONS[name](value)
            except ValueError:
                raise DpgridError(f"dpgrid audit: {name} must be {OPTIONS[name].__name__}, got {value!r}") from None
        elif arg.startswith("-"):
            raise DpgridError(f"dpgrid audit: unknown option {arg}; valid: {', '.join(OPTIONS)} and Hydra overrides")
        else:
            overrides.append(arg)
    from dpgrid.audit.canaries import THREATS

    if options["--threat"] not in THREATS:
        raise DpgridError(f"dpgrid audit: --threat must be one of {', '.join(THREATS)}, got {options['--threat']!r}")
    if options["--canaries"] < 20:
        raise DpgridError(f"dpgrid audit: --canaries must be at least 20, got {options['--canaries']}")
    if options["--seed"] is not None and options["--seed"] < 0:
        raise DpgridError(f"dpgrid audit: --seed must be a whole number >= 0, got {options['--seed']}")
    if not 0.5 <= options["--confidence"] < 1:
        raise DpgridError(f"dpgrid audit: --confidence must be in [0.5, 1), got {options['--confidence']}")
    return options, overrides


MARKER = ".dpgrid-audit"  # written first into an audit's directory: what marks it as an audit's (never a folder's name)
OWN = (MARKER, "audit.json", "grid")  # everything an audit writes there


def audit_directory(run_dir: Path, given: bool, overwrite: bool, started: dict) -> tuple:
    """(hydra.run.dir as given, else the grid's run directory under audits/ instead of outputs/; the seed of an
    unfinished audit there that this command resumes, or None). Refused when it holds anything an audit did not write
    (an audit is recognised by its marker, and holds nothing but its marker, audit.json and its grid); an earlier
    audit is replaced with overwrite=true, an unfinished one of the same options resumed, else refused. `started`:
    what this audit's marker records (its options and overrides; the seed is added)."""
    import shutil

    out = run_dir if given else Path("audits", *(run_dir.parts[1:] if run_dir.parts[:1] == ("outputs",) else
                                                 run_dir.parts))
    if not out.exists() or not any(out.iterdir()):
        return out, None
    marker = out / MARKER
    try:
        earlier = json.loads(marker.read_text()) if marker.is_file() else None
    except (OSError, ValueError):
        earlier = None
    foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN)
    if not isinstance(earlier, dict) or foreign:
        raise DpgridError(f"{out} holds files that are not an audit's ({', '.join(foreign) or 'no audit marker'}): "
                          "dpgrid audit writes only into a directory of its own, and deletes only what it wrote there "
                          "(choose another hydra.run.dir)")
    unfinished = not (out / "audit.json").exists()
    same = {k: v for k, v in earlier.items() if k != "seed"} == started and isinstance(earlier.get("seed"), int)
    if unfinished and same and not overwrite:
        return out, earlier["seed"]  # stopped before it ended: the same command goes on with its seed
    if not overwrite:
        raise DpgridError(f"{out} holds {'an unfinished audit of other options' if unfinished else 'an earlier audit'}; "
                          "pass overwrite=true to replace it, or choose another hydra.run.dir")
    for name in OWN:  # what an audit wrote, and nothing else
        path = out / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    return out, None


HELP = ("usage: dpgrid audit [--canaries M] [--threat white_box|black_box] [--confidence C] [--seed S] [OVERRIDES...]\n\n"
        "the grid the overrides configure, run once more with M canaries (default 1000), each included by a secret "
        "coin, and a measured lower bound on epsilon beside the epsilon its plan claims (docs/audit.md); white_box "
        "(default): gradient canaries, the attacker sees every step; black_box: mislabelled test examples, the "
        "attacker sees the released model only; --confidence of the bound (default 0.95); --seed S repeats an audit's "
        "coins; the audit writes into its own directory (hydra.run.dir, default audits/...) and says in words "
        "whether the claim and the mechanism stand; it exits 1 when either does not: the bound exceeds the claimed "
        "epsilon (the claim is falsified), or the white box's mechanism test finds the noise, a canary's "
        "contribution, the sampling or the noise's shape differing from the plan; 0 when both stand, 2 on bad input")


def audit_command(args: list) -> int:
    if {"-h", "--help"} & set(args):  # before the imports: torch, the training loop and the bounds cost seconds
        print(HELP)
        return 0
    from dpgrid.audit.bound import audit_scores, fdp_scores
    from dpgrid.audit.mechanism import summary_line as mechanism_line
    from dpgrid.audit.canaries import AuditSpec, draw_coins
    from dpgrid.config import compile
    from dpgrid.config.compose import compose
    from dpgrid.data import load
    from dpgrid.runner import train

    options, overrides = parse(args)
    cfg = compose(overrides, with_hydra=True)
    checked = compile(cfg, plan=False)
    if checked.dataset.task not in ("classification", "reconstruction"):
        raise DpgridError(f"dpgrid audit audits DP-SGD grids (classification, reconstruction); dataset="
                          f"{checked.dataset.name} has task {checked.dataset.task}")
    m, threat = options["--canaries"], options["--threat"]
    data = load(checked.dataset, checked.data_root)
    if threat == "black_box" and m > len(data.x_test):
        raise DpgridError(f"dpgrid audit: --canaries={m} black-box canaries are drawn from the test split, which holds "
                          f"{len(data.x_test)}; ask for fewer")
    if not checked.strategy_cls.private:
        raise DpgridError(f"dpgrid audit measures what a private grid's epsilon claims: strategy={cfg.strategy.name} is "
                          "non-private (it claims none); audit a DP-SGD strategy")
    if checked.train.save_models == "none":
        raise DpgridError("dpgrid audit scores the canaries on what the grid releases: train.save_models=none "
                          "releases nothing")
    check_memory(m, threat, math.ceil(checked.train.epochs * data.n_train / checked.train.batch_size))
    started = {"canaries": m, "threat": threat, "confidence": options["--confidence"], "given_seed": options["--seed"],
               "overrides": overrides}
    out, resumed = audit_directory(Path(str(cfg.hydra.run.dir)), any(o.startswith("hydra.run.dir=") for o in overrides),
                                   bool(cfg.overwrite), started)
    seed = options["--seed"] if options["--seed"] is not None else resumed if resumed is not None else \
        secrets.randbits(62)
    coins = draw_coins(m, seed)
    spec = compile(cfg, data.n_train).announce()  # N the data's, whatever the coins: q, nu and N do not move with them
    if resumed is not None and threat == "white_box":
        check_traces(out, grid_runs(spec, out / "grid"))
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MARKER, {**started, "seed": seed})  # first: the directory is this audit's from now on
    spec = replace(spec, observer=AuditSpec(threat, m, coins, seed, spec.plan.sample_rate, spec.dataset.classes))
    start = time.perf_counter()
    from dpgrid.tracking import Place, audited

    place = Place(Path(str(cfg.hydra.sweep.dir)).absolute())  # a tracker's local store: beside the outputs
    train(spec, out / "grid", progress=True, tracked_from=place)
    runs = grid_runs(spec, out / "grid")
    scores, released = canary_scores(spec, out / "grid", data, runs)
    claimed = spec.plan.epsilon_with_seeds if spec.plan.private and spec.plan.epsilon_spent is not None else None
    confidence = options["--confidence"]
    nothing = {"epsilon_lower_bound": 0.0, "guesses": 0, "correct": 0, "tried": []}
    found = audit_scores(scores, coins, spec.plan.delta, confidence) if released else nothing
    estimated = fdp_scores(scores, coins, spec.plan.delta, confidence) if released else nothing
    record = {"epsilon_lower_bound": found["epsilon_lower_bound"], "epsilon_claimed": claimed,
              "delta": spec.plan.delta, "confidence": confidence, "canaries": m,
              "threat_model": threat, "included": int(sum(coins)), "guesses": found["guesses"],
              "correct": found["correct"], "tried": found["tried"],
              "epsilon_fdp": {k: estimated[k] for k in ("epsilon_lower_bound", "guesses", "correct", "tried")},
              "mechanism": mechanism(spec, out / "grid", runs, coins, data.n_train, confidence)
              if threat == "white_box" else None,
              "released_runs": released,
              "runs": len(runs), "strategy": spec.plan.strategy,
              "dataset": spec.plan.dataset, "selection": spec.plan.selection, "seed": seed,
              "seconds": round(time.perf_counter() - start, 1), "grid": str(out / "grid"), "overrides": overrides}
    write_json(out / "audit.json", record)
    audited(spec, out / "grid", record, place)  # its tracker's run of the grid (tracker=...): the bound and verdict
    print(summary_line(record))
    if record["mechanism"] is not None:
        print(mechanism_line(record["mechanism"]))
    falsified = claimed is not None and record["epsilon_lower_bound"] > claimed
    if falsified:
        print(f"dpgrid: warning: the measured lower bound exceeds the claimed epsilon: the claim is falsified at "
              f"{confidence:.0%} confidence", file=sys.stderr)
    print(verdict_line(record))
    return 1 if falsified or (record["mechanism"] or {}).get("verdict") == "differs" else 0


def grid_runs(spec, grid: Path):
    """The audited grid's runs.csv, read once (checked row by row, as every reader of a grid's rows:
    dpgrid.results.runs.read_runs) for the scores, the mechanism test and the count; empty where no run was committed."""
    import pandas as pd

    from dpgrid.results.runs import read_runs

    if not (grid / "runs.csv").exists():
        return pd.DataFrame()
    return read_runs(grid / "runs.csv", [c["config_id"] for c in spec.plan.configurations], spec.config_hash)


def mechanism(spec, grid: Path, runs, coins: tuple, n_train: int, confidence: float) -> dict:
    """The mechanism test (dpgrid.audit.mechanism) over every run the grid trained (`runs`: its runs.csv)."""
    from dpgrid.audit.mechanism import RunSteps, measure

    column = spec.strategy_cls.gradient_query or "noise_multiplier"
    steps = [RunSteps.load(grid / "audit" / f"{row.config_id}_seed{row.seed}_steps.npz", coins, getattr(row, column))
             for row in runs.itertuples()]
    return measure(steps, n_train, spec.plan.batch_size, spec.plan.sample_rate, confidence, spec.strategy_cls,
                   dict(spec.plan.per_query), poisson=spec.plan.sampling == "poisson")


def check_traces(out: Path, runs) -> None:
    """Refuse to resume an unfinished audit whose grid holds a run without this audit's trace of it: a grid trained by
    `dpgrid run`, or by an earlier dpgrid, beside the marker. The audit would otherwise score canaries that run never
    saw."""
    from dpgrid.audit.canaries import untraced

    found = untraced(out / "grid", runs)
    if found:
        raise DpgridError(f"{out} holds an unfinished audit (its marker {MARKER}, no audit.json) beside a grid whose "
                          f"{found}: that grid was not trained by this audit, or by an earlier dpgrid; pass "
                          "overwrite=true to run the audit afresh there, or choose another hydra.run.dir")


TRACE_BYTES = 40  # per canary and step: its and its control's moves kept in float32 (8), read in float64 (16 + 16)


def check_memory(canaries: int, threat: str, steps: int) -> None:
    """Refuse white-box canaries whose trace (each canary's and its control's move at every one of a run's steps) would not fit in
    half of the machine's available memory, naming how many would."""
    if threat != "white_box":
        return
    from dpgrid.training.stacked import available_memory

    import torch

    free = available_memory(torch.device("cpu")) // 2
    need = canaries * (steps + 1) * TRACE_BYTES
    if need > free:
        most = max(0, free // ((steps + 1) * TRACE_BYTES))
        raise DpgridError(f"dpgrid audit: --canaries={canaries} white-box canaries would keep {need / 2 ** 30:,.1f} GiB of "
                          f"trace over a run's T = {steps} steps, more than half of this machine's available memory "
                          f"({2 * free / 2 ** 30:,.1f} GiB): at most {most:,} canaries here")


def canary_scores(spec, grid: Path, data, runs) -> tuple:
    """(each canary's score, summed over the released runs; the released runs as "config_id seed") from what the
    grid released (`runs`: its runs.csv). No release (every run diverged): (None, [])."""
    import numpy as np

    statement = grid / "model" / "model.json"
    if not statement.exists():
        return None, []
    from dpgrid.results.files import read_frame
    from dpgrid.results.release import chosen_runs

    record = json.loads(statement.read_text())
    config_id = record["configuration"]["config_id"]
    # the released runs as the release chose them: (the run's seed, its index among the released models)
    _, chosen, _ = chosen_runs(spec, runs, read_frame(grid / "summary.csv"))
    released = [f"{config_id} seed {seed}" for seed, _ in chosen]
    if spec.observer.threat == "white_box":
        return sum(np.load(grid / "audit" / f"{config_id}_seed{seed}.npy") for seed, _ in chosen), released
    return input_canary_scores(spec, grid, data, [index for _, index in chosen]), released


def input_canary_scores(spec, grid: Path, data, seeds: list):
    """Minus each black-box canary's loss, averaged over the released models."""
    import torch

    from dpgrid.data import tasks
    from dpgrid.audit.canaries import input_canaries
    from dpgrid.results.models import load_model

    x, y = input_canaries(spec.observer, data, spec.dataset.classes)
    total = 0
    for seed in seeds:
        model = load_model(grid, seed, trust=[spec.model.target])
        with torch.no_grad():
            total = total - tasks.get(spec.dataset.task).loss(model(x.to(next(model.parameters()).dtype)
                                                                    if x.is_floating_point() else x), y)
    return (total / len(seeds)).double().cpu().numpy()
