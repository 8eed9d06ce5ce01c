"""What SLURM says of a sweep's jobs, for dpgrid's SLURM launcher (dpgrid.commands.launchers): which are still in the queue
(squeue), why pending ones wait and which reasons waiting never resolves (and the setting that asks for too much),
whether SLURM's accounting (sacct) answers here, and the jobs each sweep queued (recorded with it, so that a resume
never queues a grid whose job is still queued or running)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dpgrid import DpgridError

# pending reasons that waiting never resolves: each job asks for what the partition, QOS or account never gives
# (per-job limits; group and per-user limits, held priorities and nodes down or reserved clear as other jobs end),
# with the setting that asks
NEVER = {"PartitionTimeLimit": "timeout_min", "QOSMaxWallDurationPerJobLimit": "timeout_min",
         "AssocMaxWallDurationPerJobLimit": "timeout_min", "PartitionNodeLimit": "nodes",
         "QOSMaxNodePerJobLimit": "nodes", "AssocMaxNodePerJobLimit": "nodes", "QOSMaxCpuPerJobLimit": "cpus_per_task",
         "AssocMaxCpuPerJobLimit": "cpus_per_task", "QOSMaxMemoryPerJob": "mem_gb", "AssocMaxMemPerJob": "mem_gb",
         "QOSMaxGRESPerJob": "gpus_per_node", "AssocMaxGRESPerJob": "gpus_per_node", "InvalidAccount": "account",
         "InvalidQOS": "qos", "BadConstraints": "constraint", "PartitionConfig": None}
JOBS = "dpgrid_jobs.json"  # in a sweep's .submitit folder: {run directory: the job that trains it}
POLL_S = 10.0  # between two looks at the queue; submitit itself asks sacct at most this often
GONE_POLLS = 2  # looks at the queue that must not list a job without a result before it counts as ended


def listed(jobs) -> dict | None:
    """{job id: (state, reason)} of the jobs squeue lists (any state: pending, running, completing), one per array
    element; None where there is no squeue."""
    if shutil.which("squeue") is None:
        return None
    arrays = ",".join(sorted({array_of(j.job_id) for j in jobs}))
    found = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", arrays], capture_output=True, text=True)
    entries = {}
    for line in found.stdout.splitlines():
        job_id, state, reason = (line.split("|") + ["", ""])[:3]
        entries[job_id] = (state, reason)
    return entries


def pending_reasons(jobs) -> dict:
    """{reason: [job ids]} of the pending jobs, as squeue gives them ({} without squeue). A reason SLURM has not set
    yet ("None") is no reason."""
    reasons = {}
    for job_id, (state, reason) in (listed(jobs) or {}).items():
        if state == "PENDING" and reason not in ("", "None", "(null)"):
            reasons.setdefault(reason, []).append(job_id)
    return reasons


def describe_pending(reasons: dict) -> str:
    return "; ".join(f"{len(ids)} SLURM job(s) pending ({reason}: {compact(ids)})" for reason, ids in sorted(reasons.items()))


def never_starts(reasons: dict) -> dict:
    """The reasons among `reasons` that waiting never resolves."""
    return {r: ids for r, ids in reasons.items() if r in NEVER}


def settings_to_lower(reasons, params: dict) -> list:
    """The hydra.launcher settings that ask for more than the cluster gives, for these pending reasons: each reason's
    own, and for PartitionConfig (SLURM's word for any request beyond the partition's limits) the requests that
    exceed what `sinfo` says the partition gives (all of them where it does not say)."""
    named = {NEVER[r] for r in reasons if NEVER.get(r)}
    if "PartitionConfig" in reasons:
        named |= beyond_partition(params) or {"cpus_per_task", "mem_gb", "timeout_min", "gpus_per_node"}
    return sorted(named)


def beyond_partition(params: dict) -> set:
    """The requests that exceed the partition's limits as `sinfo` gives them (its time limit, CPUs and memory per
    node); empty where sinfo does not answer."""
    partition = params.get("partition")
    command = ["sinfo", "-h", "-o", "%P|%l|%c|%m"] + (["-p", str(partition)] if partition else [])
    try:
        found = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    lines = [line.split("|") for line in found.splitlines() if line.count("|") == 3]
    if not partition:  # the default partition is marked with a *
        lines = [line for line in lines if line[0].endswith("*")] or lines
    if not lines:
        return set()
    _, time_limit, cpus, memory = lines[0]
    beyond = set()
    minutes = limit_minutes(time_limit)
    if minutes is not None and float(params.get("timeout_min") or 0) > minutes:
        beyond.add("timeout_min")
    if cpus.rstrip("+").isdigit() and int(params.get("cpus_per_task") or 1) * int(params.get("tasks_per_node") or 1) > int(cpus.rstrip("+")):
        beyond.add("cpus_per_task")
    if memory.rstrip("+").isdigit() and float(params.get("mem_gb") or 0) * 1024 > int(memory.rstrip("+")):
        beyond.add("mem_gb")
    return beyond


def limit_minutes(text: str):
    """A SLURM time limit ([days-]hours:minutes:seconds, minutes:seconds, "infinite") in minutes; None for none."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return days * 1440 + hours * 60 + minutes + seconds / 60


