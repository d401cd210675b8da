"""benchmarks/bench_step_parts.py: a step's host ms split into propose and verify + observe, round by round."""

import re
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def run(*args, tmp_path):
    return subprocess.run([sys.executable, "benchmarks/bench_step_parts.py", *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={"SPECDEC_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"})


def test_each_round_prints_both_parts_of_every_method(tmp_path):
    proc = run("--methods", "lookahead,ar,sd", "--max-new-tokens", "12", "--rounds", "2", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rounds = [ln for ln in proc.stdout.splitlines() if ln.startswith("round ")]
    assert len(rounds) == 2
    for line in rounds:
        cells = re.findall(r"(\w+): propose ([0-9.]+) verify\+observe ([0-9.]+) \((\d+) steps\)", line)
        assert [c[0] for c in cells] == ["lookahead", "ar", "sd"]
        assert all(float(v) > 0 and 0 < int(n) < 12 for _, _, v, n in cells)  # the answer's steps after the first


def test_a_method_with_its_own_step_or_an_unknown_one_is_one_error_line(tmp_path):
    proc = run("--methods", "spec_cascade", tmp_path=tmp_path)
    assert proc.returncode == 2 and "spec_cascade overrides the engine's step" in proc.stderr
    proc = run("--methods", "nope", tmp_path=tmp_path)
    assert proc.returncode == 2 and "unknown method 'nope'" in proc.stderr
