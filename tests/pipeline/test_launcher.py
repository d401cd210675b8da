"""The Slurm/local launchers' wait (pipeline/launcher.py) and their Hydra configs. The real-Slurm
runs are in test_slurm.py; here fake job handles drive the wait loop through every outcome."""

import json
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.utils import JobReturn, JobStatus

from pipeline import launcher
from pipeline.schema import register_configs

register_configs()


class FakeJob:
    """Just what the wait loop reads from a submitit job: id, paths, done(), the pickled outcome."""

    def __init__(self, tmp: Path, job_id: str, outcome=None, log: str = ""):
        self.job_id = job_id
        self.outcome = outcome
        self.paths = type("Paths", (), {"result_pickle": tmp / f"{job_id}_result.pkl",
                                         "stderr": tmp / f"{job_id}_log.err"})()
        self.paths.stderr.write_text(log)
        if outcome is not None:
            self.paths.result_pickle.write_text("pickled")

    def done(self) -> bool:
        return self.paths.result_pickle.exists()

    def _get_outcome_and_result(self):
        return self.outcome


def completed(overrides: list[str]) -> JobReturn:
    ret = JobReturn(overrides=overrides)
    ret.status = JobStatus.COMPLETED
    ret.return_value = 1.5
    return ret


def test_every_outcome_becomes_a_job_return_and_a_lost_job_does_not_hang(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "POLL_S", 0.01)
    monkeypatch.setattr(launcher, "QUEUE_CHECK_S", 0.0)
    monkeypatch.setattr(launcher, "LOST_GRACE_S", 0.05)
    asked = []
    monkeypatch.setattr(launcher, "jobs_in_queue", lambda ids: asked.append(ids) or set())  # nothing queued
    trace = "Traceback (most recent call last):\nUncompletedJobError: Job not requeued because: timed-out too many times."
    jobs = [FakeJob(tmp_path, "7_0", ("success", completed(["method=ar"]))),
            FakeJob(tmp_path, "7_1", ("error", trace)),
            FakeJob(tmp_path, "7_2", None, log="loading model\nKilled")]
    overrides = [["method=ar"], ["method=pld"], ["method=ptd"]]
    returns = launcher.wait_for_all(jobs, overrides, on_slurm=True)
    assert [r.status for r in returns] == [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.FAILED]
    assert returns[0].return_value == 1.5
    assert isinstance(returns[1]._return_value, launcher.RemoteJobError)
    assert "timed-out too many times" in str(returns[1]._return_value)
    lost = str(returns[2]._return_value)
    assert isinstance(returns[2]._return_value, launcher.JobLostError)
    assert "7_2 left the queue without a result" in lost and "last log line: Killed" in lost
    assert asked[0] == ["7_2"]  # only jobs without a result are asked about

    launcher.record_outcomes(tmp_path, jobs, returns, first_idx=0)
    recorded = json.loads((tmp_path / "jobs.json").read_text())
    assert [recorded[k]["status"] for k in "012"] == ["COMPLETED", "FAILED", "FAILED"]
    assert recorded["0"]["error"] is None and recorded["2"]["error"].startswith("JobLostError: job 7_2")
    assert recorded["1"]["overrides"] == ["method=pld"] and recorded["2"]["log"].endswith("7_2_log.err")


def test_a_job_still_in_the_queue_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "POLL_S", 0.01)
    monkeypatch.setattr(launcher, "QUEUE_CHECK_S", 0.0)
    monkeypatch.setattr(launcher, "LOST_GRACE_S", 0.0)
    job = FakeJob(tmp_path, "9_0")
    polls = []

    def queued(ids):  # pending (e.g. requeued) for a few polls, then its result appears
        polls.append(ids)
        if len(polls) == 5:
            job.outcome = ("success", completed(["method=ar"]))
            job.paths.result_pickle.write_text("pickled")
        return {"9_0"}

    monkeypatch.setattr(launcher, "jobs_in_queue", queued)
    [ret] = launcher.wait_for_all([job], [["method=ar"]], on_slurm=True)
    assert ret.status == JobStatus.COMPLETED and len(polls) >= 5


def hydra_launcher(*overrides):
    with initialize_config_module(config_module="conf", version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True).hydra.launcher


def test_slurm_launcher_config_defaults_and_overrides():
    cfg = hydra_launcher("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=600",
                         "hydra.launcher.setup=[module load cuda]")
    assert cfg._target_ == "hydra_plugins.specdec_launcher.SlurmLauncher"
    assert cfg.partition == "gpu" and cfg.timeout_min == 600 and list(cfg.setup) == ["module load cuda"]
    assert cfg.gpus_per_node == 1 and cfg.max_num_timeout == 3 and cfg.array_parallelism == 64
    assert cfg.submitit_folder.endswith(".submitit/%j")
    local = hydra_launcher("hydra/launcher=local")
    assert local._target_ == "hydra_plugins.specdec_launcher.LocalLauncher" and local.gpus_per_node is None