def accounting_answers(jobs) -> tuple:
    """(whether sacct answers for these jobs, what it said when it does not). Without SLURM's accounting database,
    a job that leaves the queue is known only by its result file (or its absence)."""
    try:
        found = subprocess.run(["sacct", "-n", "-X", "-j", array_of(jobs[0].job_id)], capture_output=True, text=True,
                               timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    said = (found.stderr or "").strip().splitlines()
    return found.returncode == 0, said[0] if said else f"exit {found.returncode}"


def record_jobs(sweep_dir: Path, jobs_of: dict) -> None:
    """Keep with the sweep which job trains which run directory ({run directory: job id})."""
    from dpgrid.results.files import read_json, write_json

    path = Path(sweep_dir) / ".submitit" / JOBS
    recorded = {}
    with contextlib.suppress(Exception):
        recorded = read_json(path, "")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {**recorded, **{str(out): str(job_id) for out, job_id in jobs_of.items()}})


def still_queued(sweep_dir: Path, outs: list) -> dict:
    """{run directory: job id} of the grids among `outs` whose recorded job (an earlier submission's) squeue still
    lists, queued or running."""
    path = Path(sweep_dir) / ".submitit" / JOBS
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    mine = {str(out): recorded[str(out)] for out in outs if str(out) in recorded}
    if not mine or shutil.which("squeue") is None:
        return {}

    class Recorded:
        def __init__(self, job_id):
            self.job_id = job_id

    alive = listed([Recorded(j) for j in mine.values()]) or {}
    return {out: job_id for out, job_id in mine.items() if job_id in alive}


def still_queued_refusal(live: dict) -> DpgridError:
    """The refusal of a sweep some of whose grids an earlier submission's jobs still hold (`live`: {run directory: job
    id}, queued or running): queueing them again would train a grid twice. It names the jobs and how to wait for or
    cancel them."""
    ids = ",".join(sorted({array_of(j) for j in live.values()}))
    return DpgridError(f"{len(live)} grid(s) of this sweep are still queued or running as SLURM job(s) of an earlier "
                       f"submission ({compact(sorted(live.values()))}); nothing was queued again: wait for them (squeue "
                       f"-j {ids}), or cancel them (scancel {ids}), then run the same command, which resumes what they "
                       "leave")


def wait(jobs, params: dict) -> bool:
    """Whether SLURM's accounting answers here, once every job has ended: until then, saying why pending jobs wait whenever the reasons change (not as the counts drain).
    A job has ended once squeue no longer lists it and its result file is there, or submitit's sacct says so, or it
    has left the queue for GONE_POLLS looks without a result (a cluster without accounting: a cancelled job). A job
    that is requeued (a node failure) is listed again, and waited for. Jobs that can never start (every job left is
    pending for a reason waiting never resolves) are cancelled: one line naming the settings to lower, exit 2."""

    accounting, said_why = accounting_answers(jobs)
    if not accounting:  # said once; submitit's own sacct calls (and their warnings) are not made then
        print(f"dpgrid: SLURM's accounting (sacct) does not answer here ({said_why}): the jobs are followed with "
              "squeue and their result files; a job that leaves the queue without a result is reported as ended",
              file=sys.stderr, flush=True)
    said, gone = None, {}
    while True:
        queued = listed(jobs)
        left = [job for job in jobs if not ended(job, queued, gone, accounting)]
        if not left:
            return accounting
        reasons = {}
        for job_id, (state, reason) in (queued or {}).items():
            if state == "PENDING" and reason not in ("", "None", "(null)"):
                reasons.setdefault(reason, []).append(job_id)
        never = never_starts(reasons)
        if never and sum(len(ids) for ids in never.values()) >= len(left):
            cancel_pending(jobs)
            lower = ", ".join(f"hydra.launcher.{s}" for s in settings_to_lower(never, params))
            raise DpgridError(f"{len(left)} SLURM job(s) can never start ({', '.join(sorted(never))}: each asks for more than the "
                 f"partition, QOS or account gives); cancelled them (scancel --state=PENDING {array_id(jobs)}); "
                 f"ask for less: {lower} (`sinfo -o '%P %c %m %l'` lists what each partition gives), and run the "
                 "same command again")
        if reasons and set(reasons) != said:
            print(f"dpgrid: {describe_pending(reasons)}", file=sys.stderr, flush=True)
            said = set(reasons)
        time.sleep(POLL_S)


def ended(job, queued, gone: dict, accounting: bool) -> bool:
    """Whether `job` has ended (see `wait`); `gone` counts the looks that found it out of the queue."""
    if queued is not None and job.job_id in queued:
        gone.pop(job.job_id, None)
        return False
    if job.paths.result_pickle.exists():
        return True
    if queued is not None:
        gone[job.job_id] = gone.get(job.job_id, 0) + 1
        if gone[job.job_id] >= GONE_POLLS:
            return True
    return accounting and job.done()


def cancel_pending(jobs) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["scancel", "--state=PENDING", array_id(jobs)], capture_output=True, timeout=60)


def array_id(jobs) -> str:
    """The array job(s) of `jobs`: 4242, or 4242,4243 when the sweep was split at MaxArraySize."""
    return ",".join(dict.fromkeys(array_of(j.job_id) for j in jobs))


def array_of(job_id) -> str:
    """The array job of a task's id (4242_0 -> 4242)."""
    return str(job_id).split("_")[0]


def compact(ids: list) -> str:
    return ", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
