"""`dpgrid run -m hydra/launcher=slurm` without a cluster: sbatch, sacct and squeue are small scripts on PATH
that answer as SLURM 22.05 does for a refused partition, a cancelled job and a job that cannot start."""

import os
import signal
import subprocess
import sys

import pytest

from dpgrid.commands import slurm as slurm_module

from .command import dpgrid

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
pytestmark = pytest.mark.slow  # each test runs a sweep (in this process; Ctrl-C in a real one)

SWEEP = ["-m", "hydra/launcher=slurm", "strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=1",
         "train.eval_every=4", "privacy.epsilon=3,5"]  # two grids
ONE_GRID = ["-m", "hydra/launcher=slurm", "strategy=nodp", "grid.k=2", "train.seeds=1", "train.epochs=1",
            "train.eval_every=4", "privacy.epsilon=3,5"]  # nodp reads no epsilon: one grid in one directory

FAKES = {
    "sbatch": """
if [ "$FAKE_SLURM" = refuse ]; then
  echo "sbatch: error: invalid partition specified: nopart" >&2
  echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
  exit 1
fi
if [ "$FAKE_SLURM" = memory ]; then
  echo "sbatch: error: Memory specification can not be satisfied" >&2
  echo "sbatch: error: Batch job submission failed: Requested node configuration is not available" >&2
  exit 1
fi
echo "$@" >> "$FAKE_SLURM_LOG"
if [ "$FAKE_SLURM" = fail ]; then  # the first job's grid refused something and said so in its log, as dpgrid does
  log="$(dirname "$1")/${FAKE_SLURM_ID}_0"; mkdir -p "$log"
  printf 'loading\ndpgrid: error: another dpgrid process is writing into /x\n' > "$log/${FAKE_SLURM_ID}_0_0_log.err"
fi
id=$((FAKE_SLURM_ID + $(grep -c '^/' "$FAKE_SLURM_LOG") - 1))  # one id per array: a split sweep's second is id + 1
if [ "$FAKE_SLURM" = run ]; then  # run each task here, in the background, once submitit has written its pickle
  last=$(sed -n 's/^#SBATCH --array=0-\\([0-9]*\\).*/\\1/p' "$1")  # none: one job, not an array
  folder=$(sed -n 's/.* -m submitit.core._submit //p' "$1")
  python=$(sed -n 's/.* \\([^ ]*\\) -u -m submitit.core._submit .*/\\1/p' "$1")
  for i in $(seq 0 "${last:-0}"); do
    j="${id}_$i"; [ -z "$last" ] && j=$id; touch "$(dirname "$FAKE_SLURM_LOG")/queued_$j"  # squeue lists it till it ends
    (job="${id}_$i"; [ -z "$last" ] && job=$id
     task=$(echo "$folder" | sed "s/%j/$job/")
     n=0; while [ ! -f "$task/${job}_submitted.pkl" ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n + 1)); done  # else FAILED
     number=$id; [ -n "$last" ] && { number=$((id * 100 + i)); export SLURM_ARRAY_JOB_ID=$id SLURM_ARRAY_TASK_ID=$i; }
     SUBMITIT_EXECUTOR=slurm SLURM_JOB_ID=$number SLURM_NTASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 \
     SLURM_NODEID=0 SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST=node \
       "$python" -u -m submitit.core._submit "$folder" > "$task/${job}_0_log.out" 2> "$task/${job}_0_log.err"
     state=COMPLETED; [ -f "$task/${job}_0_result.pkl" ] || state=FAILED  # what sacct says once it has ended
     echo "$state" > "$(dirname "$FAKE_SLURM_LOG")/state_$job"
    ) < /dev/null > /dev/null 2>&1 &  # sbatch itself returns at once, as SLURM's
  done
fi
echo "Submitted batch job $id"
""",
    "sacct": """
if [ "$FAKE_SLURM" = noacct ]; then  # a cluster without its accounting database
  echo "Slurm accounting storage is disabled" >&2; exit 1
fi
if [ "$FAKE_SLURM" = timeout ] || [ "$FAKE_SLURM" = preempted ]; then  # what a real job writes when submitit's
  # task raised (its time ran out, it was preempted): Hydra's JobReturn, FAILED, holding submitit's error
  why="timed-out too many times"; [ "$FAKE_SLURM" = preempted ] && why="preempted too many times"
  for d in "$(dirname "$FAKE_SLURM_LOG")"/sweep/.submitit/*/; do
    [ -d "$d" ] && "$FAKE_PYTHON" -c "
import pickle, sys
from hydra.core.utils import JobReturn, JobStatus
from submitit.core.utils import UncompletedJobError
done = JobReturn(status=JobStatus.FAILED, _return_value=UncompletedJobError('Job not requeued because: ' + sys.argv[2] + '.'))
pickle.dump(('success', [done]), open(sys.argv[1], 'wb'))" "$d$(basename "$d")_0_result.pkl" "$why"
  done
  echo "JobID|State|NodeList"; echo "${FAKE_SLURM_ID}_0|COMPLETED|node"; echo "${FAKE_SLURM_ID}_1|COMPLETED|node"; exit 0
fi
if [ "$FAKE_SLURM" = requeued ]; then  # SLURM requeued the tasks after their node failed; sacct's last word for now
  echo "JobID|State|NodeList"; echo "${FAKE_SLURM_ID}_0|NODE_FAIL|node"; echo "${FAKE_SLURM_ID}_1|NODE_FAIL|node"; exit 0
fi
if [ "$FAKE_SLURM" = run ]; then  # the tasks that ended; the others are not listed yet
  echo "JobID|State|NodeList"
  for f in "$(dirname "$FAKE_SLURM_LOG")"/state_*; do [ -f "$f" ] && echo "${f##*/state_}|$(cat "$f")|node"; done
  exit 0
fi
state=PENDING; [ "$FAKE_SLURM" = cancel ] && state="CANCELLED by 1000"; [ "$FAKE_SLURM" = fail ] && state=FAILED
[ "$FAKE_SLURM" = run ] && state=RUNNING  # a task's result pickle tells submitit it has ended
echo "JobID|State|NodeList"; echo "${FAKE_SLURM_ID}_0|$state|None assigned"; echo "${FAKE_SLURM_ID}_1|$state|None assigned"
""",
    "srun": "exit 0\n",  # submitit checks it is there
    "scontrol": 'echo "MaxArraySize            = ${FAKE_MAX_ARRAY:-1001}"\n',
    "squeue": """
calls="$(dirname "$FAKE_SLURM_LOG")/squeue_calls"; echo x >> "$calls"
case "$FAKE_SLURM" in
  run) for f in "$(dirname "$FAKE_SLURM_LOG")"/queued_*; do  # queued or running until its task has ended
         [ -f "$f" ] || continue; j="${f##*/queued_}"
         [ -f "$(dirname "$FAKE_SLURM_LOG")/state_$j" ] || echo "$j|RUNNING|None"; done;;
  requeued) [ "$(wc -l < "$calls")" -le 4 ] && { echo "${FAKE_SLURM_ID}_0|PENDING|BeginTime";
                                                echo "${FAKE_SLURM_ID}_1|PENDING|BeginTime"; };;
  pending) echo "${FAKE_SLURM_ID}_0|PENDING|Priority"; echo "${FAKE_SLURM_ID}_1|PENDING|Priority";;
  mixed) echo "${FAKE_SLURM_ID}_0|RUNNING|None"; echo "${FAKE_SLURM_ID}_1|PENDING|Priority";;
  never) echo "${FAKE_SLURM_ID}_0|PENDING|PartitionConfig"; echo "${FAKE_SLURM_ID}_1|PENDING|QOSMaxCpuPerJobLimit";;
  none)  # right after submission SLURM has no reason yet; an array waiting whole is one collapsed line without -r
    case "$*" in *-r*) echo "${FAKE_SLURM_ID}_0|PENDING|None"; echo "${FAKE_SLURM_ID}_1|PENDING|None";;
                 *) echo "${FAKE_SLURM_ID}_[0-1]|PENDING|None";; esac;;
esac
exit 0
""",
    "scancel": 'echo "scancel $*" >> "$FAKE_SLURM_LOG"\n',
    "sinfo": 'echo "cpu*|4:00:00|8|16000"\n',  # the default partition: 4 hours, 8 CPUs and 16 GB per node
}


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """The fake SLURM commands first on PATH, answering in `mode`; each test's jobs have their own id (submitit
    remembers job states for the process). Returns the environment, for a real process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)

    def use(mode, job_id):
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_SLURM", mode)
        monkeypatch.setenv("FAKE_SLURM_ID", str(job_id))
        monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "sbatch.log"))
        monkeypatch.setenv("FAKE_PYTHON", sys.executable)
        return dict(os.environ)
    return use


def test_a_machine_without_slurm_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not os.path.isfile(os.path.join(p, "srun"))))
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("dpgrid: error: no SLURM on this machine (") and "hydra/launcher=local" in r.stderr, r.stderr


def test_a_partition_slurm_refuses_is_one_line_and_nothing_is_queued(slurm, tmp_path):
    slurm("refuse", 4241)
    r = dpgrid("run", *SWEEP, "hydra.launcher.partition=nopart", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "dpgrid: error: SLURM refused the jobs, nothing was queued: sbatch: error: invalid partition specified: nopart; "
        "hydra.launcher.partition= names a partition that `sinfo -s` lists"], r.stderr
    assert not (tmp_path / "sweep").exists()  # nothing left: no multirun.yaml, no job pickle


def test_a_cancelled_job_is_one_line_saying_the_same_command_resumes(slurm, tmp_path):
    slurm("cancel", 4242)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("dpgrid: submitted 2 SLURM job(s) as 4242; their logs: ") and ".submitit" in lines[0]
    assert len(lines) == 2 and lines[1].startswith("dpgrid: error: 2 of 2 SLURM job(s) ended before their grid finished: "
                                                   "2 jobs (4242_0 (privacy.epsilon=3), 4242_1 (privacy.epsilon=5)) "
                                                   "ended CANCELLED by 1000, no log;"), r.stderr  # one reason, once
    assert lines[1].endswith("the same command resumes them (finished runs are kept)")
    submitted = (tmp_path / "sbatch.log").read_text()
    assert submitted.count("\n") == 1  # one array job for the sweep
    script = next((tmp_path / "sweep" / ".submitit").rglob("*submission_file*")).read_text()
    assert "#SBATCH --job-name=dpgrid" in script and "#SBATCH --array=0-1" in script


def test_a_job_whose_grid_failed_is_named_with_the_grids_own_error(slurm, tmp_path):
    slurm("fail", 4243)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[1:] == [
        "dpgrid: error: 2 of 2 SLURM job(s) ended before their grid finished: 4243_0 (privacy.epsilon=3) ended FAILED: "
        "another dpgrid process is writing into /x | 4243_1 (privacy.epsilon=5) ended FAILED, no log; the "
        "same command resumes them (finished runs are kept)"], r.stderr


def test_an_interrupted_submitter_names_the_jobs_still_queued_and_how_to_cancel_them(slurm, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "dpgrid.commands.cli", "run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=slurm("pending", 4244))
    lines = [proc.stderr.readline(), proc.stderr.readline()]  # submitted; then why the jobs wait
    assert lines[1].strip() == "dpgrid: 2 SLURM job(s) pending (Priority: 4244_0, 4244_1)", lines
    proc.send_signal(signal.SIGINT)  # the submitter now waits on the queue: Ctrl-C
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert rest.strip().splitlines() == [
        "dpgrid: error: interrupted: 2 SLURM job(s) go on queued or running without this process (4244_0, 4244_1): "
        "squeue -j 4244 shows them, scancel 4244 cancels them; while they are queued or running the same command refuses "
        "to queue their grids again, and once they have ended it resumes any grid left incomplete"], rest


def test_jobs_that_can_never_start_are_cancelled_in_one_line(slurm, tmp_path):
    slurm("never", 4245)
    r = dpgrid("run", *SWEEP, "hydra.launcher.cpus_per_task=64", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith(
        "dpgrid: error: 2 SLURM job(s) can never start (PartitionConfig, QOSMaxCpuPerJobLimit: each asks for more than "
        "the partition, QOS or account gives); cancelled them (scancel --state=PENDING 4245); ask for less: "
        "hydra.launcher.cpus_per_task, hydra.launcher.timeout_min (`sinfo"), r.stderr  # sinfo: 8 CPUs, 4 hours
    assert "scancel --state=PENDING 4245" in (tmp_path / "sbatch.log").read_text()


def test_pending_jobs_are_counted_per_array_element_and_no_reason_is_not_said(slurm):
    from dpgrid.commands import launchers

    slurm("none", 4246)

    class Job:
        def __init__(self, i):
            self.job_id = f"4246_{i}"
    assert slurm_module.pending_reasons([Job(0), Job(1)]) == {}  # "None": SLURM has not said yet
    slurm("pending", 4246)
    assert slurm_module.pending_reasons([Job(0), Job(1)]) == {"Priority": ["4246_0", "4246_1"]}
    assert slurm_module.describe_pending({"Priority": ["4246_0", "4246_1"]}) == \
        "2 SLURM job(s) pending (Priority: 4246_0, 4246_1)"


def test_a_launcher_hydra_cannot_find_is_one_line_naming_the_install_that_fixes_it(slurm, tmp_path, monkeypatch):
    """As after `pip install -e .` in setuptools' default editable mode: Hydra's discovery misses hydra_plugins."""
    from hydra.core.plugins import Plugins

    discover = Plugins.discover
    monkeypatch.setattr(Plugins, "discover", lambda self, kind=None: [
        c for c in discover(self, kind) if f"{c.__module__}.{c.__name__}" != "hydra_plugins.dpgrid_launcher.SlurmLauncher"])
    slurm("pending", 4247)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "pip install -e \".[cluster]\" --config-settings editable_mode=compat" in r.stderr, r.stderr
    assert not (tmp_path / "sbatch.log").exists() and not (tmp_path / "sweep").exists()


def test_a_job_that_ran_out_of_time_names_the_setting_and_how_to_resume(slurm, tmp_path):
    """submitit catches SLURM's warning signal, so sacct says COMPLETED: its result file says the job timed out."""
    slurm("timeout", 4251)
    r = dpgrid("run", *SWEEP, "hydra.launcher.timeout_min=3", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1] == (
        "dpgrid: error: 2 of 2 SLURM job(s) ended before their grid finished: 2 jobs (4251_0 (privacy.epsilon=3), "
        "4251_1 (privacy.epsilon=5)) ran out of time (its limit, hydra.launcher.timeout_min, was 3 minutes: raise it); "
        "the same command resumes them (finished runs are kept)"), r.stderr
    assert "results:" not in r.stdout and "no summary" not in r.stdout


