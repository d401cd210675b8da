"""benchmarks/bench_host_overhead.py: per-method host ms per step, ending with the worst one."""

import re
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_host_overhead_prints_a_row_per_method_and_temperature_and_the_worst_last(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/bench_host_overhead.py", "--methods", "ar,ptd", "--prompts", "2",
                           "--max-new-tokens", "8", "--compiled", "", "--count-ops"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
                          env={"SPECDEC_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    rows = [ln.split() for ln in lines if ln.split() and ln.split()[0] in ("ar", "ptd")]
    assert [(r[0], r[1]) for r in rows] == [("ar", "0"), ("ar", "1"), ("ptd", "0"), ("ptd", "1")]
    host = {(r[0], r[1]): float(r[-2]) for r in rows}
    ops = {(r[0], r[1]): float(r[-1]) for r in rows}  # --count-ops: torch calls per step outside the passes
    assert all(n > 0 for n in ops.values()) and ops[("ptd", "0")] > ops[("ar", "0")]
    # outside the passes only: one forward of the 6-layer target alone makes well over 100 torch calls
    assert ops[("ar", "0")] < 60
    worst = re.fullmatch(r"worst host overhead: (\w+) ([0-9.]+) ms/step", lines[-1])
    assert worst and float(worst.group(2)) == max(host.values())
