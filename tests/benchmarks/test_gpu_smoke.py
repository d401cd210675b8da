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


# Not on the GPU machine's image (docs/gpu-bf16.md): the script must run with torch, transformers and
# what they need, and nothing of the pipeline's own stack.
ABSENT_ON_THE_GPU_IMAGE = ("hydra", "hydra_plugins", "omegaconf", "antlr4", "optuna", "wandb", "submitit")


@pytest.mark.slow
def test_gpu_smoke_runs_every_method_on_the_cpu_tiny_shape_with_only_the_gpu_images_packages(tmp_path):
    from pipeline.zoo import LOSSLESS, METHODS

    hide = tmp_path / "hide"  # imports of these fail, and importlib.util.find_spec reports them absent
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(f"import sys\nfor name in {ABSENT_ON_THE_GPU_IMAGE!r}:\n"
                                           "    sys.modules[name] = None\n")
    out = tmp_path / "smoke.json"
    path = os.pathsep.join([str(hide), str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--device", "cpu", "--tiny", "--out", str(out)],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SPECDEC_CACHE": str(tmp_path / "cache"), "PYTHONPATH": path})
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
    # every row was printed as it was measured, before the sections after it
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("| ") and "| T |" not in line for line in lines) == len(report["methods"])
    assert lines.index(next(line for line in lines if line.startswith("DominoTree builders"))) > \
        max(i for i, line in enumerate(lines) if line.startswith("| "))


def test_gpu_smoke_without_a_gpu_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    proc = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--device", "cuda", "--methods", "ar"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout.strip().splitlines() == [
        "gpu smoke: FAILED: no CUDA device is visible (on a CPU: --device cpu --tiny)"]
