"""Sweeps on a real single-node Slurm (started by the `slurm_cluster` fixture from Debian's packages):
every job's results land, a failing or killed job is reported with its error while the others
finish, and a preempted / killed-and-requeued job resumes without losing a finished prompt."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import local_slurm

PROJECT_ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 420  # bound on every wait in this file


def sweep_command(tmp_path: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "-m", "model=smollm2-135m", "model.source=hub", "model.dtype=float32", "model.name=tiny",
            "task=humaneval", "max_new_tokens=8", "tracker=none", "threads=1", f"outputs_root={tmp_path / 'outputs'}",
            "hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.gpus_per_node=null",
            "hydra.launcher.mem_gb=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
            f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]


def start_sweep(cluster, tmp_path: Path, *overrides: str, **env) -> subprocess.Popen:
    return subprocess.Popen(sweep_command(tmp_path, *overrides), cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**cluster.env, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **env})


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    """Exit code and the sweep's console output (Hydra logs to stdout, errors to stderr)."""
    out, _ = proc.communicate(timeout=WAIT_S)
    return proc.returncode, out


def wait_until(condition, what: str, timeout: float = WAIT_S):
    return local_slurm.wait_until(condition, what, timeout)


def finished_lines(path: Path) -> list[str]:
    """The complete rows of a results.jsonl that is being written."""
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            continue
        lines.append(line)
    return lines


def queue(cluster) -> list[tuple[str, str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], env=cluster.env, capture_output=True, text=True,
                         timeout=30).stdout
    return [tuple(line.split(maxsplit=2)) for line in out.splitlines() if line.strip()]


def release_after_requeue(cluster, job_id: str) -> None:
    """Slurm holds a requeued job for a while (BeginTime); start it now."""
    wait_until(lambda: any(j == job_id and state == "PENDING" for j, state, _ in queue(cluster)),
               f"job {job_id} to be requeued")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster.env, check=True,
                   timeout=30)


@pytest.mark.slow
def test_three_job_sweep_lands_every_result_and_reports_the_failing_job(slurm_cluster, tiny_model_dirs, tmp_path):
    paths = f"{tiny_model_dirs['llama']},/nonexistent/model,{tiny_model_dirs['qwen3']}"
    proc = start_sweep(slurm_cluster, tmp_path, "method=pld", "task.limit=2", f"model.path={paths}",
                       "hydra.launcher.array_parallelism=2", "hydra.launcher.setup=[echo SETUP_RAN]")
    code, err = finish(proc)
    sweep = tmp_path / "sweep"
    assert code == 1, err[-3000:]  # the sweep fails because one job did
    jobs = json.loads((sweep / "jobs.json").read_text())
    assert [jobs[n]["status"] for n in ("0", "1", "2")] == ["COMPLETED", "FAILED", "COMPLETED"]
    assert "model 'tiny' (/nonexistent/model) could not be loaded" in jobs["1"]["error"]
    assert "job #1" in err and "FAILED" in err and "1 of 3 jobs failed; the others finished" in err
    for num in (0, 2):
        summary = json.loads((sweep / f"{num}_pld_humaneval" / "summary.json").read_text())
        assert summary["num_prompts"] == 2 and summary["match_rate"] == 1.0 and summary["speedup"] > 0
    # the launcher config reached sbatch: one array of 3 tasks, 2 at a time, our partition and setup lines
    script = next(sweep.glob(".submitit/*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --partition=debug" in script
    assert "echo SETUP_RAN" in script
    assert "SETUP_RAN" in next(sweep.glob(".submitit/*/*_0_log.out")).read_text()


@pytest.mark.slow
def test_preempted_then_killed_and_requeued_job_loses_no_finished_prompt(slurm_cluster, tiny_model_dirs, tmp_path):
    proc = start_sweep(slurm_cluster, tmp_path, "method=ar", "task.limit=60", "max_new_tokens=200",
                       f"model.path={tiny_model_dirs['llama']}")
    results = tmp_path / "sweep" / "0_ar_humaneval" / "results.jsonl"
    try:
        before_signal = wait_until(lambda: len(finished_lines(results)) >= 2 and finished_lines(results), "2 rows")
        job_id = queue(slurm_cluster)[0][0]
        # 1) preemption / time limit: submitit catches USR2, checkpoints the call and requeues the job
        subprocess.run(["scancel", "--signal=USR2", job_id], env=slurm_cluster.env, check=True, timeout=30)
        release_after_requeue(slurm_cluster, job_id)
        before_kill = wait_until(lambda: len(finished_lines(results)) >= len(before_signal) + 2
                                 and finished_lines(results), "rows after the first requeue")
        # 2) a hard requeue (what a node failure does): the job is killed with no checkpoint and rerun
        subprocess.run(["scontrol", "requeue", job_id], env=slurm_cluster.env, check=True, timeout=30)
        release_after_requeue(slurm_cluster, job_id)
        code, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err[-3000:]
    rows = finished_lines(results)
    ids = [json.loads(r)["id"] for r in rows]
    assert ids == [f"HumanEval/{i}" for i in range(60)]  # every prompt once, none lost, none twice
    assert rows[:len(before_kill)] == before_kill  # finished rows were kept, not regenerated
    assert rows[:len(before_signal)] == before_signal
    assert len(before_signal) < len(before_kill) < 60  # both interruptions hit a running job
    summary = json.loads((results.parent / "summary.json").read_text())
    assert summary["num_prompts"] == 60
    log = next((tmp_path / "sweep").glob(".submitit/*/*_0_log.err")).read_text()
    assert "Caught signal SIGUSR2" in log and log.count("DUE TO JOB REQUEUE") >= 2


@pytest.mark.slow
def test_a_job_killed_without_a_result_is_reported_lost_and_the_sweep_ends(slurm_cluster, tiny_model_dirs, tmp_path):
    proc = start_sweep(slurm_cluster, tmp_path, "method=ar", "task.limit=2,60", "max_new_tokens=200",
                       f"model.path={tiny_model_dirs['llama']}", SPECDEC_QUEUE_CHECK_S="1", SPECDEC_LOST_GRACE_S="2")
    long_results = tmp_path / "sweep" / "1_ar_humaneval" / "results.jsonl"
    try:
        wait_until(lambda: finished_lines(long_results), "the long job to start")
        long_job = next(j for j, _, _ in queue(slurm_cluster) if j.endswith("_1"))
        subprocess.run(["scancel", "--signal=KILL", long_job], env=slurm_cluster.env, check=True, timeout=30)
        code, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 1
    jobs = json.loads((tmp_path / "sweep" / "jobs.json").read_text())
    assert jobs["0"]["status"] == "COMPLETED" and jobs["1"]["status"] == "FAILED"
    assert "left the queue without a result" in jobs["1"]["error"]
    assert (tmp_path / "sweep" / "0_ar_humaneval" / "summary.json").exists()
