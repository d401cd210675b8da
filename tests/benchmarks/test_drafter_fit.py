"""benchmarks/drafter_fit.py: the shipped EAGLE-3, DFlash and Domino drafters' metrics on held-out and training answers;
the held-out row reproduces the validation each drafter's training.json records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.train.config import DrafterTrainConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def drafter_fit(*args: str) -> list[str]:
    """The script's output lines, run from the project root (it must exit 0)."""
    proc = subprocess.run([sys.executable, "benchmarks/drafter_fit.py", *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


@pytest.mark.slow
def test_drafter_fit_reproduces_the_recorded_validation():
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in drafter_fit("--train-answers", "2")[-2:]}
    assert set(rows) == {"validation", "training"}
    recorded = json.loads((PROJECT_ROOT / "pipeline/assets/drafters/smollm2-135m/eagle3/training.json").read_text())
    # the shipped weights are bf16, the recorded validation ran on the fp32 weights of the training run
    assert rows["validation"][-1] == pytest.approx(recorded["val/accept_len_chain"], abs=0.02)
    assert rows["validation"][0] == pytest.approx(recorded["val/top1_step0"], abs=0.01)
    assert 1.0 <= rows["training"][-1] <= 8.0


def recorded_leg(kind: str) -> tuple[dict, list[str]]:
    """A shipped drafter's training.json and the overrides that repeat its last leg's validation (anchors per
    answer and loss weights: the accept length moves with the anchors, the loss with both)."""
    recorded = json.loads((PROJECT_ROOT / f"pipeline/assets/drafters/smollm2-135m/{kind}/training.json").read_text())
    # before recipes were recorded: the leg ran at the trainer's defaults (the shipped Domino's did)
    recipe = recorded.get("recipe", vars(DrafterTrainConfig()))
    return recorded, [f"drafter.num_anchors={recipe['num_anchors']}", f"drafter.loss_decay_gamma={recipe['loss_decay_gamma']}"]


@pytest.mark.slow
def test_drafter_fit_reads_a_dflash_drafter_with_its_legs_recipe():
    recorded, overrides = recorded_leg("dflash")
    header, validation, training = drafter_fit("--kind", "dflash", "--train-answers", "1", *overrides)[-3:]
    assert header.split() == ["answers", "loss", "accept_len", "top1_pos1", "top1_pos2", "top1_pos3"]
    assert training.split()[0] == "training"
    values = [float(x) for x in validation.split()[1:]]  # one training answer may be too short: "-"
    assert values[1] == pytest.approx(recorded["val/accept_len"], abs=0.02)
    assert values[0] == pytest.approx(recorded["val/loss"], abs=0.05)
    # each draft of the block agrees less often than the one before it (0.44 / 0.30 / 0.16 on 2026-12-08)
    assert 1 > values[2] > values[3] > values[4] > 0


@pytest.mark.slow
def test_drafter_fit_reads_the_domino_drafter_and_its_backbone_alone():
    recorded, overrides = recorded_leg("domino")
    header, validation = drafter_fit("--kind", "domino", "--train-answers", "1", *overrides)[-3:-1]
    values = dict(zip(header.split()[1:], (float(x) for x in validation.split()[1:])))
    assert values["accept_len"] == pytest.approx(recorded["val/accept_len"], abs=0.02)
    assert values["accept_len_base"] == pytest.approx(recorded["val/accept_len_base"], abs=0.02)
    # the curriculum's last weight on the base logits (steps as trained): the recorded loss again
    assert values["loss"] == pytest.approx(recorded["val/loss"], abs=0.05)
    assert values["loss_base"] == pytest.approx(recorded["val/loss_base"], abs=0.05)
