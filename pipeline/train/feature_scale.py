"""`drafter.feature_scale=rms` (ours; EAGLE-3, SpecForge and z-lab's DFlash trainer feed `fc` the raw
features): a drafter's `fc` trains on the target's tapped features divided per dimension by their RMS over
answer positions. Why: the tapped layers' features differ in scale by orders of magnitude (SmolLM2-135M:
median RMS 1.2 at layer 1, 13.7 at layer 26, one dimension near 360 on every token), and Adam moves every
weight by about the same step, so fc's output follows a large dimension hundreds of times faster than a
small one. Exports fold the scale back into fc (the published formats have none); the training state keeps
the scaled weights and the scale (`feature_scale.pt` in the state dir), so a resume continues in the same
coordinates. Used by the EAGLE-3 trainer (pipeline/train/eagle3.py) and the DFlash/Domino one
(pipeline/train/trainer.py: a fresh DFlash drafter then skips `scale_fc_columns`, its default one-off
rescaling of fc's random start by median(std)/std; Domino moves its trained backbone's fc into the scaled
coordinates)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable

import torch

from pipeline.errors import ConfigError


class FeatureScale:
    """A per-dimension divisor of fc's input. `none`: a scale of ones (dividing by it changes nothing)."""

    def __init__(self, scale: torch.Tensor):
        self.scale = scale

    def features(self, feats: torch.Tensor) -> torch.Tensor:
        return feats / self.scale.to(feats)

    @contextmanager
    def folded(self, model):
        """`model` (a drafter with an `fc` Linear) with fc in the raw features' coordinates (for an export),
        restored bit for bit after."""
        trained = model.fc.weight.detach().clone()
        with torch.no_grad():
            model.fc.weight.div_(self.scale.to(trained))
        try:
            yield model
        finally:
            with torch.no_grad():
                model.fc.weight.copy_(trained)


@torch.no_grad()
def rms_of_rows(rows: Iterable[torch.Tensor]) -> torch.Tensor:
    """Per-dimension RMS (float32, CPU) over all the rows of the [n, D] tensors in `rows`, floored at a
    hundredth of the median (a dimension silent in these rows must not blow up elsewhere)."""
    total, count = None, 0
    for block in rows:
        block = block.float()
        total = block.pow(2).sum(0) + (0 if total is None else total)
        count += len(block)
    rms = (total / max(count, 1)).sqrt()
    return rms.clamp(min=0.01 * float(rms.median())).cpu()


def run_feature_scale(mode: str, state_dir: Path, model, measure: Callable[[], torch.Tensor],
                      fresh: bool) -> FeatureScale:
    """The run's FeatureScale: the state dir's (a resume) or `measure()`d and saved there. A trained
    drafter's fc is moved into its coordinates (same function); a `fresh` one keeps its random start, drawn
    as it is in the scaled coordinates (multiplied, the columns of large features would start far larger than
    Adam's steps can move in a short run)."""
    from pipeline.train.trainer import atomic_save

    path = state_dir / "feature_scale.pt"
    resumed = (state_dir / "train_state.pt").exists()
    if resumed and path.exists() != (mode == "rms"):
        raise ConfigError(f"drafter.feature_scale={mode}: drafter.state_dir={state_dir} holds a run trained with "
                          f"feature_scale={'rms' if path.exists() else 'none'}: set that, or give this run its own "
                          "state_dir")
    if not resumed:
        path.unlink(missing_ok=True)  # left by a run stopped before its first checkpoint
    if mode == "none":
        return FeatureScale(torch.ones(model.fc.in_features))
    if resumed:
        scale = torch.load(path)
    else:
        scale = measure()
        atomic_save(scale, path)
    if not (fresh or resumed):  # a resume loads its weights, already in these coordinates, from its state
        with torch.no_grad():
            model.fc.weight.mul_(scale.to(model.fc.weight))
    return FeatureScale(scale)
