"""Hydra's submitit SLURM launcher (pip install 'dpgrid[cluster]'), with what a user of `dpgrid run -m
hydra/launcher=slurm` needs to hear: a submission SLURM refuses is one line naming the setting to change;
while jobs wait, why they are pending (once per change); a job that ends without its grid finished (cancelled,
timed out, failed) is one line naming its state, its grid's own error and its log; Ctrl-C in the submitting
process says which jobs go on queued or running and how to cancel them. Jobs and results are the plugin's own.
The launcher class is hydra_plugins.dpgrid_launcher.SlurmLauncher (Hydra takes launchers from the hydra_plugins
package only), named by conf/hydra/launcher/slurm.yaml; it hands its launch to `launch` here."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from dpgrid import DpgridError
from dpgrid.commands import slurm
from dpgrid.reporting.console import plural

NOT_ON_A_CLUSTER = ("hydra/launcher=slurm submits from a machine of a SLURM cluster (a login node); "
                    "hydra/launcher=local runs the sweep's grids side by side on this machine")
def launch(launcher, job_overrides, initial_job_idx) -> list:
    """The plugin's launch (SLURM array jobs of one task per grid, split at the cluster's MaxArraySize), with
    dpgrid's submission, wait and errors. Grids whose run directory holds a finished grid are not queued again;
    once every grid has finished, each one's result in a line, as a local run ends."""
    from hydra.core.singleton import Singleton

    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    grids = [grid_of(launcher, overrides) for overrides in job_overrides]
    first = {}  # jobs that are one grid (its settings differ only in what it does not read) train it once
    for i, (out, _, _) in enumerate(grids):
        first.setdefault(out, i)
    if len(first) < len(grids):
        print(f"dpgrid: the sweep's {len(grids)} jobs are {plural(len(first), 'grid')} (jobs whose settings differ only in what "
              "their grid does not read write into one directory): each is trained once", file=sys.stderr, flush=True)
    todo = [i for i in first.values() if grids[i][2] or not finished_grid(grids[i][0])]
    if len(todo) < len(first):
        print(f"dpgrid: {len(first) - len(todo)} of {plural(len(first), 'grid')} finished, "
              + ("submitting the rest" if todo else "nothing to submit"), file=sys.stderr, flush=True)
    returns = {i: finished_return(grids[i][0]) for i in first.values() if i not in todo}
    if live := slurm.still_queued(sweep_dir, [grids[i][0] for i in todo]):
        raise slurm.still_queued_refusal(live)
    if todo:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in launcher.config.hydra.sweep:  # as the plugin: hydra.sweep.mode sets the folder's permissions
            os.chmod(sweep_dir, int(str(launcher.config.hydra.sweep.mode), 8))
        args = [(list(job_overrides[i]), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}",
                 Singleton.get_state()) for i in todo]
        try:
            made = executor(launcher)
        except RuntimeError as e:  # submitit looks for srun first

            raise DpgridError(f"no SLURM on this machine ({e}): {NOT_ON_A_CLUSTER}")
        before = entries(sweep_dir / ".submitit")
        per_job = max(1, int(launcher.grids_per_job))
        chunks = [args[start:start + per_job] for start in range(0, len(args), per_job)]
        jobs = submit(made, several, [(launcher, chunk) for chunk in chunks], max_array_size(),
                      on_refused=lambda: clear_refused(sweep_dir, before))
        slurm.record_jobs(sweep_dir, {grids[i][0]: job.job_id for job, start in zip(jobs, range(0, len(todo), per_job))
                                      for i in todo[start:start + per_job]})
        grouped = f" ({len(todo)} grids, up to {per_job} per job)" if per_job > 1 else ""
        print(f"dpgrid: submitted {len(jobs)} SLURM job(s){grouped} as {slurm.array_id(jobs)}; their logs: "
              f"{log_folder(jobs)}", file=sys.stderr, flush=True)
        try:
            accounting = slurm.wait(jobs, launcher.params)
        except KeyboardInterrupt as e:
            from dpgrid.commands.signals import stopped

            left = [j.job_id for j in jobs if not j.paths.result_pickle.exists()]
            name, code = stopped(e) or ("interrupted", 130)
            ids = slurm.array_id(jobs)
            raise DpgridError(f"{name}: {len(left)} SLURM job(s) go on queued or running without this process "
                 f"({slurm.compact(left)}): squeue -j {ids} shows them, scancel {ids} cancels them; while they are "
                 "queued or running the same command refuses to queue their grids again, and once they have ended it "
                 "resumes any grid left incomplete", exit_code=code)
        by_job = [[job_overrides[i] for i in todo[start:start + per_job]] for start in range(0, len(todo), per_job)]
        with warnings.catch_warnings():  # submitit's "Bypassing sacct error" where sacct does not answer: said once
            warnings.simplefilter("ignore")
            returns.update(zip(todo, outcomes(jobs, by_job, launcher.params.get("timeout_min"), accounting)))
    say_results([grids[i] for i in first.values()], sweep_dir)
    return [returns[first[out]] for out, _, _ in grids]