def test_a_preempted_job_is_one_line_saying_the_same_command_resumes(slurm, tmp_path):
    slurm("preempted", 4261)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith("was preempted and not requeued (submitit's "
                                                      "hydra.launcher.max_num_timeout); the same command resumes them "
                                                      "(finished runs are kept)"), r.stderr


def test_memory_a_node_cannot_give_names_mem_gb_and_a_refusal_changes_no_file_of_the_sweep(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("an earlier sweep's record\n")
    slurm("memory", 4262)
    r = dpgrid("run", *SWEEP, "hydra.launcher.mem_gb=4000", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2 and "lower hydra.launcher.mem_gb" in r.stderr, r.stderr
    assert (sweep / "multirun.yaml").read_text() == "an earlier sweep's record\n"
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"]


def test_a_cluster_without_accounting_notices_a_cancelled_job(slurm, tmp_path, monkeypatch):
    """No sacct: a job that has left the queue without a result is reported as ended (not waited for), and the
    missing accounting is said once."""
    monkeypatch.setattr(slurm_module, "POLL_S", 0.2)
    slurm("noacct", 4252)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3 and lines[1].startswith("dpgrid: SLURM's accounting (sacct) does not answer here (Slurm "
                                                   "accounting storage is disabled)"), r.stderr
    assert "ended out of the queue without a result" in lines[2] and "accounting" not in r.stdout


def test_a_requeued_job_is_waited_for(slurm, tmp_path, monkeypatch):
    """After a node failure sacct says NODE_FAIL while SLURM has put the job back in the queue: the submitter waits
    as long as squeue lists it."""
    monkeypatch.setattr(slurm_module, "POLL_S", 0.2)
    slurm("requeued", 4253)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and "2 SLURM job(s) pending (BeginTime" in r.stderr, r.stderr
    assert (tmp_path / "squeue_calls").read_text().count("x") >= 5  # listed for 4 looks, then gone for 2


def test_a_resume_never_queues_a_grid_whose_job_is_still_queued(slurm, tmp_path):
    """The interrupted submitter's jobs are recorded with the sweep; while squeue lists them, the same command queues
    nothing again and says what to do."""
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    proc = subprocess.Popen([sys.executable, "-m", "dpgrid.commands.cli", "run", *SWEEP, sweep], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=slurm("pending", 4254))
    proc.stderr.readline(), proc.stderr.readline()  # submitted; then why the jobs wait
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130 and "the same command refuses to queue their grids again" in rest, rest
    submitted = (tmp_path / "sbatch.log").read_text()
    r = dpgrid("run", *SWEEP, sweep)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "2 grid(s) of this sweep are still queued or running as SLURM job(s) of an earlier submission (4254_0, " \
           "4254_1); nothing was queued again: wait for them (squeue -j 4254), or cancel them (scancel 4254)" in r.stderr
    assert (tmp_path / "sbatch.log").read_text() == submitted


def test_a_resume_while_one_job_runs_and_one_pends_names_them_not_the_lock(slurm, tmp_path):
    """The running job holds its grid's lock: the resume names both jobs with squeue and scancel, as when both pend,
    never "another dpgrid process is writing" (whose advice, another directory, would train the grid twice)."""
    from dpgrid.results.files import locked

    sweep = tmp_path / "sweep"
    outs = [sweep / "digits" / "fixed_threshold" / f"eps{e}" / "k2" for e in (3, 5)]
    slurm_module.record_jobs(sweep, {outs[0]: "4300_0", outs[1]: "4300_1"})  # as the first submission recorded them
    slurm("mixed", 4300)  # 4300_0 running, 4300_1 pending
    outs[0].mkdir(parents=True)
    with locked(outs[0]):  # the running job's hold
        r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "another dpgrid process" not in r.stderr
    assert "2 grid(s) of this sweep are still queued or running as SLURM job(s) of an earlier submission (4300_0, " \
           "4300_1); nothing was queued again: wait for them (squeue -j 4300), or cancel them (scancel 4300)" in r.stderr
    assert not (tmp_path / "sbatch.log").exists()


@pytest.mark.parametrize("memory, gigabytes", [("4GB", 4), ("4G", 4), ("1536M", 2), ("1T", 1024)])
def test_memory_with_a_unit_is_refused_with_advice_that_works_when_followed(slurm, tmp_path, memory, gigabytes):
    slurm("pending", 4301)
    args = [*SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    r = dpgrid("run", *args, f"+hydra.launcher.mem={memory}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    advice = f"hydra.launcher.mem_gb={gigabytes}"
    assert f"set {advice}" in r.stderr and "megabytes" not in r.stderr, r.stderr
    slurm("cancel", 4302)  # followed: the jobs are queued (and end as the fake SLURM says), asking for those gigabytes
    r = dpgrid("run", *args, advice)
    assert "submitted 2 SLURM job(s)" in r.stderr, r.stderr
    script = next((tmp_path / "sweep" / ".submitit").rglob("*submission_file*")).read_text()
    assert f"#SBATCH --mem={gigabytes}GB" in script


@pytest.mark.parametrize("override, message", [
    ("+hydra.launcher.mem=8", "hydra.launcher.mem=8 would ask SLURM for 8 megabytes (sbatch's --mem); set "
                              "hydra.launcher.mem_gb=8 for gigabytes"),
    ("+hydra.launcher.cpu_per_task=8", "no setting 'hydra.launcher.cpu_per_task'; did you mean "
                                       "hydra.launcher.cpus_per_task?"),
    ("hydra/launcher=slrum", "no hydra/launcher named 'slrum' (did you mean hydra/launcher=slurm?); available: basic, "),
])
def test_launcher_settings_that_would_mislead_are_one_line(slurm, tmp_path, override, message):
    slurm("pending", 4255)
    args = [a for a in SWEEP if not a.startswith("hydra/launcher")] + (
        [override] if override.startswith("hydra/launcher") else ["hydra/launcher=slurm", override])
    r = dpgrid("run", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    assert "_schema" not in r.stderr and not (tmp_path / "sbatch.log").exists()


def test_an_editable_install_hydra_cannot_see_gets_its_fix_from_hydras_own_error(tmp_path):
    """Hydra's real failure when its plugin discovery misses hydra_plugins.dpgrid_launcher (a default-mode editable
    install): composing hydra/launcher=slurm raises "Could not load 'hydra/launcher/dpgrid_slurm_schema'", which
    dpgrid turns into the install that fixes it. Reproduced in a fresh process whose hydra_plugins namespace lacks
    dpgrid's folder, as such an install leaves it, and keeps every other plugin (after `pip install .` they share one
    folder with dpgrid's)."""
    code = ("import hydra_plugins, pathlib, sys\n"
            "seen = pathlib.Path(sys.argv[1])\n"
            "seen.mkdir()\n"
            "for folder in list(hydra_plugins.__path__):\n"
            "    for entry in pathlib.Path(folder).iterdir():\n"
            "        if entry.name != 'dpgrid_launcher' and not (seen / entry.name).exists():\n"
            "            (seen / entry.name).symlink_to(entry)\n"
            "hydra_plugins.__path__._path[:] = [str(seen)]\n"
            "hydra_plugins.__path__._recalculate = lambda: hydra_plugins.__path__._path\n"
            "import dpgrid\n"
            "try:\n    dpgrid.compose(['hydra/launcher=slurm'], with_hydra=True)\n"
            "except dpgrid.DpgridError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "hydra_plugins")], capture_output=True, text=True,
                       cwd=tmp_path)
    assert "pip install -e \".[cluster]\" --config-settings editable_mode=compat" in r.stdout, r.stdout + r.stderr


def grid_lines(stdout: str) -> list:
    return [line for line in stdout.splitlines() if ": best configuration " in line or line.startswith("results: ")]


def test_a_finished_sweep_says_each_grids_result_and_a_resume_queues_only_what_is_missing(slurm, tmp_path,
                                                                                          monkeypatch):
    from dpgrid.commands import launchers

    monkeypatch.setattr(slurm_module, "POLL_S", 0.2)
    slurm("run", 4250)
    sweep = tmp_path / "sweep"
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    lines = grid_lines(r.stdout)
    assert len(lines) == 3 and lines[-1].startswith(f"results: {sweep}") and "dpgrid tables" in lines[-1], r.stdout
    grids = sorted(p.parent for p in sweep.rglob("summary.csv"))
    assert len(grids) == 2 and all(line.split(":")[0] in [str(g.relative_to(sweep)) for g in grids] for line in lines[:2])

    again = dpgrid("run", *SWEEP, f"hydra.sweep.dir={sweep}")  # everything finished: nothing queued
    assert again.returncode == 0 and "dpgrid: 2 of 2 grids finished, nothing to submit" in again.stderr, again.stderr
    assert grid_lines(again.stdout) == lines
    assert (tmp_path / "sbatch.log").read_text().count("\n") == 1

    (grids[0] / "summary.csv").unlink()  # as a grid whose job was cancelled before its end
    resumed = dpgrid("run", *SWEEP, f"hydra.sweep.dir={sweep}")
    assert resumed.returncode == 0 and "dpgrid: 1 of 2 grids finished, submitting the rest" in resumed.stderr
    assert "dpgrid: submitted 1 SLURM job(s) as 4251" in resumed.stderr, resumed.stderr
    assert grid_lines(resumed.stdout) == lines


def test_a_sweep_larger_than_max_array_size_is_split_into_arrays(slurm, tmp_path, monkeypatch):
    from dpgrid.commands import launchers

    monkeypatch.setattr(slurm_module, "POLL_S", 0.2)
    monkeypatch.setenv("FAKE_MAX_ARRAY", "1")
    slurm("run", 4260)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 0, r.stderr
    assert "dpgrid: submitted 2 SLURM job(s) as 4260,4261" in r.stderr, r.stderr
    assert len((tmp_path / "sbatch.log").read_text().splitlines()) == 2
    assert len(grid_lines(r.stdout)) == 3


def test_jobs_that_are_one_grid_are_trained_once(slurm, tmp_path, monkeypatch):
    """nodp reads no epsilon: privacy.epsilon=3,5 is one grid in one directory, queued once (twice, the second
    job would find the first's lock)."""
    from dpgrid.commands import launchers

    monkeypatch.setattr(slurm_module, "POLL_S", 0.2)
    slurm("run", 4270)
    r = dpgrid("run", *ONE_GRID, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 0, r.stderr
    assert "dpgrid: the sweep's 2 jobs are 1 grid (" in r.stderr and "submitted 1 SLURM job(s) as 4270" in r.stderr
    assert len(grid_lines(r.stdout)) == 2, r.stdout


def test_several_grids_share_a_job(slurm, tmp_path, monkeypatch):
    from dpgrid.commands import launchers

    monkeypatch.setattr(slurm_module, "POLL_S", 0.2)
    slurm("run", 4280)
    r = dpgrid("run", *SWEEP, "hydra.launcher.grids_per_job=2", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 0, r.stderr
    assert "dpgrid: submitted 1 SLURM job(s) (2 grids, up to 2 per job) as 4280" in r.stderr, r.stderr
    script = next((tmp_path / "sweep" / ".submitit").rglob("*submission_file*")).read_text()
    assert "#SBATCH --array" not in script  # one job, not an array
    assert len(grid_lines(r.stdout)) == 3 and len(list((tmp_path / "sweep").rglob("summary.csv"))) == 2


def test_what_a_queued_job_would_find_late_is_refused_before_queueing(slurm, tmp_path):
    from dpgrid.results.files import locked

    slurm("run", 4290)
    sweep = ["-m", "hydra/launcher=slurm", "dataset=mnist", f"data.root={tmp_path / 'nowhere'}", "strategy=online",
             "grid.k=2", "train.seeds=1", "privacy.epsilon=3,5", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    r = dpgrid("run", *sweep)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "checked on this machine before queueing; data.check_before_queue=false skips it" in r.stderr, r.stderr
    assert not (tmp_path / "sbatch.log").exists()
    slurm("cancel", 4292)  # skipped: queued (the jobs then end as the fake SLURM says)
    r = dpgrid("run", *sweep, "data.check_before_queue=false")
    assert "submitted 2 SLURM job(s)" in r.stderr and (tmp_path / "sbatch.log").exists(), r.stderr
    (tmp_path / "sbatch.log").unlink()
    # a run directory another process holds
    slurm("pending", 4291)
    held = tmp_path / "sweep2" / "digits" / "fixed_threshold" / "eps3" / "k2"
    held.mkdir(parents=True)
    with locked(held):
        r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep2'}")
    assert r.returncode == 2 and "another dpgrid process is writing into" in r.stderr, r.stderr
    assert not (tmp_path / "sbatch.log").exists()


def test_a_sweep_job_that_composes_another_config_than_the_checked_one_trains_nothing(tmp_path, monkeypatch, capsys):
    """Each job of a sweep compiles its config again (on a cluster node, perhaps after a config file changed) and
    must find the config hash the sweep checked before queueing; another is refused in one line."""
    from dpgrid.commands import cli, sweep

    checked = sweep.check_sweep
    monkeypatch.setattr(sweep, "check_sweep", lambda overrides: {out: "0" * 16 for out in checked(overrides)})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "-m", "grid.k=2", "train.epochs=1", "train.seeds=1", "privacy.epsilon=3,8"])
    assert stopped.value.code == 2 and "composed another config (hash" in capsys.readouterr().err
    assert not list(tmp_path.rglob("runs.csv"))


def test_scancel_stops_a_running_job_within_seconds(slurm, tmp_path):
    """SLURM cancels a job with SIGTERM (then SIGKILL after its KillWait); submitit's job process would let it by. A
    dpgrid job stops its grid between two writes at once, and the submitter says so in one line."""
    import time

    sweep = tmp_path / "sweep"
    env = slurm("run", 4270)
    long = ["-m", "hydra/launcher=slurm", "strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=400",
            "train.parallel_runs=1", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen([sys.executable, "-m", "dpgrid.commands.cli", "run", *long], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 300
    while not list(sweep.rglob("cli.log")) and time.monotonic() < deadline:  # the job holds its grid
        time.sleep(0.2)
    jobs = subprocess.run(["pgrep", "-f", "submitit.core._submit"], capture_output=True, text=True).stdout.split()
    assert jobs, "the job's process was not found"
    cancelled = time.monotonic()
    for pid in jobs:
        os.kill(int(pid), signal.SIGTERM)  # what scancel does first
    while any(os.path.exists(f"/proc/{pid}") for pid in jobs) and time.monotonic() < cancelled + 60:
        time.sleep(0.1)
    assert time.monotonic() - cancelled < 15, "the job trained on after SIGTERM"
    proc.wait(timeout=120)
    said = proc.stderr.read()
    assert proc.returncode == 2 and "SIGTERM: the grid in" in said and "the same command resumes" in said, said


def test_the_launcher_check_knows_the_keys_of_dpgrids_launcher_config():
    """check_launcher names dpgrid's keys rather than importing the plugin (which hands its launch to dpgrid): the two
    lists are one."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra_plugins.dpgrid_launcher import DpgridSlurmConf
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from omegaconf import OmegaConf

    from dpgrid.commands.sweep import DPGRID_SLURM_KEYS

    added = set(OmegaConf.structured(DpgridSlurmConf).keys()) - set(OmegaConf.structured(SlurmQueueConf).keys())
    assert added == set(DPGRID_SLURM_KEYS)


def test_a_slurm_sweep_logs_each_grid_from_its_job_under_the_sweeps_parent_run(slurm, tmp_path, monkeypatch):
    """tracker=mlflow: the submitting process holds the sweep's run, each job its grid's run and nested runs, written
    side by side into one store; the sweep ends once every job has, and nothing is left RUNNING."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setattr(slurm_module, "POLL_S", 0.2)
    slurm("run", 4270)
    sweep = tmp_path / "sweep"
    r = dpgrid("run", *SWEEP, "tracker=mlflow", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    client = MlflowClient(f"sqlite:///{sweep / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("dpgrid").experiment_id], max_results=1000)
    by_kind = {}
    for run in runs:
        by_kind.setdefault(run.data.tags["dpgrid.kind"], []).append(run)
    parent = by_kind["sweep"][0].info.run_id
    assert len(by_kind["sweep"]) == 1 and len(by_kind["grid"]) == 2
    assert {g.data.tags["mlflow.parentRunId"] for g in by_kind["grid"]} == {parent}
    assert len(by_kind["run"]) == 2 * 2 * 1 * 2  # two grids of k = 2 (2 x 2 configurations), one seed
    assert {run.info.status for run in runs} == {"FINISHED"}
