"""What a model's own forward does around its decoder stack, for the paths that run the stack's modules
themselves (the layer-subset path of decoding/engine/target.py: early-exit and slim drafters, VIA-SD's slim
verifier, DIMR; the exit-head trainer):
- the embedding multiplier (Granite: embeddings x `embedding_multiplier`);
- the logit scale (Granite: logits / `logits_scaling`, HyperCLOVAX: x `logits_scaling`; Cohere: x `logit_scale`);
- the final soft-cap (Gemma 2/3: cap x tanh(logits / cap)).
Read from the config, so another family with the same fields is handled too; each is applied with the
operation its model uses (a division is not replaced by a multiplication by the inverse: the rounding differs).

A family that does something else there (another multiplier, a readout of its own) would give the layer-subset
path another model than the target, silently. `check` compares, on one short uncached forward, this readout
of the model's own embedding and final hidden states with the model's own embedding output and logits, and
raises one line (`UnsupportedArchitecture`) where they differ. Before 2026-12-06 (night) the path applied the
soft-cap only: on Granite and Cohere its logits were another model's (no error).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from decoding.engine.attention_layout import UnsupportedArchitecture

# model types whose forward multiplies the logits by `logits_scaling` (the Granite family divides by it)
SCALING_MULTIPLIES = ("hyperclovax",)
_CHECKED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models whose readout `check_once` has passed


@dataclass(frozen=True)
class Readout:
    embedding_multiplier: float | None = None  # Granite
    logits_divisor: float | None = None  # Granite's logits_scaling
    logits_multiplier: float | None = None  # Cohere's logit_scale, HyperCLOVAX's logits_scaling
    softcap: float | None = None  # Gemma 2/3's final_logit_softcapping

    @classmethod
    def of(cls, config) -> "Readout":
        def field(name: str, neutral: float | None):
            value = getattr(config, name, None)
            return None if value is None or value == neutral else float(value)

        scaling = field("logits_scaling", 1.0)  # Granite divides by it, HyperCLOVAX multiplies
        multiplies = getattr(config, "model_type", None) in SCALING_MULTIPLIES
        return cls(embedding_multiplier=field("embedding_multiplier", 1.0),
                   logits_divisor=None if multiplies else scaling,
                   logits_multiplier=scaling if multiplies else field("logit_scale", 1.0),
                   softcap=field("final_logit_softcapping", None))

    @property
    def plain(self) -> bool:
        """True where the model's forward is lm_head(norm(stack(embed(ids)))) and nothing more."""
        return self == Readout()

    def embed(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The embedding layer's output as the model's stack receives it."""
        return embeddings if self.embedding_multiplier is None else embeddings * self.embedding_multiplier

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The lm_head's output as the model's forward returns it."""
        if self.logits_divisor is not None:
            logits = logits / self.logits_divisor
        if self.logits_multiplier is not None:
            logits = logits * self.logits_multiplier
        return soft_cap(logits, self.softcap)

    def check_once(self, model) -> None:
        """`check` the first time a model is seen (its wrappers and drafters made of its layers share it)."""
        if model not in _CHECKED:
            self.check(model)
            _CHECKED.add(model)

    @torch.inference_mode()
    def check(self, model, tokens: int = 4) -> None:
        """Raise `UnsupportedArchitecture` unless this readout reproduces the model's own embedding output and
        logits on one uncached forward of `tokens` tokens (within rounding: 1e-3 of the largest logit)."""
        device = model.get_input_embeddings().weight.device
        ids = torch.arange(1, tokens + 1, device=device)[None]
        out = model.model(input_ids=ids, use_cache=False, output_hidden_states=True)
        logits = model(input_ids=ids, use_cache=False).logits.float()
        embedded = self.embed(model.get_input_embeddings()(ids))
        ours = self.logits(model.get_output_embeddings()(out.last_hidden_state)).float()
        worst = (ours - logits).abs().max().item()
        embed_worst = (embedded.float() - out.hidden_states[0].float().to(device)).abs().max().item()
        tolerance = 1e-3 * (logits.abs().max().item() + 1.0)
        if worst > tolerance or embed_worst > 1e-3 * (embedded.float().abs().max().item() + 1.0):
            raise UnsupportedArchitecture(
                f"{model.config.model_type}: its forward does something around its decoder stack that the layer-subset "
                f"path (early-exit and slim drafters, VIA-SD's slim verifier, DIMR) does not repeat (logits differ by "
                f"up to {worst:.3g}, embeddings by {embed_worst:.3g}); methods that run the full model still work")


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """The final-logit soft-capping of models that have one (Gemma 2: cap * tanh(logits / cap)), as
    their ForCausalLM forward applies it; identity for the others."""
    return logits if cap is None else torch.tanh(logits / cap) * cap
