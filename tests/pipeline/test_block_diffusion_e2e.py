"""The shipped SmolLM2 drafters end to end: `python -m pipeline method=dominotree` (and dflash) runs
offline at once, is lossless against AR, and the drafters shipped in the repo load as published-
layout checkpoints."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHIPPED = PROJECT_ROOT / "pipeline" / "assets" / "drafters" / "smollm2-135m"


def test_shipped_drafters_are_small_published_layout_checkpoints():
    from decoding.drafting.dflash_drafter import load_drafter

    total = 0
    for kind in ("dflash", "domino"):
        folder = SHIPPED / kind
        drafter = load_drafter(str(folder))
        assert drafter.spec.is_domino == (kind == "domino")
        assert drafter.spec.hidden_size == 576 and drafter.spec.mask_token_id == 16
        total += sum(f.stat().st_size for f in folder.iterdir())
    assert total < 40 * 2**20


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dominotree", "dflash"])
def test_pipeline_runs_offline_with_the_shipped_drafter(tmp_path, method):
    run_dir = tmp_path / "run"
    # fp32: exact equality with AR is proven in fp32 (bf16 may leave AR at near-ties, tested elsewhere)
    cmd = [sys.executable, "-m", "pipeline", f"method={method}", "task.limit=1", "max_new_tokens=32", "tracker=none",
           "model.dtype=float32", "warmup=0",  # no untimed warm-up generation: no timing is checked here
           f"hydra.run.dir={run_dir}", f"outputs_root={tmp_path / 'outputs'}"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["match_rate"] == 1.0
    assert summary["tau"] >= 1.0 and summary["num_prompts"] == 1
