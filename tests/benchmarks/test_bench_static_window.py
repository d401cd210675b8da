"""benchmarks/bench_static_window.py: the static forward against the eager one past a sliding window."""

import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_the_static_and_eager_forwards_past_the_window_give_the_same_logits(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/bench_static_window.py", "--model", "tiny", "--context", "40",
                           "--rows", "1,3", "--repeats", "1", "--threads", "1"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={"SPECDEC_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sliding window 8" in proc.stdout and "engine: " in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["1"], ["3"])]
    assert [r[0] for r in rows] == ["1", "3"]
    for _, eager_ms, static_ms, ratio, gap in rows:
        assert float(eager_ms) > 0 and float(static_ms) > 0 and float(ratio) > 0
        assert float(gap) < 1e-4  # fp32: the same logits up to summation order
    assert "graphs replayed: target:1, target:4" in proc.stdout  # the static side replayed (3 rows: bucket 4)
