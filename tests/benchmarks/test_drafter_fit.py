"""benchmarks/drafter_fit.py: the shipped EAGLE-3 and DFlash drafters' metrics on held-out and training answers;
the held-out row reproduces the validation each drafter's training.json records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_drafter_fit_reproduces_the_recorded_validation():
    proc = subprocess.run([sys.executable, "benchmarks/drafter_fit.py", "--train-answers", "2"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in proc.stdout.splitlines()[-2:]}
    assert set(rows) == {"validation", "training"}
    recorded = json.loads((PROJECT_ROOT / "pipeline/assets/drafters/smollm2-135m/eagle3/training.json").read_text())
    # the shipped weights are bf16, the recorded validation ran on the fp32 weights of the training run
    assert rows["validation"][-1] == pytest.approx(recorded["val/accept_len_chain"], abs=0.02)
    assert rows["validation"][0] == pytest.approx(recorded["val/top1_step0"], abs=0.01)
    assert 1.0 <= rows["training"][-1] <= 8.0


@pytest.mark.slow
def test_drafter_fit_reads_a_dflash_drafter_with_its_legs_anchor_count():
    proc = subprocess.run([sys.executable, "benchmarks/drafter_fit.py", "--kind", "dflash", "--train-answers", "1",
                           "drafter.num_anchors=64"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, validation, training = proc.stdout.splitlines()[-3:]
    assert header.split() == ["answers", "loss", "accept_len", "top1_pos1", "top1_pos2", "top1_pos3"]
    assert training.split()[0] == "training"
    values = {"validation": [float(x) for x in validation.split()[1:]]}  # one training answer may be too short: "-"
    recorded = json.loads((PROJECT_ROOT / "pipeline/assets/drafters/smollm2-135m/dflash/training.json").read_text())
    assert values["validation"][1] == pytest.approx(recorded["val/accept_len"], abs=0.02)
    assert values["validation"][0] == pytest.approx(recorded["val/loss"], abs=0.05)
    # each draft of the block agrees less often than the one before it (0.40 / 0.25 / 0.16 on 2026-12-07)
    assert 1 > values["validation"][2] > values["validation"][3] > values["validation"][4] > 0
