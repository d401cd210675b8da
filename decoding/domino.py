"""Domino (Huang et al. 2026, jianuo-huang/Domino): DFlash's block pass plus a causal correction,
so each drafted token depends on the tokens actually drafted before it.

    base = lm_head(z)                                # z: the drafting pass, one row per position
    t_1..t_p = argmax(base[:p])                       # p = pure_draft_prefix_len, uncorrected
    h = GRU(embed([root, t_1..t_p]))
    for k = p .. K-1:
        t_{k+1} = argmax over pool C of base[k] + W2 . SiLU(W1 [z_k; h])    (sampled at T > 0)
        h = GRUCell(embed(t_{k+1}), h)
C = top-`candidate_pool` tokens of max_k base[k] (Domino's DFLASH_DOMINO_CANDIDATE_POOL; 0 = full vocab).
The chain is verified by the engine; sampled drafts carry their distribution, so T > 0 stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from decoding.block_draft import BlockDraftMethod
from decoding.domino_head import correction, gru_path_state, gru_step
from decoding.engine import DecodeState, Proposal
from decoding.sampling import to_host
from decoding.tree import TokenTree
from pipeline.errors import check_range


@dataclass
class DominoConfig:
    _target_: str = "decoding.domino.Domino"
    name: str = "domino"
    drafter: Optional[str] = None  # local folder or HF hub id; null = the model's `drafters.domino`
    candidate_pool: int = 2048  # Domino's released rollout: correction over the top-2048 pool (0 = full vocab)
    sample_draft: bool = True  # released Domino samples the draft at T (verified by rejection sampling)

    def __post_init__(self) -> None:
        check_range("method.candidate_pool", self.candidate_pool, 0)


class Domino(BlockDraftMethod):
    name = "domino"
    needs_domino = True

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Proposal:
        """The whole chain stays on the device (each token feeds the next GRU step as a tensor);
        one host copy of the K tokens at the end."""
        draft = self.draft_pass(state)
        z, base = draft.hidden.float(), draft.logits
        head, sampled = self.head, not state.greedy and self.config.sample_draft
        sampler = state.sampler.for_device(base.device)
        prefix = min(self.drafter.spec.pure_draft_prefix_len, len(base))
        pool = None
        if 0 < self.config.candidate_pool < base.shape[-1] and len(base) > prefix:
            pool = torch.topk(base[prefix:].max(dim=0).values, self.config.candidate_pool).indices
        tokens, probs = [], []
        root = torch.full((1,), state.root, device=z.device)
        h = None
        for k in range(len(base)):
            if k < prefix:
                logits = base[k]
            else:
                if h is None:  # the GRU has read the root and the uncorrected prefix
                    h = gru_path_state(head.gru, self.embed(torch.cat([root, *tokens])).float())
                else:
                    h = gru_step(head.gru, self.embed(tokens[-1]).float(), h[None])[0]
                logits = self._corrected(z[k], h, base[k], pool)
            q = torch.softmax(logits / state.temperature, dim=-1) if sampled else None
            tokens.append((sampler.categorical(q) if sampled else logits.argmax()).view(1))
            probs.append(q)
        drafted = to_host(torch.cat(tokens))[0]
        return Proposal(TokenTree.chain(state.root, drafted, probs), hidden_layers=self.taps)

    def _corrected(self, z_k, h, base_k, pool):
        proj = self.head.embed_proj
        if pool is None:
            return base_k + correction(proj, z_k[None], h[None])[0]
        return torch.full_like(base_k, float("-inf")).index_put_(
            (pool,), base_k[pool] + correction(proj, z_k[None], h[None], pool)[0])


CONFIG = DominoConfig
