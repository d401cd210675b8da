"""A laptop install without the `wandb` and `slurm` extras: the main job still runs (untracked, one
warning), Hydra starts without plugin errors, and asking for the Slurm launcher is one line."""

import subprocess
import sys

from pipeline.schema import TrackerConfig
from pipeline.tracking import NoTracker, make_tracker

WITHOUT_EXTRAS = ("import sys; sys.modules['wandb'] = None; sys.modules['hydra_plugins.hydra_submitit_launcher'] = None; "
                  "sys.argv = ['specdec', *sys.argv[1:]]; from pipeline.__main__ import cli; cli()")


def test_tracker_wandb_without_wandb_installed_warns_once_and_keeps_running(monkeypatch, tmp_path, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    tracker = make_tracker(TrackerConfig(), {}, tmp_path, job_type="ar", tags=[])
    assert isinstance(tracker, NoTracker)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "tracker=wandb but W&B is not installed (pip install 'specdec-pipeline[wandb]'); not tracking this run "
        "(tracker=none silences this)"]


def test_hydra_starts_without_the_extras_and_the_slurm_launcher_is_one_line():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, "--cfg", "job"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "Error importing" not in proc.stderr and "methods:" in proc.stdout
    proc = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, "-m", "method=ar,pld", "hydra/launcher=slurm"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: hydra/launcher=slurm needs hydra-submitit-launcher: "
                                   "pip install 'specdec-pipeline[slurm]'")
