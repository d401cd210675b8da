"""What every block-diffusion decoder (DFlash, DDTree, CaDDTree, Domino, DominoTree) shares: load the
drafter, feed it the target's tapped hidden states, run one drafting pass per step.

Context bookkeeping: the prefill taps the prompt (minus the root); after each verified step the
accepted rows' hidden states, `output.hidden[layer][verdict.path]` (root + accepted drafts), are
the next pass's new context. The drafter caches their projected K/V, so each pass only projects
what was committed since the last one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.drafting.dflash_drafter import DFlashDrafter, load_drafter
from decoding.drafting.domino_head import Float32Head
from decoding.engine.transfer import to_device
from decoding.engine.loop import DecodeState, Method, Proposal, StepResult
from decoding.engine.target import ForwardOutput, TargetModel
from decoding.engine.tree import TokenTree
from pipeline.errors import ConfigError, check_choice


def check_verify(cfg) -> None:
    """`method.verify` of a sampled chain (BlockDraftMethod.sampled_chain): exact | rejection, the latter
    only with `sample_draft` (an argmax draft is verified by exact match whatever it says)."""
    check_choice("method.verify", cfg.verify, ("exact", "rejection"))
    if cfg.verify == "rejection" and not cfg.sample_draft:
        raise ConfigError("method.verify=rejection verifies a sampled draft: set method.sample_draft=true "
                          "(an argmax draft is verified by exact match)")


@dataclass
class DraftPass:
    hidden: torch.Tensor  # [K, H] backbone output of the K draft positions (row d -> depth d + 1)
    logits: torch.Tensor  # [K, V] float32 base logits (target lm_head)


class BlockDraftMethod(Method):
    """Subclasses set `needs_domino` and implement `propose` with `self.draft_pass(state)`."""

    needs_domino = False

    def setup(self, target: TargetModel) -> None:
        location = self.config.drafter
        kind = "domino" if self.needs_domino else "dflash"
        if not location:
            raise ConfigError(f"method={self.name}: no {kind} drafter is known for this model; set "
                              f"method.drafter=<folder or HF hub id> (train one: python -m pipeline.train drafter={kind})")
        drafter = load_drafter(location, device=target.device, dtype=target.dtype)
        spec = drafter.spec
        if spec.is_domino != self.needs_domino:
            what = "a Domino checkpoint (GRU head, shift_label semantics)" if spec.is_domino else "a plain DFlash checkpoint"
            use = "method=domino or dominotree" if spec.is_domino else "method=dflash, ddtree or caddtree"
            raise ConfigError(f"method={self.name}: drafter {location} is {what}; use {use}")
        cfg = target.config
        if spec.hidden_size != cfg.hidden_size or max(spec.target_layer_ids) >= cfg.num_hidden_layers:
            raise ConfigError(f"method={self.name}: drafter {location} does not fit this target (hidden "
                              f"{spec.hidden_size} vs {cfg.hidden_size}, taps {spec.target_layer_ids} of "
                              f"{cfg.num_hidden_layers} layers)")
        self.target = target
        self.drafter: DFlashDrafter = drafter
        self.embed = target.model.get_input_embeddings()
        self.lm_head = target.model.get_output_embeddings()
        self.taps = tuple(spec.target_layer_ids)
        self.head = Float32Head(drafter) if spec.is_domino else None  # the correction runs in fp32

    def prefill_hidden_layers(self) -> tuple[int, ...]:
        return self.taps

    @property
    def verifies_by_rejection(self) -> bool:
        """`method.verify=rejection` [ours]: a sampled chain carries its distributions and the engine accepts
        each token with min(1, p/q); `exact` (the released DFlash and Domino): the engine draws a target token
        at each position and follows the draft while it matches (less acceptance, the same output distribution)."""
        return self.config.verify == "rejection"

    def sampled_chain(self, state: DecodeState, tokens: list[int], probs) -> Proposal:
        """The chain of `tokens` drafted at T > 0 from the per-position distributions `probs` (None where the
        method did not compute them), which it carries only when verified by rejection sampling."""
        draft_probs = list(probs) if probs is not None and self.verifies_by_rejection else None
        return Proposal(TokenTree.chain(state.root, tokens, draft_probs), hidden_layers=self.taps)

    def on_prefill(self, state: DecodeState, output: ForwardOutput) -> None:
        self.new_context = self._features(output, None)

    def begin(self, state: DecodeState) -> None:
        self.cache = self.drafter.new_cache()

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.new_context = self._features(result.output, result.verdict.path)

    def _features(self, output: ForwardOutput, rows: list[int] | None) -> torch.Tensor:
        if not output.hidden:
            return torch.empty(0, len(self.taps) * self.drafter.spec.hidden_size, device=self.target.device,
                               dtype=self.target.dtype)
        feats = [output.hidden[layer] for layer in self.taps]
        if rows is not None:
            index = to_device(rows, feats[0].device)
            feats = [f.index_select(0, index) for f in feats]
        return torch.cat(feats, dim=-1)

    @torch.inference_mode()
    def draft_pass(self, state: DecodeState) -> DraftPass:
        spec = self.drafter.spec
        block = torch.full((spec.block_size,), spec.mask_token_id, device=self.target.device)
        block[:1].fill_(state.root)  # not block[0] = root: on CUDA that copies a CPU scalar (a blocking copy)
        start = self.target.cache_len  # the root's position
        hidden = self.drafter.draft(self.cache, self.new_context, self.embed(block), start)
        self.new_context = self.new_context[:0]
        rows = hidden if spec.shift_label else hidden[1:]
        return DraftPass(rows, self.head_logits(rows))

    def head_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """The target's lm_head over the drafted rows: the last layer of the drafting pass (on the drafter's
        device: under a device_map the head may sit on another GPU)."""
        return self.lm_head(rows).to(rows.device).float()

