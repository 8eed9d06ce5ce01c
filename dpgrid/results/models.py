"""A released model leaves dpgrid: `dpgrid.load_model(run_dir)` builds it for inference, `dpgrid model RUN_DIR --out
FILE` copies it with its statement in the file's metadata. Both check the whole release first
(dpgrid.results.statement), and a model is built only from a callable the user provides (a model config of dpgrid's
or of the search path the user gives, or a target the user trusts by name): never from whatever model.json names, so
that a model directory received from someone else runs no code of theirs.
"""

import json
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.results.files import write_atomic
from dpgrid.results.statement import (FINGERPRINTED, MODEL, STATEMENT, holds_fingerprint, release_problem, repair_hint,
                                      seal_of, without_fingerprint)


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
        import itertools

        below = sorted(str(p.parent.parent) for p in itertools.islice(run_dir.glob(f"**/{MODEL}/{STATEMENT}"), 6))
        found = f"; run directories under it that released a model: {', '.join(below[:5])}" + (
            " and more" if len(below) > 5 else "") if below else "; none under it released a model"
        raise DpgridError(f"{run_dir} is not a run directory (it holds no plan.json){found}")
    raise DpgridError(f"{folder / STATEMENT} does not exist: this run directory released no model (it is written "
                      "once every run of the grid has finished, unless train.save_models=none)")


def verified_release(run_dir) -> dict:
    """model.json of run_dir's release, checked whole (release_problem); DpgridError in one line otherwise."""
    folder = released_folder(run_dir)
    record, problem = release_problem(folder.parent)
    if problem:
        raise DpgridError(f"{problem}; {repair_hint(record)}")
    return record


def fingerprint_warning(run_dir, record: dict) -> str:
    """One line where a release an earlier dpgrid made holds a fingerprint of its training data ('' otherwise)."""
    if not holds_fingerprint(record):
        return ""
    return (f"{Path(run_dir) / MODEL}: {FINGERPRINTED}; `dpgrid model {run_dir} --out FILE` writes a copy without it, "
            "and dpgrid.load_model's statement leaves it out")


def publishable(record: dict) -> dict:
    """The statement without a training-data fingerprint an earlier dpgrid wrote into it, sealed again (its selection
    digest kept); the statement itself where it holds none. The released weights files' checksums go too: those files'
    metadata held the fingerprint, so their checksums are a function of it (hashing candidate datasets' fingerprints
    into the rest of the metadata would find the one trained on)."""
    if not holds_fingerprint(record):
        return record
    kept = without_fingerprint({k: v for k, v in record.items() if k != "seal"})
    kept["models"] = [{k: v for k, v in entry.items() if k != "sha256"} for entry in kept.get("models", [])]
    return {**kept, "seal": {**seal_of(kept), "selection_json": (record.get("seal") or {}).get("selection_json")}}


def export_target(path, run_dir) -> Path:
    """Where `dpgrid model --out` may write: never inside a run directory (a grid's own files, its release), into a
    folder that exists. DpgridError in one line otherwise; an existing file is replaced (the caller says so)."""
    path = Path(path)
    target = path.absolute()
    if target.is_dir():
        raise DpgridError(f"--out {path} is a folder: give a file name, e.g. {path / 'model.safetensors'}")
    inside = next((folder for folder in target.parents if (folder / "plan.json").exists()
                   or folder == Path(run_dir).absolute()), None)
    if inside is not None:
        raise DpgridError(f"--out {path} lies inside the run directory {inside}: its files are the grid's own; write "
                          "the copy elsewhere")
    if not target.parent.is_dir():
        raise DpgridError(f"--out {path}: no folder {target.parent}; create it first, or give another path")
    return target


def export(run_dir, seed: int, path) -> Path:
    """A copy of seed `seed`'s released weights at `path`, with the whole statement (model.json, sealed) in its
    metadata: one file that says what covers it wherever it goes. The release is checked first; nothing is written
    into a run directory."""
    from safetensors.torch import load, save

    from dpgrid.results.files import directory_setting

    target = export_target(path, run_dir)
    record = verified_release(run_dir)
    entry = next((e for e in record["models"] if e["seed"] == seed), None)
    if entry is None:
        raise DpgridError(f"{Path(run_dir) / MODEL} holds no model of seed {seed}; released seeds: "
                          f"{', '.join(str(e['seed']) for e in record['models'])}")
    tensors = load((Path(run_dir) / MODEL / entry["file"]).read_bytes())
    with directory_setting("--out FILE"):
        write_atomic(target, save(tensors, metadata={"dpgrid": json.dumps({**publishable(record), "seed": seed})}))
    return Path(path)


