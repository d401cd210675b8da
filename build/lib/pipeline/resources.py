"""Where files live. Shipped ones (trained drafters, routing masks, offline task data) are package
data under `pipeline/assets/`, the same place in a checkout, an editable install or a wheel, so
nothing is found by walking up from a source file. What a search exports (DIMR masks, tuned PTD
options) goes to a user-writable folder instead, and loads by name from there before the shipped
defaults: tracked files are never rewritten."""

from __future__ import annotations

import os
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_DRAFTERS = ASSETS  # config locations read "drafters/<model>/<kind>", relative to ASSETS
SHIPPED_MASKS = ASSETS / "masks"
SHIPPED_DATA = ASSETS / "data"  # offline task data, each file with its licence (assets/data/README.md)
USER_DIR_ENV = "SPECDEC_HOME"


def user_dir() -> Path:
    """$SPECDEC_HOME, else $XDG_CONFIG_HOME/specdec, else ~/.config/specdec."""
    if os.environ.get(USER_DIR_ENV):
        return Path(os.environ[USER_DIR_ENV]).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "specdec"


def user_masks() -> Path:
    """Routing masks the DIMR search exported (`python -m search objective=dimr`)."""
    return user_dir() / "masks"


def user_conf() -> Path:
    """Hydra config options a search exported (e.g. method/ptd_tuned.yaml); the search path plugin
    (hydra_plugins/specdec_searchpath) puts this folder ahead of the shipped conf/."""
    return user_dir() / "conf"
