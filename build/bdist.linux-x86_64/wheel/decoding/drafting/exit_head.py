"""Trained exit head of the early-exit drafter: a tuned-lens translator (Belrose et al., 2023,
"Eliciting Latent Predictions from Transformers with the Tuned Lens").

The residual stream after the first k decoder layers is not yet in the basis the final norm and
lm_head read (the "logit lens" is poor in early layers); an affine map h -> h + A h + b, trained to
minimise KL(q || p) against the full target's next-token distribution q, translates it. A and b start
at zero, so an untrained head is exactly the plain early exit. The target's final norm and lm_head
stay shared and frozen: the head adds H*H + H weights (0.33 M for SmolLM2-135M), nothing else.

Checkpoint: a folder with `model.safetensors` (`proj.weight`, `proj.bias`) and `config.json`
(`kind`, `exit_layer`, `hidden_size`), written by `python -m pipeline.train drafter=exit_head`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from decoding.drafting.dflash_drafter import local_folder
from pipeline.errors import ConfigError

HEAD_KIND = "tuned_lens"


class ExitTranslator(torch.nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, hidden_size, bias=True)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.proj(h)


def save_exit_head(head: ExitTranslator, out_dir: Path, exit_layer: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(out_dir / "model.safetensors"))
    config = {"kind": HEAD_KIND, "exit_layer": exit_layer, "hidden_size": head.proj.in_features}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))


def head_folder(path: str) -> Path:
    """The checkpoint folder (decoding/drafting/dflash_drafter.py's `local_folder`; as given if there is none)."""
    return local_folder(path) or Path(path)


def read_exit_head(path: str, dtype: torch.dtype = torch.float32,
                   field: str = "drafter.head") -> tuple[ExitTranslator, int]:
    """(head, exit_layer) from a checkpoint folder (`head_folder`); one clear error, naming the config
    `field`, if it is missing or malformed."""
    folder = head_folder(path)
    try:
        config = json.loads((folder / "config.json").read_text())
        state = load_file(str(folder / "model.safetensors"))
    except FileNotFoundError:
        raise ConfigError(f"{field}={path}: no exit-head checkpoint there (train one with "
                          f"`python -m pipeline.train drafter=exit_head drafter.exit_layer=<k>`)") from None
    except Exception as err:  # bad JSON, a truncated or foreign safetensors file (SafetensorError)...
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{field}={path}: unreadable exit-head checkpoint ({reason})") from None
    if not isinstance(config, dict) or config.get("kind") != HEAD_KIND or \
            not {"exit_layer", "hidden_size"} <= set(config):
        raise ConfigError(f"{field}={path}: config.json is not a {HEAD_KIND} exit head")
    head = ExitTranslator(int(config["hidden_size"]))
    try:
        head.load_state_dict(state)
    except RuntimeError as err:
        detail = [line.strip() for line in str(err).splitlines() if line.strip()][-1]  # the mismatch, not the header
        raise ConfigError(f"{field}={path}: weights do not match config.json ({detail})") from None
    return head.to(dtype).eval().requires_grad_(False), int(config["exit_layer"])


def load_exit_head(path: str, target, exit_layer: int, field: str = "drafter.head") -> ExitTranslator:
    """The head for an early exit after `exit_layer` layers of `target` (a TargetModel), on its
    device and dtype; refused if it was trained for another exit or hidden size."""
    head, trained_at = read_exit_head(path, target.dtype, field)
    if trained_at != exit_layer or head.proj.in_features != target.config.hidden_size:
        raise ConfigError(f"{field}={path} was trained for exit layer {trained_at} and hidden size "
                          f"{head.proj.in_features}; this drafter exits at {exit_layer} of a model with "
                          f"hidden size {target.config.hidden_size}")
    return head.to(target.device)
