"""DFlash (Chen et al. 2026, z-lab/dflash): a block-diffusion drafter proposes a whole block in one
pass; the draft is the chain of per-position argmaxes (with `sample_draft=true`, samples at T > 0),
verified by the target in one forward.

    blk    = [root] + [MASK] * (B - 1)
    h      = drafter(embed(blk), context = tapped target hidden states)   # non-causal block
    logits = lm_head(h[1:])                                               # marginals of depths 1..B-1
    draft  = argmax(logits)            (T > 0 and sample_draft: draft ~ softmax(logits / T))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from decoding.engine.argmax import row_argmax
from decoding.methods.block_draft import BlockDraftMethod, check_verify
from decoding.engine.loop import DecodeState, Proposal
from decoding.engine.transfer import to_host
from decoding.engine.tree import TokenTree


@dataclass
class DFlashConfig:
    _target_: str = "decoding.methods.dflash.DFlash"
    name: str = "dflash"
    # checkpoint: local folder or HF hub id; null = the model's `drafters.dflash` entry
    drafter: Optional[str] = None
    # False = the reference code's draft, always the block's argmax (z-lab issue #74; lossless at any
    # T, every committed token is a target sample); True = z-lab PR #77: sampled at T
    sample_draft: bool = False
    # a sampled draft's verification: exact (DFlash's exact-match chain: a target token drawn per position,
    # the draft followed while it matches) | rejection (ours: min(1, p/q) per token, more acceptance)
    verify: str = "exact"

    def __post_init__(self) -> None:
        check_verify(self)


class DFlash(BlockDraftMethod):
    name = "dflash"

    def propose(self, state: DecodeState) -> Proposal:
        logits = self.draft_pass(state).logits
        if state.greedy or not self.config.sample_draft:
            return Proposal(TokenTree.chain(state.root, row_argmax(logits).tolist()), hidden_layers=self.taps)
        probs = torch.softmax(logits / state.temperature, dim=-1)
        drafts = to_host(state.sampler.for_device(probs.device).categorical(probs))[0]
        return self.sampled_chain(state, drafts, probs)


CONFIG = DFlashConfig
