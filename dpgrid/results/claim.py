"""Who may write a run directory: one judgement of what it holds, made before anything is written into it.

`claim` refuses results of another config (plan.json's config hash, and the settings plan.json records that are not
hashed: dpgrid.config.identity), of other data (their files' sizes and checksums), and a damaged plan.json whose
runs.csv this plan did not make; overwrite=true deletes them instead. It judges what it is given: a spec not yet
planned on its config (`dpgrid run` asks so before torch is loaded, and a sweep for every job before any is queued),
a planned one on its runs too, and the data once they are loaded (the runner, holding the directory's lock). Imports
neither torch nor pandas."""

import warnings
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.config.identity import other_config, other_setting
from dpgrid.results.files import check_writable, delete_release, locked, read_json


def check_run(spec, out_dir) -> None:
    """Everything about a run directory that can be refused before the grid is planned or any file written. With
    overwrite=true nothing is refused, and nothing is deleted yet: the runner starts afresh when it trains."""
    out = Path(out_dir)
    check_writable(out)
    if out.is_dir() and not spec.overwrite:
        with locked(out):
            claim(out, spec)


def claim(out: Path, spec, data_files: dict = None) -> None:
    """Refuse to mix results of different configs or data in one directory (overwrite=true starts afresh).
    `data_files`: the loaded data's fingerprint (None: not loaded yet). A damaged plan.json (or one without a config
    hash) is judged by the runs themselves once the spec is planned: when runs.csv was made with this plan's noise,
    steps and configurations, the grid resumes and plan.json is rewritten."""
    if not (out / "runs.csv").exists():
        return
    try:
        previous = read_json(out / "plan.json", "")
    except DpgridError:
        previous = {}
    problem = held(out, spec, previous, data_files)
    if problem and not spec.overwrite:
        raise DpgridError(problem)
    if problem:
        delete_release(out)


def held(out: Path, spec, previous: dict, data_files) -> str:
    """Why `out`, holding runs and the plan.json `previous`, is not this grid's to resume ('' when it is)."""
    recorded = previous.get("config_hash")
    there = ((previous.get("start") or {}).get("init") or {}).get("sha256")
    if recorded and recorded != spec.config_hash and there and there != spec.start.init_sha256:
        return (f"{out} was trained from another checkpoint: model.init={spec.start.init} is not the file its results "
                f"were made from (sha256 {spec.start.init_sha256[:12] if spec.start.init_sha256 else 'none'}, there "
                f"{there[:12]}); restore that file, choose another hydra.run.dir, or pass overwrite=true")
    if recorded and recorded != spec.config_hash:
        return other_config(out, spec.settings, spec.strategy_cls.private, recorded, spec.config_hash,
                            spec.selection_cls.accounts_seeds)
    if recorded:
        return other_setting(out, previous, spec) or other_data(out, previous.get("data_files", {}), data_files)
    if spec.plan is None:  # judged on its runs once planned
        return ""
    from dpgrid.results.runs import runs_disagree  # pandas: only for a damaged plan.json

    why = "has no config hash" if previous else "is damaged or missing"
    from dpgrid.results.procedure import procedure_of

    mismatch = runs_disagree(out / "runs.csv", spec.plan, procedure_of(spec.plan.method).seeds_beyond_plan)
    if mismatch:
        return (f"{out / 'plan.json'} {why}, and runs.csv was not made by this config ({mismatch}); choose "
                "another hydra.run.dir, or pass overwrite=true to delete the results")
    if data_files is not None:  # said once, by the claim made with the data loaded
        warnings.warn(f"{out / 'plan.json'} {why}; runs.csv matches this config's plan, so the grid resumes and "
                      "plan.json is rewritten")
    return ""


def other_data(out: Path, recorded: dict, data_files) -> str:
    """The refusal of results made with other data files ('' when they are the same, or not loaded yet)."""
    if data_files is None:
        return ""
    changed = sorted(n for n in set(data_files) | set(recorded) if data_files.get(n) != recorded.get(n))
    if not changed:
        return ""
    return (f"{out} was run on other data: {changed[0]} is not the file its results were made with (size or checksum "
            "differ); restore that file, or pass overwrite=true to delete the results")
