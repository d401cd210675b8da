"""Domino (Huang et al. 2026, jianuo-huang/Domino): DFlash's block pass plus a causal correction,
so each drafted token depends on the tokens actually drafted before it.

    base = lm_head(z)                                # z: the drafting pass, one row per position
    t_1..t_p = argmax(base[:p])                       # p = pure_draft_prefix_len, uncorrected
    h = GRU(embed([root, t_1..t_p]))
    for k = p .. K-1:
        t_{k+1} = argmax over pool C of base[k] + W2 . SiLU(W1 [z_k; h])    (sampled at T > 0)
        h = GRUCell(embed(t_{k+1}), h)
C = top-`candidate_pool` tokens of max_k base[k] (Domino's DFLASH_DOMINO_CANDIDATE_POOL; 0 = full vocab).
The chain is verified by the engine, by exact match (a sampled draft too, as released) or, with
`method.verify=rejection` [ours], by rejection sampling against the distribution it was drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from decoding.engine.compiled import maybe_compiled
from decoding.engine import cuda_graph
from decoding.engine.cuda_graph import GraphReplayer
from decoding.methods.block_draft import BlockDraftMethod, check_verify
from decoding.engine.loop import DecodeState, Proposal
from decoding.engine.sampling import probabilities
from decoding.engine.transfer import to_host
from decoding.drafting.domino_head import gru_step
from pipeline.errors import check_range


@dataclass
class DominoConfig:
    _target_: str = "decoding.methods.domino.Domino"
    name: str = "domino"
    drafter: Optional[str] = None  # local folder or HF hub id; null = the model's `drafters.domino`
    candidate_pool: int = 2048  # Domino's released rollout: correction over the top-2048 pool (0 = full vocab)
    sample_draft: bool = True  # released Domino samples the draft at T
    # ... and verifies it by exact match (DFlash's chain: a target token drawn per position, the draft followed
    # while it matches) | rejection (ours: the draft's distribution carried, min(1, p/q) per token). Either is
    # lossless; a greedy draft (T=0) is verified the same way by both (sample_draft=false: exact only).
    verify: str = "exact"
    compile: bool = False  # torch.compile the correction chain (decoding/engine/compiled.py): one compile per run
    # on CUDA, replay the corrected positions from one CUDA graph per round (decoding/engine/cuda_graph.py), not
    # ~14 kernel launches per position; not used with compile (torch.compile makes its own program)
    cuda_graph: bool = True

    def __post_init__(self) -> None:
        check_range("method.candidate_pool", self.candidate_pool, 0)
        check_verify(self)


class Domino(BlockDraftMethod):
    name = "domino"
    needs_domino = True

    def setup(self, target) -> None:
        super().setup(target)
        self.graphs = cuda_graph.graphs_for(self.head.w2.device, self.config.cuda_graph and not self.config.compile,
                                            "method.cuda_graph")
        self.chain = graphed_chain(self.graphs) if self.graphs.enabled else \
            maybe_compiled(chain_picks, self.config.compile, "method.compile")

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Proposal:
        draft = self.draft_pass(state)
        base = draft.logits
        prefix = min(self.drafter.spec.pure_draft_prefix_len, len(base))
        pool = None
        if 0 < self.config.candidate_pool < base.shape[-1] and len(base) > prefix:
            # amax, not max(dim=0): the values-and-indices reduction across rows is ~30x slower on a CPU
            pool = torch.topk(base[prefix:].amax(0), self.config.candidate_pool).indices
        temperature = state.temperature if not state.greedy and self.config.sample_draft else 0.0
        tokens, dists = corrected_chain(self.head, self.embed, draft.hidden, base, state.root, prefix, pool,
                                        temperature, state.sampler.for_device(base.device), self.chain,
                                        self.verifies_by_rejection)
        # dists: None for a greedy draft, or one verified by exact match
        return self.sampled_chain(state, to_host(tokens)[0], None if dists is None else dists.unbind(0))


def corrected_chain(head, embed, z, base, root: int, prefix: int, pool, temperature: float, sampler,
                    chain=None, distributions: bool = True):
    """The chain of the module docstring, on the device: the K drafted tokens [K] (argmax, or drawn at
    `temperature` > 0) and, at T > 0 with `distributions` (rejection-sampling verification), the
    distributions they were drawn from [K, V] (zero outside the pool at corrected positions), else None.
    Per round: z's W1 part for every position, the pool's base logits, and the round's Gumbel noise
    (scaled by T: argmax(logits + T g) is a draw from softmax(logits / T)); the uncorrected prefix in one
    pick; the corrected positions by `chain` (chain_picks, its compiled form or its CUDA-graph replay); the
    distributions in one softmax after it."""
    table = head.input_table(embed)  # [V, 3G]: a GRU step's input is a row of it
    base_pool = base if pool is None else base.index_select(1, pool)  # [K, C]
    z_proj = z[prefix:].float() @ head.w_z.t()  # [K - prefix, E]
    prefix_rows = base[:prefix]
    noise = None
    if temperature > 0:
        prefix_rows = prefix_rows + temperature * sampler.gumbel(prefix_rows.shape)
        noise = temperature * sampler.gumbel((len(base) - prefix, base_pool.shape[-1]))
    first = torch.cat([torch.full((1,), root, device=base.device), prefix_rows.argmax(-1)])  # root + prefix
    if len(base) == prefix:
        tokens, corrected = first[1:], base_pool[:0]
    else:
        picks, corrected = (chain or chain_picks)(table, head.w_next_t, head.w2, z_proj, base_pool[prefix:], noise,
                                                  first, pool)
        tokens = torch.cat([first[1:], picks])
    if temperature <= 0 or not distributions:
        return tokens, None
    dists = probabilities(corrected, temperature)
    if pool is not None:  # zero outside the pool: the distribution the draw came from, over the vocabulary
        dists = dists.new_zeros(len(dists), base.shape[-1]).scatter_(1, pool.expand(len(dists), -1), dists)
    return tokens, torch.cat([probabilities(base[:prefix], temperature), dists])


def chain_picks(table, w_next_t, w2, z_proj, base_rows, noise, first, pool):
    """The corrected positions, one after another: the pool's rows of W2 [V, E] (`w2`: the head's), then the
    GRU reads `first` (root and uncorrected prefix), then per position one addmv for the corrected logits,
    one add of its noise (T > 0) and one argmax, one embedding-table row and one GRU step with one matmul
    (`gru_step`). Returns the picked token ids [n] and the corrected logits [n, C]. A pure tensor function of
    its inputs, so `decoding.engine.compiled` can compile it whole and a CUDA graph can capture it."""
    w2 = w2 if pool is None else F.embedding(pool, w2)  # [C, E]: rows gathered, cheaper than w2[pool]
    g, n = w_next_t.shape[0], base_rows.shape[0]
    h = z_proj.new_zeros(g)
    gh_ru, gh_n = z_proj.new_zeros(3 * g).split((2 * g, g))  # W_hh h of the zero state
    z_rows, base_list = z_proj.unbind(0), base_rows.unbind(0)  # views made once, not one index per position
    noise_rows = noise.unbind(0) if noise is not None else None
    s_proj = None
    # F.embedding, not table[tok]: indexing with a 0-dim device tensor reads it on the host (a sync)
    for tok in first.unbind(0):
        h, gh_ru, gh_n, s_proj = gru_step(F.embedding(tok, table), h, gh_ru, gh_n, w_next_t)
    picks, rows = [], []
    for k in range(n):
        rows.append(torch.addmv(base_list[k], w2, F.silu(z_rows[k] + s_proj)))
        pick = (rows[-1] + noise_rows[k]).argmax() if noise_rows is not None else rows[-1].argmax()
        # gather, not take: torch.compile cannot trace take with a data-dependent index (method.compile)
        picks.append(pick if pool is None else pool.gather(0, pick.view(1)).view(()))
        if k + 1 < n:
            h, gh_ru, gh_n, s_proj = gru_step(F.embedding(picks[-1], table), h, gh_ru, gh_n, w_next_t)
    return torch.stack(picks), torch.stack(rows)


def graphed_chain(graphs: GraphReplayer):
    """`chain_picks` replayed from a graph of `graphs`: one per branch (T = 0 without noise, T > 0 with it;
    with and without a candidate pool), captured in the first round that takes it. The round's inputs (pool,
    base logits, z-part of W1, noise, root and prefix) are copied into the graph's buffers; the head's weights
    are read in place. The outputs are the graph's buffers, which `corrected_chain` reads before the next
    round overwrites them."""

    def chain(table, w_next_t, w2, z_proj, base_rows, noise, first, pool):
        name = f"chain:{'greedy' if noise is None else 'sampled'}:{'vocab' if pool is None else 'pool'}"
        return graphs(name, chain_picks,
                      {"z_proj": z_proj, "base_rows": base_rows, "noise": noise, "first": first, "pool": pool},
                      {"table": table, "w_next_t": w_next_t, "w2": w2})

    return chain


CONFIG = DominoConfig