def several(task, chunk: list) -> list:
    """What one SLURM job runs: the plugin's task for each grid of its chunk, one after the other (Hydra's JobReturns)."""
    return [task(*arguments) for arguments in chunk]


def entries(folder: Path) -> set:
    return set(os.listdir(folder)) if folder.is_dir() else set()


def clear_refused(sweep_dir: Path, before: set) -> None:
    """Nothing left behind by a submission SLURM refused: the job pickles made for it, and a sweep folder that then
    holds nothing but Hydra's multirun.yaml."""
    folder = sweep_dir / ".submitit"
    for name in entries(folder) - before:  # a job's folder, or a pickle submitit wrote before sbatch answered
        shutil.rmtree(folder / name, ignore_errors=True) if (folder / name).is_dir() else (folder / name).unlink()
    if folder.is_dir() and not entries(folder):
        folder.rmdir()
    if entries(sweep_dir) <= {"multirun.yaml"}:
        shutil.rmtree(sweep_dir, ignore_errors=True)


def grid_of(launcher, overrides) -> tuple:
    """(run directory, dataset task, overwrite) of one sweep job, composed as the job will compose it."""
    cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    out = (Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)).absolute()
    return out, str(cfg.dataset.task), bool(cfg.get("overwrite", False))


def finished_grid(out: Path) -> bool:
    """Whether `out` holds a grid that has finished: run_grid writes summary.csv once every run it planned is
    committed, so a summary no older than the last row is a finished grid (an interrupted resume appends rows
    after it). Anything else (missing, partial, damaged) is queued, and the job judges it as a local run does."""
    try:
        summary, runs = (out / "summary.csv").stat(), (out / "runs.csv").stat()
    except OSError:
        return False
    return (out / "plan.json").is_file() and summary.st_mtime_ns >= runs.st_mtime_ns


def finished_return(out: Path):
    """Hydra's record of a job that was not queued because its grid had finished."""
    from hydra.core.utils import JobReturn, JobStatus

    return JobReturn(status=JobStatus.COMPLETED, _return_value=None, working_dir=str(out))


def say_results(grids: list, sweep_dir: Path) -> None:
    """Each grid's best configuration (or what its selection released), one line each, and where the results are."""
    from dpgrid.privacy import recorded_method
    from dpgrid.reporting.console import describe_best
    from dpgrid.results.files import read_frame, read_json
    from dpgrid.results.procedure import procedure_of

    for out, task, _ in grids:
        try:
            selection = procedure_of(recorded_method(read_json(out / "plan.json", ""))).releases_best_only
            final = read_json(out / "selection.json", "").get("final") if selection else None
            line = describe_best(read_frame(out / "summary.csv"), task, selection, final)
        except Exception as e:  # noqa: BLE001  (a summary this process cannot read: said, the sweep goes on)
            line = f"no summary ({type(e).__name__}); the grid's own files say more"
        print(f"{out.relative_to(sweep_dir.absolute()) if out.is_relative_to(sweep_dir.absolute()) else out}: {line}")
    print(f"results: {sweep_dir.absolute()} (dpgrid tables {sweep_dir} writes their tables)")


def max_array_size() -> int:
    """The cluster's MaxArraySize (scontrol show config; SLURM's default 1001): an array holds at most that many
    tasks, so a larger sweep is submitted as several arrays."""
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        found = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
        for line in found.stdout.splitlines():
            if line.split("=")[0].strip() == "MaxArraySize":
                return max(1, int(line.split("=")[1].split()[0]))
    return 1001


