"""benchmarks/bench_domino_chain.py: the Domino chain eager and compiled, same tokens, a summary line."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_domino_chain_benchmark_compiles_the_chain_and_prints_both_timings(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/bench_domino_chain.py", "--calls", "3", "--repeats", "1"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
                          env={"SPECDEC_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    rows = [ln for ln in lines if ln.startswith("T=")]
    assert len(rows) == 2 and all("same tokens: True" in ln for ln in rows)
    assert re.fullmatch(r"domino chain: eager [0-9.]+ ms, compiled [0-9.]+ ms \(T=1\)", lines[-1])
