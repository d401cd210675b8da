"""What a result was produced with, recorded in every summary.json and W&B config (as
lm-evaluation-harness does): the code's git commit and dirty flag, package versions, the model and
dataset with their revisions, the drafter checkpoints the job's methods loaded (the folder each location
resolved to and a digest of its weights), dtype, device and threads."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from decoding.drafting.dflash_drafter import RESOLVED

PACKAGES = ("torch", "transformers", "specdec-pipeline", "hydra-core", "optuna")


def git_state(folder: Path | None = None) -> dict:
    """Commit and dirty flag of the checkout the code runs from (None where it is no git checkout,
    e.g. after `pip install .`)."""
    folder = folder or Path(__file__).resolve().parent.parent
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        if Path(top).resolve() != folder.resolve():  # e.g. a wheel in a venv inside some other checkout
            return {"commit": None, "dirty": None}
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status.strip())}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def model_record(model_cfg, model) -> dict:
    """The model id and the revision that was loaded (the hub commit where transformers knows it)."""
    return {"name": model_cfg.name, "id": model_cfg.path, "source": model_cfg.source,
            "revision": model_cfg.revision or getattr(model.config, "_commit_hash", None)}


def record(model_cfg, model, dataset: dict, target) -> dict:
    device = target.device
    return {
        "git": git_state(), "versions": versions(), "model": model_record(model_cfg, model), "dataset": dataset,
        "checkpoints": dict(RESOLVED),  # filled while the job's methods were built (runner.run empties it first)
        "dtype": str(target.dtype).removeprefix("torch."), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or platform.machine(), "threads": torch.get_num_threads(),
    }
