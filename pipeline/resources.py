"""Where shipped files live: the trained drafters, routing masks and offline task data are package
data under `pipeline/assets/` (the same place in a checkout, an editable install or a wheel), so
nothing is found by walking up from a source file to a project root."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_DRAFTERS = ASSETS  # config locations read "drafters/<model>/<kind>", relative to ASSETS
SHIPPED_MASKS = ASSETS / "masks"
SHIPPED_DATA = ASSETS / "data"  # offline task data, each file with its licence (assets/data/README.md)
