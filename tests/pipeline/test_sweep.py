"""`python -m pipeline -m ...` with Hydra's default (basic) launcher: a sweep over methods and tasks
gives one report with every row, and a job that fails does not stop the ones after it."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pipeline", "-m", "model=smollm2-135m", "model.source=hub", "model.dtype=float32", "model.name=tiny",
           "task.limit=2", "max_new_tokens=8", "tracker=none", "threads=1", f"outputs_root={tmp_path / 'outputs'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    return subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})


@pytest.mark.slow
def test_sweep_over_methods_and_tasks_gives_one_report_with_all_rows(tiny_model_dirs, tmp_path):
    proc = sweep(tmp_path, "method=ar,pld", "task=humaneval,gsm8k", f"model.path={tiny_model_dirs['llama']}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the sweep reported itself at its end (the SweepReport callback): the table printed, the files written
    assert "| tiny | gsm8k | 0 | pld |" in proc.stdout and "| tiny | humaneval | 0 | ar |" in proc.stdout
    assert (tmp_path / "sweep" / "report" / "report.md").read_text().count("| tiny |") == 4
    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "pipeline.report", str(tmp_path / "sweep"), "--out", str(out)],
                         cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    with (out / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["task"], r["method"]) for r in rows) == [
        ("gsm8k", "ar"), ("gsm8k", "pld"), ("humaneval", "ar"), ("humaneval", "pld")]
    assert all(float(r["speedup"]) > 0 and r["num_prompts"] == "2" for r in rows)
    assert {r["quality_metric"] for r in rows} == {"accuracy", "pass@1"}
    assert "| tiny | gsm8k | 0 | pld |" in (out / "report.md").read_text()


@pytest.mark.slow
def test_basic_launcher_runs_the_jobs_after_a_failing_one(tiny_model_dirs, tmp_path):
    paths = f"{tiny_model_dirs['llama']},/nonexistent/model,{tiny_model_dirs['qwen3']}"
    proc = sweep(tmp_path, "method=ar", f"model.path={paths}")
    assert proc.returncode == 1
    assert "JobError: ModelLoadError: model 'tiny' (/nonexistent/model) could not be loaded" in proc.stderr
    done = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/summary.json"))
    assert done == ["0_ar_humaneval", "2_ar_humaneval"]
    assert json.loads((tmp_path / "sweep" / "2_ar_humaneval" / "summary.json").read_text())["num_prompts"] == 2
