"""A sweep (`dpgrid run -m`) checked whole before any job is launched or queued: every job composed, compiled and
planned here, a launcher Hydra would not find or a SLURM setting it would misread refused, and what a queued job
would find only after its wait (its data, its directory's lock) checked on this machine."""

from pathlib import Path

from dpgrid import DpgridError
from dpgrid.config.compose import closest, compose, sweep_jobs


def refuse_jobs(refused: list, jobs: int) -> None:
    """[(job's overrides, its DpgridError)] as one refusal: each job named on a line of its own, or the one reason
    alone where every job gives it (a sweep-wide setting)."""
    reasons = [str(e) for _, e in refused]
    if len(refused) == jobs and len(set(reasons)) == 1:
        raise DpgridError(reasons[0])
    if len(refused) == 1:
        raise DpgridError(f"sweep job {' '.join(refused[0][0])}: {reasons[0]}")
    if refused:
        raise DpgridError(f"{len(refused)} of the sweep's {jobs} jobs cannot run, so none was started:\n"
                          + "\n".join(f"sweep job {' '.join(job)}: {reason}" for (job, _), reason in zip(refused, reasons)))


def check_sweep(overrides: list) -> dict:
    """Every job of a sweep composed, checked and planned in this process (every refusal `dpgrid plan` would give),
    before any is launched or queued: a sweep with a job that cannot run trains nothing, and each such job is named in
    a line of its own; jobs of different configs that would write into one directory are refused, naming their
    overrides. Returns {each job's directory: the config hash checked for it}."""
    import warnings

    from dpgrid.config import compile
    from dpgrid.results.claim import check_run

    jobs, composed = sweep_jobs(overrides), []
    for job in jobs:  # the cheap checks of every job first, so a bad value is refused before torch is loaded
        try:
            cfg = compose(job, with_hydra=True)
            composed.append((job, cfg, (Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)).absolute()))
        except DpgridError as e:
            composed.append((job, e, None))
    refuse_jobs([(job, cfg) for job, cfg, _ in composed if isinstance(cfg, DpgridError)], len(jobs))
    refuse_still_queued(composed)  # before any directory's lock is asked: a running job holds its own
    for index, (job, cfg, out) in enumerate(composed):
        try:
            spec = compile(cfg, plan=False)
            check_run(spec, out)
            composed[index] = (job, cfg, out, spec)
        except DpgridError as e:
            composed[index] = (job, e, None, None)
    refuse_jobs([(job, cfg) for job, cfg, _, _ in composed if isinstance(cfg, DpgridError)], len(jobs))
    check_launcher(composed[0][1].hydra.launcher)  # one launcher for the whole sweep
    planned = []
    for job, cfg, _, _ in composed:  # the plan's own refusals (a noise the strategy cannot carry, an unreachable epsilon)
        try:
            with warnings.catch_warnings():  # the job says its own warnings when it runs
                warnings.simplefilter("ignore")
                compile(cfg)
        except DpgridError as e:
            planned.append((job, e))
    refuse_jobs(planned, len(jobs))
    by_dir, checked = {}, set()
    for job, cfg, out, spec in composed:
        by_dir.setdefault(out, {}).setdefault(spec.config_hash, job)
        if str(cfg.hydra.launcher.get("_target_", "")) == DPGRID_LAUNCHER:  # what a queued job would find late
            check_before_queue(spec, job, out, bool(cfg.data.check_before_queue), checked)
    for out, jobs in by_dir.items():
        if len(jobs) > 1:
            first, second = list(jobs.values())[:2]
            differ = [o for o in second if o not in first]
            raise DpgridError(f"the sweep's jobs '{' '.join(first)}' and '{' '.join(second)}' would both write into "
                              f"{out} ({', '.join(differ)} is not part of its name); give them different "
                              "directories, e.g. add that key to hydra.sweep.subdir")
    return {out: next(iter(jobs)) for out, jobs in by_dir.items()}


def refuse_still_queued(composed: list) -> None:
    """A SLURM sweep some of whose grids an earlier submission's jobs still hold, running or pending
    (`composed`: [(job, its config, its run directory)]): refused naming the jobs, squeue and scancel (a running job
    holds its directory's lock, and "another process is writing" would send the user to another directory, training
    the grid twice)."""
    cfg = composed[0][1]
    if str(cfg.hydra.launcher.get("_target_", "")) != DPGRID_LAUNCHER:
        return
    from dpgrid.commands import slurm

    if live := slurm.still_queued(Path(str(cfg.hydra.sweep.dir)), [out for _, _, out in composed]):
        raise slurm.still_queued_refusal(live)


