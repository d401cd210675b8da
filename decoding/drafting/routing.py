"""Routing masks for layer skipping: which whole decoder layers a slim model q_z skips.

A mask file (`<name>.json` in the user's masks folder or pipeline/assets/masks, written by the DIMR search `python -m search objective=dimr`, or
by hand) holds the skipped layer indices and the model they were searched for:
    {"model": "smollm2-135m", "num_layers": 30, "skip": [3, 5, ...], ...search metadata}
`method=via_sd` (slim verifier) and `drafter=slim` (self-speculative drafter) load it by name.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.resources import SHIPPED_MASKS, user_masks

MASK_DIR = SHIPPED_MASKS


def mask_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_absolute() or "/" in name_or_path:
        return path
    exported = user_masks() / f"{name_or_path}.json"  # a search's export wins over the shipped mask
    return exported if exported.exists() else MASK_DIR / f"{name_or_path}.json"


def load_mask(name_or_path: str, num_layers: int) -> tuple[int, ...]:
    """Skipped layer indices of a mask file, checked against the model's layer count."""
    path = mask_path(name_or_path)
    if not path.exists():
        known = sorted({p.stem for d in (user_masks(), MASK_DIR) for p in d.glob("*.json")})
        raise ConfigError(f"routing mask '{name_or_path}' not found ({path}); known masks: {', '.join(known) or 'none'}"
                          " (python -m search objective=dimr writes one)")
    try:
        data = json.loads(path.read_text())
        skip = tuple(sorted(int(i) for i in data["skip"]))
        layers = int(data["num_layers"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"routing mask {path} is malformed ({type(err).__name__}: {err}); "
                          "expected {\"num_layers\": N, \"skip\": [...]}") from None
    if layers != num_layers:
        raise ConfigError(f"routing mask {path} was made for a {layers}-layer model, this model has {num_layers}")
    if any(not 0 <= i < num_layers for i in skip) or len(skip) >= num_layers:
        raise ConfigError(f"routing mask {path} skips invalid layers {list(skip)} of {num_layers}")
    return skip


def save_mask(path: Path, skip, num_layers: int, **meta) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"num_layers": num_layers, "skip": sorted(int(i) for i in skip), **meta}
    tmp = path.with_suffix(f".json.{os.getpid()}.partial")  # two search workers may export at once
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.rename(path)


def random_mask(num_layers: int, num_skip: int, seed: int) -> tuple[int, ...]:
    """Ablation: `num_skip` layers drawn uniformly, keeping the first and last layer like SWIFT."""
    inner = list(range(1, num_layers - 1))
    if not 0 <= num_skip <= len(inner):
        raise ConfigError(f"cannot skip {num_skip} of the {len(inner)} inner layers")
    return tuple(sorted(random.Random(seed).sample(inner, num_skip)))


def kept_layers(skip, num_layers: int) -> tuple[int, ...]:
    skipped = set(skip)
    return tuple(i for i in range(num_layers) if i not in skipped)
