"""benchmarks/gpu_smoke.py runs on the CPU with the tiny shape (the same code a GPU runs), so CI
exercises the GPU script: every method at T=0 and T=1 in bf16, the tie diagnosis, the DominoTree
builders against each other and the forward-cost curve up to 1024 rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_smoke_runs_every_method_on_the_cpu_tiny_shape(tmp_path):
    from pipeline.zoo import LOSSLESS, METHODS

    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--device", "cpu", "--tiny", "--out", str(out)],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SPECDEC_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("gpu smoke: ok")
    report = json.loads(out.read_text())
    assert report["dtype"] == "bfloat16" and report["shape"] == "tiny"
    ran = {(r["method"], r["T"]) for r in report["methods"] if "error" not in r}
    assert ran == {(m, t) for m in METHODS for t in (0.0, 1.0)}
    lossless_t0 = [r for r in report["methods"] if r["T"] == 0.0 and "ties" in r]
    assert len(lossless_t0) == len([m for m in LOSSLESS if m != "ar"])
    assert all(r["diverged"] == 0 for r in lossless_t0)
    assert report["builders"]["equal_trees"] and report["builders"]["rounds"] > 0
    assert [r["rows"] for r in report["cost_curve"]][-1] == 1024
    assert all(r["host_ms"] > 0 and r["tokens_per_s"] > 0 for r in report["methods"])
