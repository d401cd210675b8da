"""benchmarks/bench_marginal_reads.py: the heap and the depth-by-depth builder on the same rounds."""

import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_both_builders_score_every_round_the_same():
    proc = subprocess.run([sys.executable, "benchmarks/bench_marginal_reads.py", "--vocab", "2000", "--cap", "96"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()]
    assert [r[3] for r in rows] == ["heap", "depth by depth"] * 3
    for scale, nodes, ranks, builder, build_ms, vocab_ms, same in rows:
        assert 1 <= int(nodes) <= 96 and int(ranks) >= 1 and float(build_ms) > 0 and same == "8/8"


def test_small_trees_time_both_builders_and_both_masks():
    proc = subprocess.run([sys.executable, "benchmarks/bench_marginal_reads.py", "--small"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()]
    assert [int(r[1]) for r in rows] == [16, 32, 64, 128, 1024] * 2
    assert all(float(x) > 0 for r in rows for x in r[3:]) and all(1 <= int(r[2]) <= 15 for r in rows)
