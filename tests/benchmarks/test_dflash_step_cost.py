"""benchmarks/dflash_step_cost.py: features vs loss time per answer, and more anchors label more rows."""

import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_step_cost_prints_features_and_loss_seconds_per_anchor_count():
    proc = subprocess.run([sys.executable, "benchmarks/dflash_step_cost.py", "--anchors", "2,8", "--answers", "2"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.strip().splitlines()[-2:]]
    assert [r[0] for r in rows] == ["2", "8"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert float(rows[1][3]) > float(rows[0][3]) > 0  # 8 anchors' blocks label more rows than 2
