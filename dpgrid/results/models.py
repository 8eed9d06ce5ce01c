"""The model a grid releases (train.save_models), and what covers it.

Each finished run's final weights are kept in weights/<config_id>_seed<s>.safetensors before its row is committed
(private, like runs.csv: a run that did not finish has none). Once every run of the grid has finished, the runs it
releases are copied to model/ beside model.json, the statement of what covers them:

- a composition grid releases its best configuration: the final weights of each of its seeds. Choosing it read
  every seed's score of every configuration, so its release is covered by the epsilon of all K x seeds runs
  (epsilon_with_seeds; epsilon itself when the seeds are accounted);
- a random-stopping selection releases its chosen candidate's seeds, covered by the selection's epsilon
  (Papernot & Steinke, Liu & Talwar: the best candidate's output, here its trained models, with its score).
  Nothing in model/ names the candidate's index or depends on the other candidates: seed j of the candidate is
  model/seed<j>.

Then weights/ is deleted (train.save_models=released), or kept as the private log of every run's model (all);
none keeps nothing. `dpgrid.load_model(run_dir)` returns a released model ready for inference.
"""

import hashlib
import json
import shutil
from pathlib import Path

from dpgrid import DpgridError, __version__
from dpgrid.results.files import environment, read_json, write_atomic, write_json

WEIGHTS, MODEL, STATEMENT = "weights", "model", "model.json"
SEEDED = ("seeded: every batch and noise draw follows from public names, so this epsilon holds only against an "
          "adversary who does not know them; not for real data (privacy.secure_rng=true is)")
SECURE = "secure: batches and noise from the operating system's secure generator (privacy.secure_rng=true)"


def weights_file(out: Path, config_id: str, seed: int) -> Path:
    return Path(out) / WEIGHTS / f"{config_id}_seed{seed}.safetensors"


def keep_weights(out: Path, config_id: str, seed: int, state: dict) -> None:
    """A finished run's final weights (a state dict of tensors), written whole or not at all."""
    from safetensors.torch import save

    path = weights_file(out, config_id, seed)
    with environment(path.parent):
        path.parent.mkdir(exist_ok=True)
    write_atomic(path, save({name: t.detach().to("cpu").contiguous() for name, t in state.items()}))


def final_weights(model) -> dict:
    """A copy of a model's final weights, or None when one is not finite (a diverged run keeps no model)."""
    import torch

    state = {name: t.detach().to("cpu").clone() for name, t in model.state_dict().items()}
    return state if all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point()) else None


def statement(spec, data_files: dict, configuration: dict, chosen_by: str) -> dict:
    """What a release is covered by, in the plan's own figures."""
    plan = spec.plan
    private = plan.private and plan.epsilon_spent is not None
    covered = {"epsilon": plan.epsilon_with_seeds, "delta": plan.delta} if private else None
    return {
        "covered_by": covered,
        "why": chosen_by if private else ("non-private: no clipping, no noise, no epsilon" if not plan.private else
                                          f"no epsilon covers it: {plan.sampling}"),
        "privacy": {"epsilon_target": plan.epsilon if plan.private else None, "epsilon_spent": plan.epsilon_spent,
                    "epsilon_with_seeds": plan.epsilon_with_seeds, "delta": plan.delta if plan.private else None,
                    "noise_multiplier": plan.noise_multiplier, "per_query": {**plan.per_query, **plan.problem},
                    "accountant": plan.accountant, "budget": plan.budget, "selection": plan.selection,
                    "analysis": plan.to_dict()["selection_accountant"], "seeds_accounted": plan.account_seeds,
                    "seeds": plan.seeds, "sampling": plan.sampling} if plan.private else None,
        "randomness": SECURE if spec.train.secure_rng else SEEDED,
        "strategy": plan.strategy, "dataset": plan.dataset, "n_train": plan.n_train, "data_files": data_files,
        "inputs": {"normalize": spec.dataset.normalize,
                   **({"mean": spec.dataset.mean, "std": spec.dataset.std}
                      if spec.dataset.normalize == "standardize" else {})},
        "configuration": configuration,
        "model": dict(spec.settings["model"]),
        "config_hash": spec.config_hash, "dpgrid": __version__,
    }