def check_before_queue(spec, job: list, out: Path, data: bool, checked: set) -> None:
    """A SLURM sweep job's refusals that would otherwise come after its wait in the queue: its dataset under
    data.root (loaded once per dataset and root; `data` False skips it), and its run directory's lock."""
    from dpgrid.results.files import locked

    key = (spec.dataset.name, str(spec.data_root))
    if data and key not in checked:
        from dpgrid.data import load

        checked.add(key)
        try:
            load(spec.dataset, spec.data_root)
        except DpgridError as e:
            raise DpgridError(f"sweep job {' '.join(job)}: {e} (checked on this machine before queueing; "
                              "data.check_before_queue=false skips it where the cluster's nodes see other paths)") from None
    if (out / ".lock").exists():
        try:
            with locked(out):
                pass
        except DpgridError as e:
            raise DpgridError(f"sweep job {' '.join(job)}: {e}") from None


DPGRID_LAUNCHER = "hydra_plugins.dpgrid_launcher.SlurmLauncher"
# the keys dpgrid's launcher adds to the submitit plugin's (hydra_plugins.dpgrid_launcher.DpgridSlurmConf): named here,
# not imported from it, since the plugin hands its launch to this package
DPGRID_SLURM_KEYS = ("grids_per_job",)


MEMORY_UNITS = {"k": 1 / 2 ** 20, "m": 1 / 1024, "g": 1, "t": 1024}  # sbatch's --mem suffixes, in gigabytes


def memory_refusal(value) -> str:
    """hydra.launcher.mem (sbatch's --mem: megabytes without a unit, or with K, M, G, T) in one line saying the
    hydra.launcher.mem_gb that asks for the same memory, a whole number of gigabytes (rounded up), as the launcher
    takes it."""
    import math
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", str(value), re.I)
    if not match:
        return (f"hydra.launcher.mem={value} is not memory sbatch reads; the launcher takes hydra.launcher.mem_gb, a "
                "whole number of gigabytes (e.g. hydra.launcher.mem_gb=8)")
    amount, unit = float(match.group(1)), match.group(2).lower()
    gigabytes = max(1, math.ceil(amount * MEMORY_UNITS[unit or "m"] - 1e-9))
    if not unit:  # sbatch reads a bare number as megabytes: which was meant is the user's to say
        return (f"hydra.launcher.mem={value} would ask SLURM for {match.group(1)} megabytes (sbatch's --mem); set "
                f"hydra.launcher.mem_gb={match.group(1).split('.')[0]} for gigabytes, or hydra.launcher.mem_gb={gigabytes} "
                "for those megabytes (whole gigabytes)")
    exact = math.isclose(amount * MEMORY_UNITS[unit], gigabytes)
    return (f"the launcher takes memory as hydra.launcher.mem_gb, a whole number of gigabytes: for "
            f"hydra.launcher.mem={value} set hydra.launcher.mem_gb={gigabytes}"
            + ("" if exact else f" ({value} rounded up to whole gigabytes)"))


def check_launcher(launcher) -> None:
    """Refuse, before anything is queued, a sweep whose launcher is dpgrid's and which Hydra would not find (an editable
    install in setuptools' default mode hides the hydra_plugins namespace from Hydra's plugin discovery), or which
    asks SLURM for what it would read otherwise (`+hydra.launcher.mem=8`: sbatch's megabytes); and a setting
    hydra/launcher=dpgrid (the default) does not have, or a side_by_side that is no number of grids."""
    from dpgrid.commands.jobs import LOCAL_LAUNCHER

    if str(launcher.get("_target_", "")) == LOCAL_LAUNCHER:
        from dpgrid.commands.placement import SETTING, check_setting

        for key in [k for k in launcher if k not in ("_target_", "side_by_side")]:
            raise DpgridError(f"no setting 'hydra.launcher.{key}' of hydra/launcher=dpgrid; its setting: {SETTING} "
                              "(auto or a number of grids)")
        check_setting(launcher.get("side_by_side", "auto"))
        return
    if str(launcher.get("_target_", "")) != DPGRID_LAUNCHER:
        return
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from omegaconf import OmegaConf

    known = set(OmegaConf.structured(SlurmQueueConf).keys()) | set(DPGRID_SLURM_KEYS)
    for key in [k for k in launcher if k not in known]:
        if key == "mem":
            raise DpgridError(memory_refusal(launcher[key]))
        close = closest(key, known)
        raise DpgridError(f"no setting 'hydra.launcher.{key}'" + (f"; did you mean hydra.launcher.{close[0]}?" if close
                          else "; SLURM options it does not name go in hydra.launcher.additional_parameters"))
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    if DPGRID_LAUNCHER not in {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Launcher)}:
        raise DpgridError("hydra/launcher=slurm: Hydra does not find dpgrid's launcher (hydra_plugins.dpgrid_launcher), "
                          "as after an editable install in setuptools' default mode; install it so that Hydra sees it: "
                          "pip install -e \".[cluster]\" --config-settings editable_mode=compat")