def executor(launcher):
    """The plugin's executor, set up as its launch sets it up (folder, per-cluster and shared parameters)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    params, cluster = launcher.params, launcher._EXECUTOR
    init = {"folder": params["submitit_folder"]}
    init.update({f"{cluster}_{k}": v for k, v in params.items() if k in {"max_num_timeout"}})
    made = submitit.AutoExecutor(cluster=cluster, **init)
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    made.update_parameters(**{k if k in shared else f"{cluster}_{k}": v for k, v in params.items()
                              if k not in {"max_num_timeout", "submitit_folder"}})
    return made


def submit(executor, task, args, array_size: int = 1001, on_refused=None) -> list:
    """executor.map_array in arrays of at most `array_size` tasks, with sbatch's refusal as dpgrid's one line
    (submitit prints sbatch's stderr itself: it is kept from the terminal and its error line quoted instead);
    `on_refused()` clears what was made for a submission of which nothing was queued."""
    from submitit.core.utils import FailedJobError


    said, jobs = io.StringIO(), []
    try:
        with contextlib.redirect_stderr(said):
            for start in range(0, len(args), array_size):
                jobs += executor.map_array(task, *zip(*args[start:start + array_size]))
            return jobs
    except FileNotFoundError:
        raise DpgridError(f"sbatch not found: {NOT_ON_A_CLUSTER}")
    except FailedJobError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no message")
        hint = ("hydra.launcher.partition= names a partition that `sinfo -s` lists" if "partition" in first.lower()
                and "memory" not in first.lower()
                else "lower hydra.launcher.mem_gb: it asks for more memory than a node of the partition has (`sinfo -o "
                "'%P %m'` lists each partition's, in MB)" if "memory" in first.lower()
                else "the SLURM controller does not answer: `scontrol ping` says whether it is up; try again once it "
                "is, or ask the cluster's admins" if "controller" in first.lower()
                else "see the hydra.launcher settings (conf/hydra/launcher/slurm.yaml)")
        if jobs:  # an earlier array of a split sweep was queued
            raise DpgridError(f"SLURM refused the jobs after {len(jobs)} were queued ({slurm.array_id(jobs)}; scancel {slurm.array_id(jobs)} "
                 f"cancels them, or the same command submits the rest): {first}; {hint}")
        if on_refused:
            on_refused()
        raise DpgridError(f"SLURM refused the jobs, nothing was queued: {first}; {hint}")


def ended_why(error, timeout_min) -> str:
    """Why a job that wrote a result ended without its grid: out of time or preempted (submitit's UncompletedJobError,
    naming hydra.launcher.timeout_min), or the error its task raised (its last line)."""
    text = str(error)
    if "timed-out" in text:
        return (f" ran out of time (its limit, hydra.launcher.timeout_min, was {timeout_min} minutes: raise it)"
                if timeout_min is not None else " ran out of time (raise hydra.launcher.timeout_min, its limit in minutes)")
    if "preempt" in text.lower():
        return " was preempted and not requeued (submitit's hydra.launcher.max_num_timeout)"
    if "SIGTERM" in text or "cancel" in text.lower():
        return " was cancelled (SIGTERM: its grid stopped between two writes)"
    last = [line.strip() for line in text.splitlines() if line.strip()]
    return f" ended with an error: {last[-1] if last else type(error).__name__}"


def outcomes(jobs, by_job: list, timeout_min=None, accounting: bool = True) -> list:
    """Each grid's result (Hydra's JobReturn), in order; `by_job`: each job's grids' overrides. Jobs that ended
    without a result are dpgrid's one line: per reason (ran out of time, naming hydra.launcher.timeout_min; the job's
    state and the grid's own error line if it printed one, else its log), the jobs it ended, once, with their count."""

    common = set.intersection(*(set(o) for grids in by_job for o in grids))  # a job is named by what its sweep varies
    ended_by, returns = {}, []
    for job, grids in zip(jobs, by_job):
        why = ""
        if job.paths.result_pickle.exists():
            try:
                found = job.results()[0]
            except Exception as e:  # noqa: BLE001  (what the job's process raised, pickled by submitit)
                why = ended_why(e, timeout_min)
            else:
                # what a real job writes when submitit's task raised (a time-out, a preemption): ('success',
                # [JobReturn(status=FAILED, return_value=the exception)]); Hydra would raise it as a traceback
                failed = [r for r in found if getattr(r, "status", None) is not None and r.status.name == "FAILED"]
                if not failed:
                    returns += found
                    continue
                why = ended_why(failed[0]._return_value, timeout_min)
        if not why:
            said = [line for line in (job.stderr() or "").splitlines() if line.startswith("dpgrid: error: ")]
            state = job.state if accounting and job.state != "UNKNOWN" else "out of the queue without a result"
            why = (f" ended {state}: {own_words(said[-1])}" if said else f" ended {state}, its log "
                   f"{job.paths.stderr}" if job.paths.stderr.exists() else f" ended {state}, no log")
        varied = " + ".join(v for v in (" ".join(o for o in overrides if o not in common) for overrides in grids) if v)
        ended_by.setdefault(why, []).append(f"{job.job_id}{f' ({varied})' if varied else ''}")
    if ended_by:
        count = sum(len(names) for names in ended_by.values())
        parts = [f"{names[0]}{reason}" if len(names) == 1 else f"{len(names)} jobs ({slurm.compact(names)}){reason}"
                 for reason, names in ended_by.items()]
        raise DpgridError(f"{count} of {len(jobs)} SLURM job(s) ended before their grid finished: {' | '.join(parts)}; "
                          f"{RESUMES}")
    return returns


RESUMES = "the same command resumes them (finished runs are kept)"


def own_words(line: str) -> str:
    """A job's grid's own error line, without its "dpgrid: error: " and without saying that the same command resumes it
    (a grid stopped by scancel says so): the submitter's line says it once, for every job."""
    return re.sub(r";\s*the same command resumes it$", "", line[len("dpgrid: error: "):].strip())


def log_folder(jobs) -> str:
    return str(Path(jobs[0].paths.folder).parent)