def chosen_runs(spec, runs, summary) -> tuple:
    """(the configuration released, [(its run's seed, its index j among the configuration's seeds)], why it is
    covered), or (None, [], '') when nothing is released (every run diverged, or no candidate)."""
    plan = spec.plan
    best = summary[summary.best] if len(summary) else summary
    if not len(best):
        return None, [], ""
    row = best.iloc[0]
    configuration = {"config_id": row.config_id, **{a: float(row[a]) for a in plan.axes}}
    seeds, why = plan.accounting().release_reason(plan, row, runs)
    return configuration, seeds, why


def release_when_finished(out: Path, spec, runs, summary, work: list, data_files: dict) -> str:
    """The released model, once every run of the grid has finished (dpgrid.results.models); a line saying what
    was written or why nothing was."""
    if spec.train.save_models == "none" or runs is None or not len(runs):
        return ""
    from dpgrid.results.curves import read_curves
    from dpgrid.results.runs import run_ids

    everything = spec.plan.accounting().every_run(spec.plan, work)
    left = len(everything - set(run_ids(runs)))
    if left:
        return (f"model: released once every run of the grid has finished ({left} of {len(everything)} runs left, "
                "grid.only); their final weights are kept in weights/ meanwhile")
    return release(out, spec, runs, summary, read_curves(out / "curves.csv")[0], data_files)


def release(out: Path, spec, runs, summary, curves, data_files: dict) -> str:
    """Write model/ (the released runs' weights and model.json) once every run of the grid has finished; remove
    weights/ unless train.save_models=all. Returns a line for the console ('' when nothing is said). Idempotent:
    a finished grid run again keeps the files it released."""
    out = Path(out)
    if spec.train.save_models == "none":
        return ""
    configuration, seeds, why = chosen_runs(spec, runs, summary)
    if configuration is None:
        return ""
    target = out / MODEL
    if released_already(target, spec, configuration, seeds):
        record = read_json(target / STATEMENT, "")
    else:
        missing = [s for s, _ in seeds if not weights_file(out, configuration["config_id"], s).exists()]
        if missing:
            return (f"model: not released: the final weights of {configuration['config_id']}'s runs were not kept "
                    "(train.save_models=none when they ran, or weights/ was removed)")
        record = write_release(out, spec, runs, curves, data_files, configuration, seeds, why)
    if spec.train.save_models == "released":
        with environment(out / WEIGHTS):
            shutil.rmtree(out / WEIGHTS, ignore_errors=True)
    epsilon = (f"covered by epsilon = {record['covered_by']['epsilon']:.4g}, delta = {record['covered_by']['delta']:g}"
               if record["covered_by"] else record["why"])
    return f"model: {target} ({configuration['config_id']}, {len(seeds)} seed(s); {epsilon}; model.json says why)"


def released_already(target: Path, spec, configuration: dict, seeds: list) -> bool:
    """Whether model/ holds this release already (a finished grid run again)."""
    try:
        record = read_json(target / STATEMENT, "")
    except DpgridError:
        return False
    return (record.get("config_hash") == spec.config_hash and record.get("configuration") == configuration
            and [m.get("seed") for m in record.get("models", [])] == [j for _, j in seeds]
            and all((target / m["file"]).exists() for m in record["models"]))


def write_release(out: Path, spec, runs, curves, data_files: dict, configuration: dict, seeds: list, why: str) -> dict:
    """model/: the released runs' weights and model.json, made in a folder beside it and swapped in whole."""
    from safetensors.torch import load, save

    new, old = out / f".{MODEL}.new", out / f".{MODEL}.old"
    for folder in (new, old):
        with environment(folder):
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(exist_ok=True)
    with environment(new):
        new.mkdir()
    record = statement(spec, data_files, configuration, why)
    last = last_values(curves, configuration["config_id"])
    entries = []
    for seed, j in seeds:
        tensors = load(weights_file(out, configuration["config_id"], seed).read_bytes())
        content = save(tensors, metadata={"dpgrid": json.dumps({"covered_by": record["covered_by"], "why": record["why"],
                                                                "configuration": configuration, "seed": j})})
        name = f"seed{j}.safetensors"
        write_atomic(new / name, content)
        entries.append({"seed": j, "file": name, "sha256": hashlib.sha256(content).hexdigest(),
                        "test_value": last.get(seed)})
    metric = runs.metric.iloc[0]
    record.update(metric=metric, models=entries, default_seed=best_seed(entries, metric))
    write_json(new / STATEMENT, record)
    target = out / MODEL
    with environment(target):
        if target.exists():
            target.rename(old)
        new.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    return record


