"""benchmarks/bench_sandbox.py runs both isolations on the same program and prints the overhead last."""

import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_bench_sandbox_prints_both_isolations_and_the_overhead():
    proc = subprocess.run([sys.executable, "benchmarks/bench_sandbox.py", "--runs", "2"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["unsafe", "bwrap", "unshare"]  # both tiers start in CI
    assert lines[-1].startswith("isolation overhead: bwrap ") and ", unshare " in lines[-1]
    assert lines[-1].endswith(" ms/program (minus unsafe, medians)")
