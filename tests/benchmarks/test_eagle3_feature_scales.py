"""benchmarks/eagle3_feature_scales.py: the scales of the shipped EAGLE-3 drafter's tapped features, one line per
tapped layer (layers 1, 14, 26 of SmolLM2-135M), the high layer's typical feature larger than the low one's."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_feature_scales_prints_one_line_per_tapped_layer():
    proc = subprocess.run([sys.executable, "benchmarks/eagle3_feature_scales.py", "--answers", "2"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    layers = [line for line in proc.stdout.splitlines() if line.startswith("layer ")]
    assert [int(line.split()[1].rstrip(":")) for line in layers] == [1, 14, 26]
    medians = [float(re.search(r"median rms ([\d.]+)", line).group(1)) for line in layers]
    assert 0 < medians[0] < medians[2]
