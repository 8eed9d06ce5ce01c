"""A grid as a Hydra job: `launch` runs one job as Hydra runs it (with the config's callbacks), and what the job
writes beside its results once it holds the run directory's lock: Hydra's record of the job (.hydra/) and the
grid's log (cli.log). Hydra itself writes neither (conf: hydra.output_subdir is null)."""

import contextlib
import logging
import sys
from pathlib import Path


class LogFile(logging.FileHandler):
    """cli.log: a line that cannot be written (a full disk) ends the grid in one line, as any other write does,
    instead of logging's "--- Logging error ---" and its tracebacks."""

    def handleError(self, record):
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            from dpgrid.results.files import describe_os_error
            raise describe_os_error(error, self.baseFilename) from None
        super().handleError(record)

    def close(self):
        try:
            super().close()
        except OSError:  # its last flush found the disk full: said already, or said by the write that failed next
            pass


@contextlib.contextmanager
def run_log(path: Path):
    """The grid's lines (logger `dpgrid`) into its cli.log, opened at the first line: a refused job writes none.
    The logger is restored afterwards, and nothing reaches the process's other handlers."""
    log, handler = logging.getLogger("dpgrid"), LogFile(path, delay=True)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        handler.close()
        log.setLevel(saved[0])
        log.propagate = saved[1]


def hydra_record(config_yaml: str):
    """Hydra's record of the job (.hydra/config.yaml, the job's config as composed; hydra.yaml, overrides.yaml),
    written by dpgrid once it holds the run directory's lock: Hydra itself writes nothing there (conf:
    hydra.output_subdir is null)."""
    def write(out: Path) -> None:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        from dpgrid.results.files import environment, write_atomic

        hydra_cfg, folder = HydraConfig.get(), out / ".hydra"
        with environment(folder):
            folder.mkdir(exist_ok=True)
        write_atomic(folder / "config.yaml", config_yaml)
        write_atomic(folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})))
        write_atomic(folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task))
    return write


def parallel_jobs(launcher) -> int:
    """How many grids the sweep's launcher runs side by side on this machine: dpgrid's as it placed them
    (dpgrid.commands.placement), joblib's n_jobs (-1: every core); 1 for the basic launcher (one after another) and for
    SLURM (each job has its own allocation)."""
    if str(launcher.get("_target_", "")) == LOCAL_LAUNCHER:
        from dpgrid.commands.placement import placed

        return placed(launcher)
    n_jobs = launcher.get("n_jobs") if "joblib" in str(launcher.get("_target_", "")) else None
    if n_jobs is None:
        return 1
    from dpgrid.training.threads import available_cores

    return available_cores() if int(n_jobs) < 0 else max(1, int(n_jobs))


LOCAL_LAUNCHER = "hydra_plugins.dpgrid_launcher.LocalLauncher"  # hydra/launcher=dpgrid, the default


class Callbacks:
    """The config's hydra.callbacks (Hydra's Callback classes), called where Hydra calls them in a run."""

    def __init__(self, configured):
        from hydra.utils import instantiate

        self.callbacks = [instantiate(c) for c in (configured or {}).values()]

    def __getattr__(self, event: str):  # on_run_start, on_job_start, on_job_end, on_run_end, ...
        if not event.startswith("on_"):
            raise AttributeError(event)
        ending = event.endswith("_end")  # as Hydra: the start events in order, the end events in reverse

        def call(**kwargs):
            for callback in reversed(self.callbacks) if ending else self.callbacks:
                getattr(callback, event)(**kwargs)
        return call


def launch(cfg, task):
    """`task(cfg)` run as Hydra runs one job (run directory, .hydra/, cli.log, callbacks), on a config that
    `compose(..., with_hydra=True)` made: `dpgrid run` composes its config once."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict

    from dpgrid.config.groups import config_dir

    with open_dict(cfg):
        cfg.hydra.mode = RunMode.RUN
    with initialize_config_dir(version_base="1.3", config_dir=config_dir(), job_name="dpgrid"):
        callbacks = Callbacks(cfg.hydra.get("callbacks"))
        callbacks.on_run_start(config=cfg, config_name="config")
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        job = run_job(task, cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context,
                      configure_logging=False)  # the task logs into cli.log itself; the process's logging is left alone
        callbacks.on_run_end(config=cfg, config_name="config", job_return=job)
    return job.return_value  # raises what the task raised
