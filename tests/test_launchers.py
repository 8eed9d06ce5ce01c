"""`dpgrid run -m hydra/launcher=slurm` without a cluster: sbatch, sacct and squeue are small scripts on PATH
that answer as SLURM 22.05 does for a refused partition, a cancelled job and a job that cannot start."""

import os
import signal
import subprocess
import sys

import pytest

from .command import dpgrid

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
pytestmark = pytest.mark.slow  # each test runs a sweep (in this process; Ctrl-C in a real one)

SWEEP = ["-m", "hydra/launcher=slurm", "strategy=nodp", "grid.k=2", "train.seeds=1", "train.epochs=1",
         "train.eval_every=4", "privacy.epsilon=3,5"]

FAKES = {
    "sbatch": """
if [ "$FAKE_SLURM" = refuse ]; then
  echo "sbatch: error: invalid partition specified: nopart" >&2
  echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
  exit 1
fi
echo "$@" >> "$FAKE_SLURM_LOG"
if [ "$FAKE_SLURM" = fail ]; then  # the first job's grid refused something and said so in its log, as dpgrid does
  log="$(dirname "$1")/${FAKE_SLURM_ID}_0"; mkdir -p "$log"
  printf 'loading\ndpgrid: error: another dpgrid process is writing into /x\n' > "$log/${FAKE_SLURM_ID}_0_0_log.err"
fi
echo "Submitted batch job $FAKE_SLURM_ID"
""",
    "sacct": """
state=PENDING; [ "$FAKE_SLURM" = cancel ] && state="CANCELLED by 1000"; [ "$FAKE_SLURM" = fail ] && state=FAILED
echo "JobID|State|NodeList"; echo "${FAKE_SLURM_ID}_0|$state|None assigned"; echo "${FAKE_SLURM_ID}_1|$state|None assigned"
""",
    "srun": "exit 0\n",  # submitit checks it is there
    "squeue": """
[ "$FAKE_SLURM" = pending ] && { echo "${FAKE_SLURM_ID}_0|PENDING|PartitionConfig"; echo "${FAKE_SLURM_ID}_1|PENDING|PartitionConfig"; }
exit 0
""",
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


def test_a_cancelled_job_is_one_line_saying_the_same_command_resumes(slurm, tmp_path):
    slurm("cancel", 4242)
    r = dpgrid("run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("dpgrid: submitted 2 SLURM job(s) as 4242; their logs: ") and ".submitit" in lines[0]
    assert len(lines) == 2 and lines[1].startswith("dpgrid: error: 2 of 2 SLURM job(s) ended before their grid finished: "
                                                   "4242_0 (privacy.epsilon=3) ended CANCELLED by 1000, no log | "
                                                   "4242_1 (privacy.epsilon=5) ended CANCELLED by 1000, no log;"), r.stderr
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
    proc = subprocess.Popen([sys.executable, "-m", "dpgrid.cli", "run", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=slurm("pending", 4244))
    lines = [proc.stderr.readline(), proc.stderr.readline()]  # submitted; then why the jobs wait
    assert lines[1].startswith("dpgrid: 2 SLURM job(s) pending (PartitionConfig: 4244_0, 4244_1) and they will not "
                               "start"), lines
    proc.send_signal(signal.SIGINT)  # the submitter now waits on the queue: Ctrl-C
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert rest.strip().splitlines() == [
        "dpgrid: error: interrupted: 2 SLURM job(s) go on queued or running without this process (4244_0, 4244_1): "
        "squeue -j 4244 shows them, scancel 4244 cancels them; the same command resumes any grid left incomplete"], rest
