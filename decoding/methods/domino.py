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
import torch.nn.functional as F

from decoding.methods.block_draft import BlockDraftMethod
from decoding.engine.loop import DecodeState, Proposal
from decoding.engine.sampling import probabilities
from decoding.engine.transfer import to_host
from decoding.engine.tree import TokenTree
from pipeline.errors import check_range


@dataclass
class DominoConfig:
    _target_: str = "decoding.methods.domino.Domino"
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
        base = draft.logits
        prefix = min(self.drafter.spec.pure_draft_prefix_len, len(base))
        pool = None
        if 0 < self.config.candidate_pool < base.shape[-1] and len(base) > prefix:
            pool = torch.topk(base[prefix:].max(dim=0).values, self.config.candidate_pool).indices
        temperature = state.temperature if not state.greedy and self.config.sample_draft else 0.0
        tokens, dists = corrected_chain(self.head, self.embed, draft.hidden, base, state.root, prefix, pool,
                                        temperature, state.sampler.for_device(base.device))
        drafted = to_host(torch.stack(tokens))[0]
        draft_probs = [None] * len(drafted) if dists is None else list(dists.unbind(0))
        return Proposal(TokenTree.chain(state.root, drafted, draft_probs), hidden_layers=self.taps)


def corrected_chain(head, embed, z, base, root: int, prefix: int, pool, temperature: float, sampler):
    """The chain of the module docstring, on the device: K device-scalar tokens (argmax, or drawn at
    `temperature` > 0) and, at T > 0, the distributions they were drawn from [K, V] (zero outside the
    pool at corrected positions), else None.
    Per-round tables: z's W1 part for every position, the pool's base logits and W2 rows, and the
    round's Gumbel noise (scaled by T: argmax(logits + T g) is a draw from softmax(logits / T)); the
    uncorrected prefix in one pick; per corrected position one embedding-table row, one GRU step with
    one matmul (Float32Head.state_step), one addmv for the corrected logits, one add and one argmax.
    The distributions are one softmax per round, after the loop."""
    z = z.float()
    sampled = temperature > 0
    table = head.input_table(embed)  # [V, 3G]: a GRU step's input is a row of it
    base_pool = base if pool is None else base[:, pool]  # [K, C]
    w2 = head.w2 if pool is None else head.w2[pool]  # [C, E]
    z_proj = z @ head.w_z.t()  # [K, E]
    head_rows = base[:prefix]
    if sampled:
        head_rows = head_rows + temperature * sampler.gumbel(head_rows.shape)
        noise = temperature * sampler.gumbel((len(base) - prefix, base_pool.shape[-1]))
    tokens = list(head_rows.argmax(-1).unbind(0))
    # per-position rows as views made once (one dispatch each, not one index per position)
    z_rows, base_rows = z_proj.unbind(0), base_pool.unbind(0)
    noise_rows = noise.unbind(0) if sampled else ()
    corrected = []  # the corrected positions' logits
    h = torch.zeros(head.gru.hidden_size, device=z.device)
    gh = torch.zeros(head.w_hh_t.shape[1], device=z.device)  # W_hh h of the zero state
    s_proj = None
    for k in range(prefix, len(base)):
        # F.embedding, not table[tok]: indexing with a 0-dim device tensor reads it on the host (a sync)
        if s_proj is None:  # the GRU reads the root and the uncorrected prefix
            for tok in [torch.full((), root, device=z.device), *tokens]:
                h, gh, s_proj = head.state_step(F.embedding(tok, table), h, gh)
        else:
            h, gh, s_proj = head.state_step(F.embedding(tokens[-1], table), h, gh)
        corrected.append(torch.addmv(base_rows[k], w2, F.silu(z_rows[k] + s_proj)))
        pick = (corrected[-1] + noise_rows[k - prefix]).argmax() if sampled else corrected[-1].argmax()
        tokens.append(pick if pool is None else pool.gather(0, pick.view(1)).view(()))
    if not sampled:
        return tokens, None
    dists = probabilities(torch.stack(corrected), temperature) if corrected else \
        z.new_zeros(0, base_pool.shape[-1])
    if pool is not None:  # zero outside the pool: the distribution the draw came from, over the vocabulary
        dists = dists.new_zeros(len(dists), base.shape[-1]).scatter_(1, pool.expand(len(dists), -1), dists)
    return tokens, torch.cat([probabilities(base[:prefix], temperature), dists])


CONFIG = DominoConfig
