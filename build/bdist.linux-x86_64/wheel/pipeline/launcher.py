"""Hydra launchers for `hydra/launcher=slurm` and `hydra/launcher=local`: hydra-submitit-launcher's,
with a wait that survives what a sweep meets on a real cluster.

The plugin waits for the jobs one after another with `job.results()`: the first job that died
without a result (killed, out of memory, node failure) raises and abandons the others, and on a
cluster without accounting (`sacct` fails) such a job is never seen as finished at all, so the
sweep waits forever. Here every job becomes a `JobReturn` (completed, failed with its error, or
lost), a lost job is detected through `squeue` when `sacct` cannot tell, all outcomes are logged
and written to `<sweep dir>/jobs.json`, and Hydra then exits with the first failure as usual.

Requeue: a job that is preempted or times out is checkpointed by submitit (the plugin's
`checkpoint` resubmits the same call) and requeued; it runs again in the same run dir (the sweep
dir is resolved once, the subdir from the job number) and the runner skips finished prompts.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often result files are looked for
# how often squeue is asked about jobs without a result, and how long a job may be gone from the queue
# before it counts as lost (it may still be writing its result to a slow shared disk)
QUEUE_CHECK_S = float(os.environ.get("SPECDEC_QUEUE_CHECK_S", 15))
LOST_GRACE_S = float(os.environ.get("SPECDEC_LOST_GRACE_S", 60))


class JobLostError(RuntimeError):
    """A job ended without leaving a result: it was killed (scancel, out of memory, node failure)."""


class RemoteJobError(RuntimeError):
    """A job raised outside the task function (e.g. it was not requeued after a timeout)."""


class RobustWaitMixin:
    """Mixed into the plugin's launchers (hydra_plugins/specdec_launcher): submit like the plugin,
    wait for every job, report each outcome."""

    _EXECUTOR: str

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        executor = self._make_executor()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {sweep_dir}")
        job_params = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*job_params))
        returns = wait_for_all(jobs, [p[0] for p in job_params], self._EXECUTOR == "slurm")
        record_outcomes(sweep_dir, jobs, returns, initial_job_idx)
        return returns

    def _make_executor(self):
        """The executor exactly as the plugin builds it (same parameter mapping)."""
        import submitit

        params = dict(self.params)
        init = {"folder": params.pop("submitit_folder")}
        if "max_num_timeout" in params:
            init[f"{self._EXECUTOR}_max_num_timeout"] = params.pop("max_num_timeout")
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})
        return executor


def wait_for_all(jobs: list, overrides: list[list[str]], on_slurm: bool) -> list[JobReturn]:
    """Poll until every job has a result or is known to be gone; never stops at the first failure."""
    outcomes: dict[int, JobReturn] = {}
    gone_since: dict[int, float] = {}
    last_queue_check = 0.0
    while True:
        for i, job in enumerate(jobs):
            if i not in outcomes and (job.paths.result_pickle.exists() or (not on_slurm and job.done())):
                outcomes[i] = job_return(job, overrides[i])
        pending = [i for i in range(len(jobs)) if i not in outcomes]
        if not pending:
            return [outcomes[i] for i in range(len(jobs))]
        if on_slurm and time.time() - last_queue_check >= QUEUE_CHECK_S:
            last_queue_check = time.time()
            queued = jobs_in_queue([jobs[i].job_id for i in pending])
            for i in pending if queued is not None else []:
                if jobs[i].job_id in queued:
                    gone_since.pop(i, None)  # pending, running or requeued
                elif time.time() - gone_since.setdefault(i, time.time()) >= LOST_GRACE_S:
                    outcomes[i] = failed(overrides[i], JobLostError(lost_message(jobs[i])))
        time.sleep(POLL_S)


def jobs_in_queue(job_ids: list[str]) -> set[str] | None:
    """Ids (array form `123_4`) still pending/running/requeued; None if squeue cannot be asked."""
    if not job_ids:
        return set()
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def job_return(job, overrides: list[str]) -> JobReturn:
    """The JobReturn the job pickled (run_job catches the task's exceptions), or a failure."""
    try:
        outcome, value = job._get_outcome_and_result()
    except Exception as err:  # no result file although the job finished
        return failed(overrides, JobLostError(f"{err}".strip().splitlines()[0]))
    if outcome == "success":
        return value[0] if isinstance(value, list) else value
    trace = str(value).strip().splitlines()
    return failed(overrides, RemoteJobError(f"{trace[-1] if trace else 'unknown error'} (log: {job.paths.stderr})"))


def failed(overrides: list[str], error: Exception) -> JobReturn:
    ret = JobReturn(overrides=list(overrides))
    ret.status = JobStatus.FAILED
    ret.return_value = error
    return ret


def lost_message(job) -> str:
    tail = ""
    if job.paths.stderr.exists():
        lines = job.paths.stderr.read_text(errors="replace").strip().splitlines()
        tail = f"; last log line: {lines[-1]}" if lines else ""
    return (f"job {job.job_id} left the queue without a result (cancelled, out of memory or node failure?); "
            f"log: {job.paths.stderr}{tail}")


def record_outcomes(sweep_dir: Path, jobs: list, returns: list[JobReturn], first_idx: int) -> None:
    """Log one line per job and merge them into <sweep dir>/jobs.json (read by pipeline.report)."""
    path = sweep_dir / "jobs.json"
    records: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for offset, (job, ret) in enumerate(zip(jobs, returns)):
        num = first_idx + offset
        ok = ret.status == JobStatus.COMPLETED
        error = None if ok else one_line(ret._return_value)
        records[str(num)] = {"num": num, "overrides": list(ret.overrides or []), "status": ret.status.name,
                             "error": error, "job_id": job.job_id, "log": str(job.paths.stderr),
                             "run_dir": getattr(ret, "hydra_cfg", None) and ret.hydra_cfg.hydra.runtime.output_dir}
        line = f"job #{num} [{' '.join(filter_overrides(ret.overrides or []))}]"
        if ok:
            log.info(f"{line}: completed")
        else:
            log.error(f"{line}: FAILED: {error}")
    path.write_text(json.dumps(records, indent=2))
    n_failed = sum(r.status != JobStatus.COMPLETED for r in returns)
    if n_failed:
        log.error(f"{n_failed} of {len(returns)} jobs failed; the others finished (details: {path})")


def one_line(error: Any) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    return " ".join(text.split())[:2000]
