"""benchmarks/bench_host_overhead.py: per-method host ms per step, ending with the worst one."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_host_overhead_prints_a_row_per_method_and_temperature_and_the_worst_last(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/bench_host_overhead.py", "--methods", "ar,ptd", "--prompts", "2",
                           "--max-new-tokens", "8", "--compiled", "", "--count-ops", "--repeats", "2"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
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


def test_repeats_below_one_is_one_error_line():
    proc = subprocess.run([sys.executable, "benchmarks/bench_host_overhead.py", "--repeats", "0"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--repeats 0: needs at least 1" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--methods", "ar,nope"], "unknown method 'nope'"),
    (["--compiled", "dominotree"], "--compiled dominotree: its config has no compile option; methods with one: domino")])
def test_a_bad_method_name_is_one_error_line_before_anything_runs(args, message):
    proc = subprocess.run([sys.executable, "benchmarks/bench_host_overhead.py", *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # nothing measured: no model built, no row printed


def test_a_flat_cost_curve_grows_caddtree_to_its_cap(tmp_path):
    """--flat-cost: the verify cost of a GPU (flat in the node count), so CaDDTree's trees reach max_budget."""
    proc = subprocess.run([sys.executable, "benchmarks/bench_host_overhead.py", "--methods", "caddtree", "--prompts", "1",
                           "--max-new-tokens", "6", "--compiled", "", "--temperatures", "0", "--flat-cost"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
                          env={"SPECDEC_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(ln.split() for ln in proc.stdout.splitlines() if ln.startswith("caddtree"))
    assert float(row[-1]) == 1024  # nodes per tree: the default max_budget


def test_a_real_model_run_gives_each_method_the_models_own_drafter():
    sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
    from bench_host_overhead import drafter_override

    drafters = {"dflash": "d/dflash", "domino": "d/domino", "eagle3": "d/eagle3"}
    assert drafter_override("dominotree", drafters) == drafter_override("domino", drafters) == {"drafter": "d/domino"}
    assert drafter_override("ddtree", drafters) == drafter_override("caddtree", drafters) == {"drafter": "d/dflash"}
    assert drafter_override("eagle3", drafters) == {"drafter": "d/eagle3"}
    # methods without a drafter field (their drafter is the target's layers or a config of its own) keep the zoo's
    assert drafter_override("sd", drafters) == drafter_override("via_sd_eagle3", drafters) == {}
    assert drafter_override("ddtree", {}) == {}  # a model without a DFlash drafter: the zoo's random one


@pytest.mark.slow
def test_host_overhead_on_the_offline_model_with_its_shipped_drafters():
    proc = subprocess.run([sys.executable, "benchmarks/bench_host_overhead.py", "--model", "smollm2-135m",
                           "--methods", "ar,dominotree", "--prompts", "1", "--max-new-tokens", "16", "--temperatures", "0",
                           "--compiled", ""], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    # the default cache (the benchmark isolates the tiny model's alone): the offline model materialised once for
    # every test that loads it (27 s each time otherwise); DominoTree's fixed budget profiles no costs to leave there
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("smollm2-135m (30 layers") and "['dflash', 'domino', 'eagle3']" in lines[0]
    rows = {ln.split()[0]: ln.split() for ln in lines if ln.split() and ln.split()[0] in ("ar", "dominotree")}
    assert set(rows) == {"ar", "dominotree"}
    assert float(rows["dominotree"][3]) > 1.0  # tokens per step: the shipped Domino drafter is accepted, a random one is not
    assert re.fullmatch(r"worst host overhead: \w+ [0-9.]+ ms/step", lines[-1])
