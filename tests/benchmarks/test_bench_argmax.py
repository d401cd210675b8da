"""benchmarks/bench_argmax.py: argmax against row_argmax, a row per dtype, vocabulary and row count."""

import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_bench_argmax_prints_a_timed_row_per_shape():
    proc = subprocess.run([sys.executable, "benchmarks/bench_argmax.py", "--vocab", "8192", "--rows", "1,4", "--calls", "2",
                           "--repeats", "1"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln.split() for ln in proc.stdout.splitlines() if ln.split() and ln.split()[0] in ("float32", "bfloat16")]
    assert [(r[0], r[1], r[2]) for r in rows] == [(d, n, "8192") for d in ("float32", "bfloat16") for n in ("1", "4")]
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows)
