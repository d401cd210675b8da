"""DominoTree's conditional children scorer (slin-zhq/Domino-Tree `make_conditional_children_fn`),
as an `expand` for `decoding.drafting.draft_tree.build_best_first`.

A node's GRU state has read the target embeddings of its own root path; its children at depth
d + 1 are scored with the Domino correction given that state:
    d < pure_draft_prefix_len : top-K of log_softmax(base[d])                (uncorrected)
    otherwise                 : C = top-M(base[d]);  s = base[d][C] + W2[C] . SiLU(W1 [z_d; h_node])
                                top-K of log_softmax(s) over C
Backbone hidden states z and base logits come from the one drafting pass and are shared.

Two implementations, which must build identical trees:
- `ReferenceScorer`: the straightforward per-node computation (the GRU cell, embed_proj's modules).
- `FastScorer`: per-round tables on the model's device (top-M ids, W2 rows, base values, the
  z-part of W1 and the GRU input projection of every candidate token), node states in one device
  buffer, and one device->host copy per expanded node (the heap needs the K scores). On CUDA the
  per-node math is captured once in a CUDA graph whose static table buffers each round refills,
  and replayed per node (written for GPUs, not exercised on this CPU-only machine).
"""

from __future__ import annotations

import torch

from decoding.drafting.domino_head import correction, gru_cell


class ReferenceScorer:
    @torch.inference_mode()
    def __init__(self, drafter, head, embed, z: torch.Tensor, base: torch.Tensor, k: int, m: int):
        """`head`: the drafter's Float32Head (decoding/drafting/domino_head.py); all head math in fp32."""
        self.gru, self.proj, self.embed = head.gru, head.embed_proj, embed
        self.w_hh_t = head.w_hh_t
        self.prefix = drafter.spec.pure_draft_prefix_len
        self.z, self.base, self.k = z.float(), base, k
        self.cand = [torch.topk(base[d], min(m, base.shape[-1])).indices for d in range(len(base))]
        self.states: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def __call__(self, node: int, parent: int, token: int, depth: int) -> tuple[list[int], list[float]]:
        parent_state = self.states[parent] if parent >= 0 else torch.zeros(self.gru.hidden_size, device=self.z.device)
        emb = self.embed(torch.tensor([token], device=self.z.device)).float()[0]
        # the GRU cell written out in fp32, not nn.GRU: cuDNN's RNNs default to TF32 on GPUs, which would
        # make this builder and the fast one (plain fp32 matmuls) disagree there
        state = self.states[node] = gru_cell(self.gru.weight_ih_l0 @ emb, parent_state, self.w_hh_t)
        if depth < self.prefix:
            values, ids = torch.topk(torch.log_softmax(self.base[depth].float(), -1), self.k)
            return ids.tolist(), values.tolist()
        cand = self.cand[depth]
        corrected = self.base[depth][cand] + correction(self.proj, self.z[depth][None], state[None], cand)[0]
        values, local = torch.topk(torch.log_softmax(corrected, -1), min(self.k, len(cand)))
        return cand[local].tolist(), values.tolist()


def expand_step(gi, h, depth_index, z_proj, base_c, w2_c, w1_state, w_hh_t, k: int):
    """One expanded node: its GRU state, then the top-K of its corrected children over the depth's
    candidates -> (state, log-probs, local candidate indices). Shapes never change, so on CUDA this
    is what the graph captures."""
    state = gru_cell(gi, h, w_hh_t)
    mid = torch.nn.functional.silu(z_proj.index_select(0, depth_index)[0] + w1_state @ state)
    scores = base_c.index_select(0, depth_index)[0] + w2_c.index_select(0, depth_index)[0] @ mid
    values, local = torch.topk(torch.log_softmax(scores, -1), min(k, scores.shape[-1]))
    return state, values, local


class StepGraph:
    """CUDA graph of `expand_step` with static buffers, captured once per drafter and reused every
    round: a round copies its tables in (`load`), each expansion copies gi/h/depth in and replays."""

    def __init__(self, z_proj, base_c, w2_c, w1_state, w_hh_t, k: int):
        self.tables = [t.clone() for t in (z_proj, base_c, w2_c)]
        self.gi = torch.zeros(w_hh_t.shape[1], device=w_hh_t.device, dtype=w_hh_t.dtype)
        self.h = torch.zeros(w_hh_t.shape[0], device=w_hh_t.device, dtype=w_hh_t.dtype)
        self.depth = torch.zeros(1, dtype=torch.long, device=w_hh_t.device)
        args = (self.gi, self.h, self.depth, *self.tables, w1_state, w_hh_t, k)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            expand_step(*args)  # warm-up outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = expand_step(*args)

    def fits(self, z_proj, base_c, w2_c) -> bool:
        return all(a.shape == b.shape for a, b in zip(self.tables, (z_proj, base_c, w2_c)))

    def load(self, z_proj, base_c, w2_c) -> None:
        for static, table in zip(self.tables, (z_proj, base_c, w2_c)):
            static.copy_(table)

    def __call__(self, gi, h, depth_index):
        self.gi.copy_(gi)
        self.h.copy_(h)
        self.depth.copy_(depth_index)
        self.graph.replay()
        return self.out


