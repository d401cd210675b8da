"""benchmarks/bench_kv_cache.py: the shared KV buffer against a plain DynamicCache, interleaved."""

import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_the_buffer_and_a_dynamic_cache_decode_the_same_tokens(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/bench_kv_cache.py", "--layers", "3", "--methods", "ar,ddtree",
                           "--prompts", "2", "--max-new-tokens", "8", "--repeats", "1"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={"SPECDEC_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["ar"], ["ddtree"])]
    assert [r[0] for r in rows] == ["ar", "ddtree"]
    for name, dynamic_s, buffer_s, ratio, same in rows:
        assert float(dynamic_s) > 0 and float(buffer_s) > 0 and float(ratio) > 0 and same == "True"
