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
            out = (Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)).absolute()
            spec = compile(cfg, plan=False)
            check_run(spec, out)
            composed.append((job, cfg, out, spec))
        except DpgridError as e:
            composed.append((job, e, None, None))
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


def check_launcher(launcher) -> None:
    """Refuse, before anything is queued, a sweep whose launcher is dpgrid's and which Hydra would not find (an editable
    install in setuptools' default mode hides the hydra_plugins namespace from Hydra's plugin discovery), or which
    asks SLURM for what it would read otherwise (`+hydra.launcher.mem=8`: sbatch's megabytes)."""
    if str(launcher.get("_target_", "")) != DPGRID_LAUNCHER:
        return
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from omegaconf import OmegaConf

    known = set(OmegaConf.structured(SlurmQueueConf).keys()) | set(DPGRID_SLURM_KEYS)
    for key in [k for k in launcher if k not in known]:
        if key == "mem":
            raise DpgridError(f"hydra.launcher.mem={launcher[key]} would ask SLURM for {launcher[key]} megabytes (sbatch's "
                              f"--mem); set hydra.launcher.mem_gb={launcher[key]} for gigabytes")
        close = closest(key, known)
        raise DpgridError(f"no setting 'hydra.launcher.{key}'" + (f"; did you mean hydra.launcher.{close[0]}?" if close
                          else "; SLURM options it does not name go in hydra.launcher.additional_parameters"))
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    if DPGRID_LAUNCHER not in {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Launcher)}:
        raise DpgridError("hydra/launcher=slurm: Hydra does not find dpgrid's launcher (hydra_plugins.dpgrid_launcher), "
                          "as after an editable install in setuptools' default mode; install it so that Hydra sees it: "
                          "pip install -e \".[cluster]\" --config-settings editable_mode=compat")
