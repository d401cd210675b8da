"""benchmarks/eagle3_validation_vs_decode.py: the shipped EAGLE-3 chain decoded on a held-out validation
prompt accepts what validation predicts, and the script prints its per-answer row and summary line."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_validation_vs_decode_prints_tau_and_the_per_position_means():
    proc = subprocess.run([sys.executable, "benchmarks/eagle3_validation_vs_decode.py", "--answers", "1",
                           "--max-new-tokens", "32"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    row = lines[-2].split()
    assert row[0] == "0" and float(row[2]) > 1.0 and float(row[3]) > 1.0  # tau, per-position mean
    summary = re.fullmatch(r"all \d+ steps: tau ([0-9.]+), per-position mean on the decoded text ([0-9.]+), "
                           r"on the corpus answers ([0-9.]+), steps differing from validation's prediction (\d+)",
                           lines[-1])
    assert summary, lines[-1]
    assert int(summary.group(4)) <= 1  # decoding accepts what validation computes (a rounding flip: one)
