"""benchmarks/bench_packed_linear.py: each linear shape timed unpacked and packed, and decoding with a packed and
an unpacked copy of the model interleaved, with the packed run's tokens compared to the unpacked run's."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decoding.engine.packed_linear import packing_available
from pipeline.models import cpu_has_native_bf16
from pipeline.zoo import random_target

PROJECT_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

pytestmark = pytest.mark.skipif(not packing_available(torch.float32), reason="this PyTorch build has no oneDNN")
NATIVE_BF16 = cpu_has_native_bf16() and packing_available(torch.bfloat16)
ROW = re.compile(r"\s+(\d+) x (\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+(True|False)")


def test_the_linear_table_has_each_shape_at_three_row_counts(capsys):
    from bench_packed_linear import linear_table

    dtype = torch.bfloat16 if NATIVE_BF16 else torch.float32
    linear_table(random_target("tiny", dtype=dtype).model, repeats=2)
    rows = [ROW.fullmatch(line) for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows and all(rows)
    shapes = {(int(r[1]), int(r[2])) for r in rows}
    assert len(rows) == 3 * len(shapes) and {int(r[3]) for r in rows} == {1, 4, 16}
    assert all(int(r[4]) > 0 and int(r[5]) > 0 for r in rows)
    if NATIVE_BF16:  # bf16: the same oneDNN kernel, the same bits
        assert all(r[7] == "True" for r in rows)


@pytest.mark.slow
def test_decoding_packed_and_unpacked_prints_a_row_per_method():
    dtype = "bfloat16" if NATIVE_BF16 else "float32"
    proc = subprocess.run([sys.executable, "benchmarks/bench_packed_linear.py", "--dtype", dtype, "--tasks", "gsm8k",
                           "--prompts", "1", "--max-new-tokens", "16", "--methods", "ar", "pld", "--repeats", "3"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {m[1]: m for m in re.finditer(r"^(\w+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)x\s+([0-9.]+)x\s+([0-9.]+)x"
                                         r"\s+(\d+)/(\d+)$", proc.stdout, re.M)}
    assert sorted(rows) == ["ar", "pld"], proc.stdout[-2000:]
    assert float(rows["ar"][5]) == float(rows["ar"][6]) == 1.0  # AR against itself, with either packing
    assert all(float(r[2]) > 0 and float(r[3]) > 0 and r[8] == "1" for r in rows.values())
    if NATIVE_BF16:  # packing changes speed, not tokens
        assert all(r[7] == "1" for r in rows.values())
