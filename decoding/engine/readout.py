"""What a model's own forward does around its decoder stack, for the paths that run the stack's modules
themselves (the layer-subset path of decoding/engine/target.py: early-exit and slim drafters, VIA-SD's slim
verifier, DIMR; the exit-head trainer):
- the embedding multiplier (Granite: embeddings x `embedding_multiplier`);
- the logit scale (Granite: logits / `logits_scaling`, HyperCLOVAX: x `logits_scaling`; Cohere: x `logit_scale`;
  MiniCPM3 divides the final hidden states by its `logits_scaling` before the head);
- the final soft-cap (Gemma 2/3: cap x tanh(logits / cap)).
Read from the config, so another family with the same fields is handled too; each is applied with the
operation its model uses (a division is not replaced by a multiplication by the inverse: the rounding differs).

A family that does something else there (another multiplier, a readout of its own) would give the layer-subset
path (and the static pass of decoding/engine/static_forward.py) another model than the target, silently. `check`
compares, on one short uncached forward, this readout of the model's own embedding and final hidden states with
the model's own embedding output and logits, and raises one line (`UnsupportedArchitecture`) where they differ
by more than a few roundings of the model's dtype (two forwards of a model whose kernels are not bitwise
deterministic, e.g. an MoE's scattered adds on a GPU, differ by a rounding; a scale the readout misses differs
by far more). Before 2026-12-06 (night) the path applied the soft-cap only: on Granite and Cohere its logits
were another model's (no error).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from decoding.engine.attention_layout import UnsupportedArchitecture

# what `logits_scaling` means, by model type: the Granite family divides the logits by it (the default), these
# multiply them, and these divide the final hidden states before the head
SCALING_MULTIPLIES = ("hyperclovax",)
SCALING_BEFORE_HEAD = ("minicpm3",)
CHECK_ROUNDINGS = 8  # the check's tolerance: roundings (eps of the model's dtype, >= 2^-16) of the largest value
# who computes logits with the readout, for the error line of a model it does not reproduce
LAYER_SUBSET_USERS = "the layer-subset path (early-exit and slim drafters, VIA-SD's slim verifier, DIMR)"
_CHECKED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models whose readout `check_once` has passed


@dataclass(frozen=True)
class Readout:
    embedding_multiplier: float | None = None  # Granite
    hidden_divisor: float | None = None  # MiniCPM3's logits_scaling, before the head
    logits_divisor: float | None = None  # Granite's logits_scaling
    logits_multiplier: float | None = None  # Cohere's logit_scale, HyperCLOVAX's logits_scaling
    softcap: float | None = None  # Gemma 2/3's final_logit_softcapping

    @classmethod
    def of(cls, config) -> "Readout":
        def field(name: str, neutral: float | None):
            value = getattr(config, name, None)
            # a value that is not a number (MPT's logit_scale may be "inv_sqrt_d_model") is not ours to read: the
            # check then decides whether the model's forward matches without it
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value == neutral:
                return None
            return float(value)

        scaling, model_type = field("logits_scaling", 1.0), getattr(config, "model_type", None)
        return cls(embedding_multiplier=field("embedding_multiplier", 1.0),
                   hidden_divisor=scaling if model_type in SCALING_BEFORE_HEAD else None,
                   logits_divisor=scaling if model_type not in SCALING_MULTIPLIES + SCALING_BEFORE_HEAD else None,
                   logits_multiplier=scaling if model_type in SCALING_MULTIPLIES else field("logit_scale", 1.0),
                   softcap=field("final_logit_softcapping", None))

    @property
    def linear_factor(self) -> float:
        """The readout's linear part as one factor of the head's rows (the soft-cap is not linear)."""
        factor = 1.0
        for divisor in (self.hidden_divisor, self.logits_divisor):
            factor = factor if divisor is None else factor / divisor
        return factor if self.logits_multiplier is None else factor * self.logits_multiplier

    def embed(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The embedding layer's output as the model's stack receives it."""
        return embeddings if self.embedding_multiplier is None else embeddings * self.embedding_multiplier

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final (normed) hidden states as the model's head receives them."""
        return hidden if self.hidden_divisor is None else hidden / self.hidden_divisor

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The lm_head's output as the model's forward returns it."""
        if self.logits_divisor is not None:
            logits = logits / self.logits_divisor
        if self.logits_multiplier is not None:
            logits = logits * self.logits_multiplier
        return soft_cap(logits, self.softcap)

    def read(self, head, hidden: torch.Tensor) -> torch.Tensor:
        """Logits from the final (normed) hidden states, as the model's forward computes them."""
        return self.logits(head(self.head_input(hidden)))

    def check_once(self, model, user: str = LAYER_SUBSET_USERS) -> None:
        """`check` the first time a model is seen (its wrappers and drafters made of its layers share it)."""
        if model not in _CHECKED:
            self.check(model, user=user)
            _CHECKED.add(model)

    @torch.inference_mode()
    def check(self, model, tokens: int = 4, user: str = LAYER_SUBSET_USERS) -> None:
        """Raise `UnsupportedArchitecture` unless this readout reproduces the model's own embedding output and
        logits on one uncached forward of `tokens` tokens (within CHECK_ROUNDINGS roundings). `user`: what
        would compute another model (the error line names it)."""
        embedding = model.get_input_embeddings()
        ids = torch.arange(1, tokens + 1, device=embedding.weight.device)[None]
        out = model.model(input_ids=ids, use_cache=False, output_hidden_states=True)
        logits = model(input_ids=ids, use_cache=False).logits  # on the input device (accelerate's hook)
        ours = self.read(model.get_output_embeddings(), out.last_hidden_state).to(logits.device)
        embedded = self.embed(embedding(ids)).to(logits.device)
        given = out.hidden_states[0].to(logits.device)
        gaps = torch.stack([(ours.float() - logits.float()).abs().max(), logits.float().abs().max(),
                            (embedded.float() - given.float()).abs().max(), given.float().abs().max()])
        worst, top, embed_worst, embed_top = gaps.tolist()  # one host read
        if worst > tolerance(logits.dtype, top) or embed_worst > tolerance(logits.dtype, embed_top):
            raise UnsupportedArchitecture(
                f"{model.config.model_type}: its forward does something around its decoder stack that {user} does "
                f"not repeat (logits differ by up to {worst:.3g}, embeddings by {embed_worst:.3g}); methods that run "
                f"the full model eagerly still work")


def tolerance(dtype: torch.dtype, top: float) -> float:
    """How far two computations of the same values, of largest magnitude `top`, may differ: CHECK_ROUNDINGS
    roundings of `dtype` (at least 2^-16: fp32 kernels differ by more than its eps between paths)."""
    return CHECK_ROUNDINGS * max(torch.finfo(dtype).eps, 2.0 ** -16) * (top + 1.0)


def mark_checked(model) -> None:
    """Count `model` as checked without running the check (a model on the meta device has no values to compare)."""
    _CHECKED.add(model)


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """The final-logit soft-capping of models that have one (Gemma 2: cap * tanh(logits / cap)), as
    their ForCausalLM forward applies it; identity for the others."""
    return logits if cap is None else torch.tanh(logits / cap) * cap
