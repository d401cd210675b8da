"""benchmarks/eagle3_agreement_by_confidence.py: the shipped EAGLE-3 drafter's first-step agreement split by the
target's confidence; the buckets' shares sum to one and their pooled agreement is the trainer's recorded
`val/top1_step0`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_agreement_by_confidence_pools_to_the_recorded_first_step_agreement():
    proc = subprocess.run([sys.executable, "benchmarks/eagle3_agreement_by_confidence.py"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    buckets = [line for line in lines if line.startswith("[")]
    assert len(buckets) == 5
    shares = [float(line.split()[2]) for line in buckets]
    assert sum(shares) == pytest.approx(1.0, abs=0.003)
    recorded = json.loads((PROJECT_ROOT / "pipeline/assets/drafters/smollm2-135m/eagle3/training.json").read_text())
    pooled = float(lines[-1].split()[-1])
    # the shipped weights are bf16, the recorded validation ran on the fp32 weights of the training run
    assert pooled == pytest.approx(recorded["val/top1_step0"], abs=0.01)
    rates = [float(line.split()[-1]) for line in buckets if line.split()[-1] != "-"]
    assert all(0.0 <= r <= 1.0 for r in rates)
