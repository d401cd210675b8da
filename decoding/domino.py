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

from decoding.block_draft import BlockDraftMethod, sample_tokens
from decoding.domino_head import correction, gru_path_state, gru_step
from decoding.engine import DecodeState, Proposal
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
        draft = self.draft_pass(state)
        z, base = draft.hidden, draft.logits
        prefix = min(self.drafter.spec.pure_draft_prefix_len, len(base))
        pool = None
        if 0 < self.config.candidate_pool < base.shape[-1] and len(base) > prefix:
            pool = torch.topk(base[prefix:].max(dim=0).values, self.config.candidate_pool).indices
        tokens, probs = [], []
        for k in range(len(base)):
            if k < prefix:
                logits = base[k]
            else:
                if k == prefix:  # the GRU has read the root and the uncorrected prefix
                    path = torch.tensor([state.root] + tokens, device=z.device)
                    h = gru_path_state(self.drafter.prefix_gru, self.embed(path).to(z.dtype))
                else:
                    h = gru_step(self.drafter.prefix_gru, self.embed(torch.tensor([tokens[-1]], device=z.device)).to(z.dtype), h[None])[0]
                logits = self._corrected(z[k], h, base[k], pool)
            token, p = self._pick(logits, state)
            tokens.append(token)
            probs.append(p)
        return Proposal(TokenTree.chain(state.root, tokens, probs), hidden_layers=self.taps)

    def _corrected(self, z_k, h, base_k, pool):
        if pool is None:
            return base_k + correction(self.drafter.embed_proj, z_k[None], h[None])[0].float()
        logits = torch.full_like(base_k, float("-inf"))
        logits[pool] = base_k[pool] + correction(self.drafter.embed_proj, z_k[None], h[None], pool)[0].float()
        return logits

    def _pick(self, logits, state: DecodeState):
        if state.greedy or not self.config.sample_draft:
            return int(logits.argmax()), None
        q = torch.softmax(logits / state.temperature, dim=-1)
        return sample_tokens(q[None], state.generator)[0], q


CONFIG = DominoConfig