def last_values(curves, config_id: str) -> dict:
    """Each run's last validation value (the test value of its final weights), by seed."""
    if curves is None or not len(curves):
        return {}
    mine = curves[curves.config_id == config_id].sort_values("step")
    return {int(seed): float(g.value.iloc[-1]) for seed, g in mine.groupby("seed")}


def best_seed(entries: list, metric: str):
    """The seed whose final model scores best on the (public) test set: a choice among released models."""
    from dpgrid import tasks

    scored = [e for e in entries if e["test_value"] is not None]
    if not scored:
        return entries[0]["seed"] if entries else None
    sign = 1 if tasks.get(metric).higher_is_better else -1
    return max(scored, key=lambda e: (sign * e["test_value"], -e["seed"]))["seed"]


def released_folder(run_dir) -> Path:
    """run_dir/model, where a grid's release lies; DpgridError in one line saying what `run_dir` is instead: missing,
    the model/ folder itself, a tree of run directories, or a run directory that released nothing (yet)."""
    run_dir = Path(run_dir)
    folder = run_dir / MODEL
    if (folder / STATEMENT).exists():
        return folder
    if not run_dir.is_dir():
        raise DpgridError(f"no run directory {run_dir}: give the directory a grid ran in (its hydra.run.dir)")
    if (run_dir / STATEMENT).exists():
        raise DpgridError(f"{run_dir} is a release's {MODEL}/ folder: give the run directory that holds it, "
                          f"{run_dir.absolute().parent}")
    if not (run_dir / "plan.json").exists():
        below = sorted(str(p.parent.parent) for p in run_dir.glob(f"**/{MODEL}/{STATEMENT}"))
        found = f"; the run directories under it that released a model: {', '.join(below[:5])}" + (
            f" and {len(below) - 5} more" if len(below) > 5 else "") if below else "; none under it released a model"
        raise DpgridError(f"{run_dir} is not a run directory (it holds no plan.json){found}")
    raise DpgridError(f"{folder / STATEMENT} does not exist: this run directory released no model (it is written "
                      "once every run of the grid has finished, unless train.save_models=none)")


def export(run_dir, seed: int, path) -> Path:
    """A copy of seed `seed`'s released weights at `path`, with the whole statement (model.json) in its metadata:
    one file that says what covers it wherever it goes."""
    from safetensors.torch import load, save

    folder = Path(run_dir) / MODEL
    record = read_json(folder / STATEMENT, "run the grid's command again to write it anew")
    entry = next(e for e in record["models"] if e["seed"] == seed)
    tensors = load((folder / entry["file"]).read_bytes())
    path = Path(path)
    write_atomic(path, save(tensors, metadata={"dpgrid": json.dumps({**record, "seed": seed})}))
    return path


def load_model(run_dir, seed: int = None, device="cpu"):
    """The model a grid released (model/ in its run directory), ready for inference (eval mode): seed `seed` of
    the released configuration, by default the one whose final model scores best on the test set. Its statement
    (model.json: what epsilon covers it and why) is the model's `statement` attribute. DpgridError when the run
    directory released no model or a file does not match its checksum."""
    from safetensors.torch import load

    from dpgrid.models import build_model

    folder = released_folder(run_dir)
    record = read_json(folder / STATEMENT, "run the grid's command again to write it anew")
    seed = record.get("default_seed") if seed is None else seed
    entry = next((e for e in record.get("models", []) if e.get("seed") == seed), None)
    if entry is None:
        raise DpgridError(f"{folder} holds no model of seed {seed}; released seeds: "
                          f"{', '.join(str(e.get('seed')) for e in record.get('models', []))}")
    with environment(folder / entry["file"]):
        content = (folder / entry["file"]).read_bytes()
    if hashlib.sha256(content).hexdigest() != entry.get("sha256"):
        raise DpgridError(f"{folder / entry['file']} does not match the checksum model.json records (changed or "
                          "damaged); run the grid's command again to write it anew")
    from omegaconf import OmegaConf

    tensors = load(content)
    model = build_model(OmegaConf.create(record["model"]))
    dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), None)
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    model.load_state_dict(tensors)
    model.eval()
    model.statement = record
    return model
