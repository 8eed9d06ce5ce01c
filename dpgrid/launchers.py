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
import shutil
import subprocess
import sys
import time
from pathlib import Path

NOT_ON_A_CLUSTER = ("hydra/launcher=slurm submits from a machine of a SLURM cluster (a login node); "
                    "hydra/launcher=local runs the sweep's grids side by side on this machine")
POLL_S = 10.0  # between two looks at the queue; submitit itself asks sacct at most this often
# pending reasons that do not resolve by waiting: the job asks for what the partition, QOS or account cannot give
HOPELESS = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "ReqNodeNotAvail", "QOSMax", "AssocMax",
            "AssocGrp", "InvalidAccount", "InvalidQOS", "BadConstraints")


def launch(launcher, job_overrides, initial_job_idx) -> list:
    """The plugin's launch (one SLURM array job, one task per grid), with dpgrid's submission, wait and errors."""
    from hydra.core.singleton import Singleton

    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in launcher.config.hydra.sweep:  # as the plugin: hydra.sweep.mode sets the folder's permissions
        os.chmod(sweep_dir, int(str(launcher.config.hydra.sweep.mode), 8))
    args = [(list(overrides), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}",
             Singleton.get_state()) for i, overrides in enumerate(job_overrides)]
    try:
        made = executor(launcher)
    except RuntimeError as e:  # submitit looks for srun first
        from dpgrid.cli import fail

        fail(f"no SLURM on this machine ({e}): {NOT_ON_A_CLUSTER}")
    jobs = submit(made, launcher, args)
    print(f"dpgrid: submitted {len(jobs)} SLURM job(s) as {array_id(jobs)}; their logs: {log_folder(jobs)}",
          file=sys.stderr, flush=True)
    try:
        wait(jobs)
    except KeyboardInterrupt as e:
        from dpgrid.cli import Interrupted, fail

        left = [j.job_id for j in jobs if not j.done()]
        name, code = ("SIGTERM", 143) if isinstance(e, Interrupted) else ("interrupted", 130)
        fail(f"{name}: {len(left)} SLURM job(s) go on queued or running without this process ({compact(left)}): "
             f"squeue -j {array_id(jobs)} shows them, scancel {array_id(jobs)} cancels them; the same command "
             "resumes any grid left incomplete", code)
    return outcomes(jobs, job_overrides)


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


def submit(executor, task, args) -> list:
    """executor.map_array, with sbatch's refusal as dpgrid's one line (submitit prints sbatch's stderr itself:
    it is kept from the terminal and its error line quoted instead)."""
    from submitit.core.utils import FailedJobError

    from dpgrid.cli import fail

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return executor.map_array(task, *zip(*args))
    except FileNotFoundError:
        fail(f"sbatch not found: {NOT_ON_A_CLUSTER}")
    except FailedJobError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no message")
        hint = ("hydra.launcher.partition= names a partition that `sinfo -s` lists" if "partition" in first.lower()
                else "see the hydra.launcher settings (conf/hydra/launcher/slurm.yaml)")
        fail(f"SLURM refused the jobs, nothing was queued: {first}; {hint}")


def wait(jobs, poll_s: float = POLL_S) -> None:
    """Until every job has ended, saying why pending jobs wait whenever that changes."""
    said = None
    while not all(job.done() for job in jobs):
        reasons = pending_reasons(jobs)
        if reasons and reasons != said:
            print(f"dpgrid: {describe_pending(reasons)}", file=sys.stderr, flush=True)
            said = reasons
        time.sleep(poll_s)


def pending_reasons(jobs) -> dict:
    """{reason: [job ids]} of the pending jobs, as squeue gives them ({} without squeue)."""
    if shutil.which("squeue") is None:
        return {}
    found = subprocess.run(["squeue", "-h", "-o", "%i|%T|%r", "-j", ",".join(sorted({array_of(j.job_id) for j in jobs}))],
                           capture_output=True, text=True)
    reasons = {}
    for line in found.stdout.splitlines():
        job_id, state, reason = (line.split("|") + ["", ""])[:3]
        if state == "PENDING":
            reasons.setdefault(reason or "no reason given", []).append(job_id)
    return reasons


def describe_pending(reasons: dict) -> str:
    parts = []
    for reason, ids in sorted(reasons.items()):
        part = f"{len(ids)} SLURM job(s) pending ({reason}: {compact(ids)})"
        if any(reason.startswith(h) for h in HOPELESS):
            part += (" and they will not start: they ask for more than the partition, QOS or account gives; scancel "
                     f"{array_of(ids[0])} and ask for less (hydra.launcher.cpus_per_task, mem_gb, timeout_min, "
                     "partition)")
        parts.append(part)
    return "; ".join(parts)


def outcomes(jobs, job_overrides) -> list:
    """Each job's result (Hydra's JobReturn); a job that ended without one is dpgrid's one line, naming its
    state, the grid's own error line if it printed one, and its log."""
    from dpgrid.cli import fail

    common = set.intersection(*(set(o) for o in job_overrides))  # a job is named by what its sweep varies
    ended = []
    for job, overrides in zip(jobs, job_overrides):
        if job.paths.result_pickle.exists():
            continue
        said = [line for line in (job.stderr() or "").splitlines() if line.startswith("dpgrid: error: ")]
        why = (f": {said[-1][len('dpgrid: error: '):]}" if said else f", its log {job.paths.stderr}"
               if job.paths.stderr.exists() else ", no log")
        varied = " ".join(o for o in overrides if o not in common)
        ended.append(f"{job.job_id}{f' ({varied})' if varied else ''} ended {job.state}{why}")
    if ended:
        fail(f"{len(ended)} of {len(jobs)} SLURM job(s) ended before their grid finished: {' | '.join(ended)}; "
             "the same command resumes them (finished runs are kept)")
    return [job.results()[0] for job in jobs]


def array_id(jobs) -> str:
    return array_of(jobs[0].job_id)


def array_of(job_id) -> str:
    """The array job of a task's id (4242_0 -> 4242)."""
    return str(job_id).split("_")[0]


def log_folder(jobs) -> str:
    return str(Path(jobs[0].paths.folder).parent)


def compact(ids: list) -> str:
    return ", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