class FastScorer:
    @torch.inference_mode()
    def __init__(self, drafter, head, embed, z: torch.Tensor, base: torch.Tensor, k: int, m: int, max_nodes: int,
                 graph_holder: dict | None = None):
        """`head`: the drafter's Float32Head; every table is fp32, like the reference builder's math.
        `graph_holder`: a dict kept by the caller across rounds; on CUDA it holds the StepGraph."""
        gru = head.gru
        self.prefix, self.k = drafter.spec.pure_draft_prefix_len, k
        z = z.float()
        dev, dt = z.device, torch.float32
        depths = base.shape[0]
        m = min(m, base.shape[-1])
        # per-round tables
        self.cand = torch.topk(base, m, dim=-1).indices  # [D, M]
        self.depth_ids = torch.arange(depths, device=dev)
        self.base_c = torch.gather(base, 1, self.cand)  # [D, M] float32
        self.z_proj = z @ head.w_z.t()  # [D, E]
        self.w1_state = head.w_s  # [E, G]
        self.w2_c = head.w2[self.cand]  # [D, M, E] fp32
        self.w_hh_t, self.w_ih = head.w_hh_t, gru.weight_ih_l0  # W_hh^T [G, 3G], W_ih [3G, H]
        self.gi_cand = embed(self.cand).float() @ self.w_ih.t()  # [D, M, 3G]: GRU input projection per candidate
        p = min(self.prefix, depths)
        prefix_vals, prefix_ids = torch.topk(torch.log_softmax(base[:p].float(), -1), k, dim=-1)  # [p, K]
        self.gi_prefix = embed(prefix_ids).float() @ self.w_ih.t()  # [p, K, 3G]
        self.prefix_host = (prefix_ids.tolist(), prefix_vals.tolist())  # one copy per round
        self.embed = embed
        self.states = torch.zeros(max_nodes + 1, gru.hidden_size, device=dev, dtype=dt)
        # node -> (its children's tokens, [K, 3G] GRU input projections of those children)
        self.children: dict[int, tuple[list[int], torch.Tensor]] = {}
        self.graph = None
        if graph_holder is not None and dev.type == "cuda":
            tables = (self.z_proj, self.base_c, self.w2_c)
            graph = graph_holder.get("step")
            if graph is None or not graph.fits(*tables):
                graph = graph_holder["step"] = StepGraph(*tables, self.w1_state, self.w_hh_t, k)
            graph.load(*tables)
            self.graph = graph

    @torch.inference_mode()
    def __call__(self, node: int, parent: int, token: int, depth: int) -> tuple[list[int], list[float]]:
        if parent < 0:
            gi = self.embed(torch.tensor([token], device=self.states.device)).float()[0] @ self.w_ih.t()
            h = torch.zeros_like(self.states[0])
        else:
            tokens, rows = self.children[parent]
            gi, h = rows[tokens.index(token)], self.states[parent]
        if depth < self.prefix:
            # uncorrected depth: the state is still needed for the grandchildren
            self.states[node] = gru_cell(gi, h, self.w_hh_t)
            ids, vals = self.prefix_host
            self.children[node] = (ids[depth], self.gi_prefix[depth])
            return ids[depth], vals[depth]
        depth_index = self.depth_ids[depth:depth + 1]  # a view: no host->device copy per node
        if self.graph is not None:
            state, values, local = self.graph(gi, h, depth_index)
        else:
            state, values, local = expand_step(gi, h, depth_index, self.z_proj, self.base_c, self.w2_c,
                                               self.w1_state, self.w_hh_t, self.k)
        self.states[node] = state
        packed = torch.stack([values.double(), self.cand[depth].index_select(0, local).double()]).tolist()  # one sync
        tokens = [int(t) for t in packed[1]]
        self.children[node] = (tokens, self.gi_cand[depth].index_select(0, local))
        return tokens, packed[0]