def load_model(run_dir, seed: int = None, device="cpu", *, searchpath=None, trust=()):
    """The model a grid released (model/ in its run directory), ready for inference (eval mode): seed `seed` of
    the released configuration, by default the one whose final model scores best on the test set. Its statement
    (model.json: what epsilon covers it and why) is the model's `statement` attribute.

    The release is checked whole first (its seal, its plan, every file's checksum), and its model is built only from
    a callable you provide: the `_target_` of a model config of dpgrid's, of the folders of `searchpath` (as
    hydra.searchpath: "[pkg://my_plugins.conf]", or a list of its entries: ["pkg://my_plugins.conf"]) or named in
    `trust` (a target's name, or a list of them); never from whatever model.json names (a model
    directory received from someone else runs no code of theirs). DpgridError in one line for anything else."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    record = verified_release(run_dir)
    folder = Path(run_dir) / MODEL
    seed = record.get("default_seed") if seed is None else seed
    entry = next((e for e in record["models"] if e["seed"] == seed), None)
    if entry is None:
        raise DpgridError(f"{folder} holds no model of seed {seed}; released seeds: "
                          f"{', '.join(str(e['seed']) for e in record['models'])}")
    try:
        tensors = load((folder / entry["file"]).read_bytes())
    except SafetensorError as e:
        raise DpgridError(f"{folder / entry['file']} is not a safetensors file ({e})") from None
    model = released_model(record["model"], searchpath, trust, tensors)
    dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), None)
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    try:
        model.load_state_dict(tensors)
    except RuntimeError as e:
        reason = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e).splitlines()[0])
        raise DpgridError(f"{folder / entry['file']} does not fit the model model.json names "
                          f"({record['model'].get('_target_')}): {reason}") from None
    model.eval()
    warning = fingerprint_warning(run_dir, record)
    if warning:
        import warnings

        warnings.warn(warning, stacklevel=2)
    model.statement = publishable(record)
    return model


def released_model(node: dict, searchpath: str = None, trust=(), tensors: dict = None):
    """The model a statement's `model` node describes, built only where its `_target_` is one you provide: a model
    config's (dpgrid's, or of `searchpath`'s folders) or one named in `trust`. Its other keys must be plain values
    (a nested `_target_` is refused: nothing in it is called) that the callable takes, and the model they build must
    have the shapes of the released `tensors` (checked on torch's meta device first: a size no memory holds is
    refused before anything is allocated)."""
    import torch
    from omegaconf import OmegaConf

    from dpgrid.config.groups import group_targets
    from dpgrid.models import build_model
    from dpgrid.plugins import check_arguments
    from dpgrid.specs import own_keys

    target = node.get("_target_")
    allowed = set(group_targets("model", searchpath)) | set([trust] if isinstance(trust, str) else trust or ())
    if not isinstance(target, str) or target not in allowed:
        raise DpgridError(f"model.json names the model {target!r}, which no model config provides (dpgrid's, or one on "
                          "the search path you give); dpgrid builds no callable a file names: pass the search path of its "
                          "plugin's configs (dpgrid model RUN_DIR hydra.searchpath=[pkg://its_package.conf]; "
                          f"load_model(..., searchpath=...)), or trust it by name (--trust {target}; trust=[...])")
    nested = [key for key, value in node.items() if key.startswith("_") and key != "_target_" or
              (isinstance(value, (dict, list)) and "_target_" in json.dumps(value))]
    if nested:
        raise DpgridError(f"model.json's model has {nested[0]!r}, which is not a plain keyword argument; refused")
    config = OmegaConf.create(node)
    check_arguments(OmegaConf.create(own_keys(config)), "model.json's model")
    if tensors is not None:
        try:
            with torch.device("meta"):
                shapes = {name: tuple(t.shape) for name, t in build_model(config).state_dict().items()}
        except Exception as e:  # whatever the model's own code raises on these arguments
            raise DpgridError(f"model.json's model ({target}) cannot be built from its arguments: {type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else 'no message'}") from None
        released = {name: tuple(t.shape) for name, t in tensors.items()}
        if shapes != released:
            differ = sorted(set(shapes) ^ set(released)) or sorted(n for n in shapes if shapes[n] != released[n])
            raise DpgridError(f"model.json's model ({target}) does not have the released weights' shapes (first "
                              f"difference: {differ[0]}): the statement and the weights are not one release; refused")
    return build_model(config)
