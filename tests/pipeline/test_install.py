"""`pip install .` (a wheel, not the checkout) run from another folder: the shipped drafters, masks,
data and configs are package data, so `python -m pipeline method=dominotree` finds the drafter."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_wheel_install_runs_dominotree_with_the_shipped_drafter_from_another_folder(tmp_path):
    source = tmp_path / "source"  # built from a copy: a build in the checkout would leave build/ behind
    shutil.copytree(PROJECT_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "outputs", "multirun", "build", "dist", "*.egg-info", "wandb", "__pycache__", ".pytest_cache"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(source)], check=True, timeout=900)
    venv = tmp_path / "venv"  # the dependencies come from this interpreter's site-packages
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "-q", *wheels.glob("*.whl")], check=True, timeout=900)
    where = subprocess.run([python, "-c", "import pipeline, conf; print(pipeline.__file__, conf.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert str(venv) in where and str(PROJECT_ROOT) not in where and str(source) not in where  # the wheel
    run_dir = tmp_path / "run"
    proc = subprocess.run([python, "-m", "pipeline", "method=dominotree", "task.limit=1", "max_new_tokens=16",
                           "tracker=none", f"hydra.run.dir={run_dir}", f"outputs_root={tmp_path / 'outputs'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "dominotree" and summary["num_drafts"] > 0
    assert "dominotree" in proc.stdout and "speedup" in proc.stdout  # the end table
