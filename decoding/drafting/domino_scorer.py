"""DominoTree's conditional children scorer (slin-zhq/Domino-Tree `make_conditional_children_fn`),
as an `expand` for `decoding.drafting.draft_tree.build_best_first`.

A node's GRU state has read the target embeddings of its own root path; its children at depth
d + 1 are scored with the Domino correction given that state:
    d < pure_draft_prefix_len : top-K of log_softmax(base[d])                (uncorrected)
    otherwise                 : C = top-M(base[d]);  s = base[d][C] + W2[C] . SiLU(W1 [z_d; h_node])
                                top-K of log_softmax(s) over C
Backbone hidden states z and base logits come from the one drafting pass and are shared.

Two implementations, which must build identical trees:
- `ReferenceScorer`: the straightforward per-node computation (the GRU cell, embed_proj's modules),
  an `expand` for the best-first heap, node by node, as the reference repository builds it;
- `LevelBuilder` (`builder=fast`): the same tree built depth by depth, every node of a depth in one
  batched step on the model's device, one host read per depth. On CUDA the whole tree is one CUDA-graph
  replay and one host read (decoding/engine/cuda_graph.py). Until 2026-12-05 each depth was one replay, run
  on an H200 on 2026-12-04; the whole-tree graph has not run on a GPU. The reference's own GPU builder
  replays a graph and reads the host once per node (16 per tree).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from decoding.drafting.domino_head import correction, gru_cell
from decoding.engine.cuda_graph import GraphReplayer
from decoding.engine.transfer import to_device, to_host
from decoding.engine.tree import TokenTree


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


NEG_INF = float("-inf")


def level_step(h, score, best, z_proj, base_row, w2, table, w_s_t, w_hh_t, m: int, k: int):
    """One depth of the level builder, for W lanes of parents (dead lanes score -inf): the depth's M
    candidates (top-M of its base logits, their W2 rows), the lanes' corrected children (top-K over
    them), the running best-W scores of every node found so far, and the next depth's lanes: the best W
    children whose score reaches that running W-th best (no node below it can be among the tree's W
    best), with their GRU states. The depth's tables are made here, for the depths the tree reaches
    only (a [D, V] top-M for every depth of the block costs ~100 us per row at a 49k vocabulary on a
    CPU).
    -> (child scores [W*K] f64, child ids [W*K], lanes' source child [W], next scores [W] f64,
        next states [W, G], best [W] f64, number of live next lanes)"""
    base_c, cand = torch.topk(base_row, m)  # [M]
    return corrected_level(h, score, best, z_proj, base_c, cand, w2, table, w_s_t, w_hh_t, k)


def corrected_level(h, score, best, z_proj, base_c, cand, w2, table, w_s_t, w_hh_t, k: int):
    """`level_step` given the depth's candidates `cand` [M] and their base logits `base_c` [M]."""
    mid = torch.nn.functional.silu(torch.addmm(z_proj, h, w_s_t))  # [W, E]
    # F.embedding gathers rows: the same numbers as w2[cand], several times cheaper on a CPU
    logp = torch.log_softmax(torch.addmm(base_c, mid, F.embedding(cand, w2).t()), -1)  # [W, M]
    values, local = torch.topk(logp, k, dim=-1)  # [W, K]
    return select_lanes(h, score, best, values, local, cand, table, w_hh_t, h.shape[0])


def uncorrected_level(h, score, best, prefix_vals, prefix_ids, table, w_hh_t):
    """A depth of the uncorrected prefix: every lane has the same children, the top-K of the depth's base
    log-probabilities (`prefix_vals`, `prefix_ids` [K])."""
    lanes = h.shape[0]
    values = prefix_vals.expand(lanes, -1)
    local = torch.arange(values.shape[-1], device=h.device).expand(lanes, -1)
    return select_lanes(h, score, best, values, local, prefix_ids, table, w_hh_t, lanes)


def prefix_children(base, prefix: int, k: int):
    """The children of every uncorrected depth: the top-k of its base log-probabilities -> (values, ids)
    [min(prefix, D), k]."""
    return torch.topk(torch.log_softmax(base[:min(prefix, len(base))].float(), -1), k, dim=-1)


def first_lanes(root, table, w_hh_t, lanes: int):
    """The W lanes before depth 1: the root's GRU state in lane 0 (score 0), dead lanes (-inf) after it.
    `root`: the root's id, a [1] tensor on the device. -> (h [W, G], score [W] f64, best [W] f64)"""
    root_gi = F.embedding(root, table)  # [1, 3G]
    h = gru_cell(root_gi, root_gi.new_zeros(1, w_hh_t.shape[0]), w_hh_t)
    h = torch.cat([h, h.new_zeros(lanes - 1, h.shape[1])])
    score = torch.full((lanes,), NEG_INF, dtype=torch.float64, device=h.device)
    score[:1].fill_(0.0)  # not score[0] = 0.0: on CUDA that copies a CPU scalar (a sync; fails in graph capture)
    return h, score, torch.full_like(score, NEG_INF)


def whole_tree(root, z, base, w_z, w2, table, w_s_t, w_hh_t, m: int, k: int, k_prefix: int, prefix: int, lanes: int):
    """Every depth of the block with no early stop, so no host read until the end: on CUDA the whole build is
    one graph replay (`LevelBuilder` with graphs). Depths past the one where the build would stop have only
    dead lanes, whose children score -inf, so the best nodes found are the early-stopping build's (ties at the
    cut-off aside). The top-M of every corrected depth is one batched top-k (cheap on a GPU; on a CPU the
    eager build takes it per depth reached instead).
    -> (the best 2W nodes' flat indices, scores (f64) and ids, every depth's lane sources), as `build` reads them"""
    p = min(prefix, len(base))
    z_proj = z.float() @ w_z.t()  # [D, E]
    prefix_vals, prefix_ids = prefix_children(base, p, k_prefix)
    base_c, cand = torch.topk(base[p:], m, dim=-1)  # [D - p, M]
    h, score, best = first_lanes(root, table, w_hh_t, lanes)
    children, ids, sources = [], [], []
    for d in range(len(base)):
        if d < p:
            level = uncorrected_level(h, score, best, prefix_vals[d], prefix_ids[d], table, w_hh_t)
        else:
            level = corrected_level(h, score, best, z_proj[d], base_c[d - p], cand[d - p], w2, table, w_s_t, w_hh_t, k)
        child, child_ids, src, score, h, best, _ = level
        children.append(child)
        ids.append(child_ids)
        sources.append(src)
    scores = torch.cat(children)
    top = torch.topk(scores, min(2 * lanes, len(scores)))
    return top.indices, top.values, torch.cat(ids).index_select(0, top.indices), torch.cat(sources)


def select_lanes(h, score, best, values, local, cand, table, w_hh_t, lanes: int):
    k = values.shape[-1]
    child = (score[:, None] + values.double()).reshape(-1)  # cumulative log-probs, float64 as the heap's sums
    child_ids = cand.index_select(0, local.reshape(-1))
    best = torch.topk(torch.cat([best, child]), lanes).values
    # sorted best first; which of exactly tied children are kept is topk's choice (no index order on a CPU or a
    # GPU), so at ties the tree may keep other nodes of the same scores than the reference heap (tested)
    top = torch.topk(child, lanes)
    keep = top.values >= best[-1:].clamp(min=-1e300)  # a dead lane (-inf) never reaches a finite threshold
    # the next lanes' GRU inputs: rows of the input table (W_ih . embed of every token)
    next_h = gru_cell(F.embedding(child_ids.index_select(0, top.indices), table),
                      h.index_select(0, top.indices // k), w_hh_t)
    return child, child_ids, top.indices, torch.where(keep, top.values, NEG_INF), next_h, best, keep.sum()


class LevelBuilder:
    """DominoTree's conditional tree built depth by depth instead of node by node: the same tree as
    `build_best_first` with `ReferenceScorer` (the W = budget nodes of highest cumulative corrected
    log-probability; ties aside), in a few batched operations per depth instead of per node.

    Why it is the same tree: a child's score is its parent's plus a log-probability <= 0, so the best
    W nodes form a tree, and each depth holds at most W of them; the W-th best score among nodes
    found so far never exceeds the final W-th best, so children below it can be dropped. Depth d
    keeps the best W children of depth d - 1 that reach it (a node's children are its top-K), and
    the build stops at the first depth where none does. Per depth one host read (the live lane
    count); the tree itself is read once at the end. Per round, the z-part of W1 for every depth (one
    matmul); per depth reached, its top-M candidates and their W2 rows (`level_step`); the GRU input of a
    chosen child is a row of the input table. All on the model's device, all head math in fp32. On
    CUDA the whole build is one graph replay instead (`whole_tree`, `decoding.engine.cuda_graph`): every
    depth of the block, no early stop, so no host read until the tree's."""

    @torch.inference_mode()
    def __init__(self, drafter, head, embed, z: torch.Tensor, base: torch.Tensor, k: int, m: int,
                 graphs: GraphReplayer | None = None):
        """`head`: the drafter's Float32Head. `graphs`: the caller's GraphReplayer, kept across rounds: with it
        (on CUDA) the whole build is one graph replay (`whole_tree`); None: depth by depth, eagerly, stopping at
        the first depth with no live lane."""
        self.prefix = drafter.spec.pure_draft_prefix_len
        vocab = base.shape[-1]
        self.m = min(m, vocab)
        self.k = min(k, self.m)
        self.table, self.w_hh_t = head.input_table(embed), head.w_hh_t  # [V, 3G]: every token's GRU input
        # the head's own tensors every round (a CUDA graph reads them in place)
        self.weights = {"w2": head.w2, "table": self.table, "w_s_t": head.w_s_t, "w_hh_t": self.w_hh_t}
        self.head, self.z, self.base, self.k_prefix = head, z, base, min(k, vocab)
        self.graphs = graphs if graphs is not None and graphs.enabled else None  # off the GPU: a disabled replayer
        if self.graphs is None:
            self.z_rows = (z.float() @ head.w_z.t()).unbind(0)  # [E] per depth: views made once, not per depth
            self.base_rows = base.unbind(0)
            self.prefix_vals, self.prefix_ids = prefix_children(base, self.prefix, self.k_prefix)

    def _depth(self, d: int, h, score, best):
        if d < self.prefix:
            return uncorrected_level(h, score, best, self.prefix_vals[d], self.prefix_ids[d], self.table, self.w_hh_t)
        return level_step(h, score, best, self.z_rows[d], self.base_rows[d], **self.weights, m=self.m, k=self.k)

    @torch.inference_mode()
    def build(self, root: int, budget: int, max_depth: int, admit=None):
        """The tree of at most `budget` nodes below `root` (children at most `max_depth` deep), in the
        order `build_best_first` pops them; `admit(n, score)` may stop it early, as there."""
        from decoding.drafting.draft_tree import BuiltTree

        dev, lanes = self.table.device, budget
        root_id = to_device([root], dev)
        max_depth = min(max_depth, len(self.base))  # a block's rows are its depths
        if self.graphs is not None and max_depth > 0:
            found = self.graphs("tree", whole_tree,
                                {"root": root_id, "z": self.z[:max_depth], "base": self.base[:max_depth]},
                                {"w_z": self.head.w_z, **self.weights, "m": self.m, "k": self.k,
                                 "k_prefix": self.k_prefix, "prefix": self.prefix, "lanes": lanes})
            widths = [self.k_prefix] * min(self.prefix, max_depth) + [self.k] * max(0, max_depth - self.prefix)
            return self._assemble(root, widths, lanes, *to_host(*found), budget, admit)
        h, score, best = first_lanes(root_id, self.table, self.w_hh_t, lanes)
        children, ids, sources = [], [], []
        for d in range(max_depth):
            child, child_ids, src, score, h, best, live = self._depth(d, h, score, best)
            children.append(child)
            ids.append(child_ids)
            sources.append(src)
            if d + 1 == max_depth or int(live) == 0:  # the one host read per depth
                break
        if not children:
            return BuiltTree(TokenTree.root_only(root), [0.0])
        # only the best W nodes found can be in the tree (twice as many read: room for an exact tie that cuts a
        # parent off); with the lanes' sources, one host read
        scores = torch.cat(children)
        top = torch.topk(scores, min(2 * lanes, len(scores)))
        found_at, found_scores, found_ids, lane_src = to_host(top.indices, top.values,
                                                              torch.cat(ids).index_select(0, top.indices),
                                                              torch.cat(sources))
        return self._assemble(root, [len(c) // lanes for c in children], lanes, found_at, found_scores, found_ids,
                              lane_src, budget, admit)

    @staticmethod
    def _assemble(root, widths, lanes, found_at, found_scores, found_ids, lane_src, budget, admit):
        """Nodes in best-first pop order (score, then depth, then lane and rank: a parent before its
        children, siblings best first), each linked to its parent through the lane it was expanded in."""
        from decoding.drafting.draft_tree import BuiltTree

        offsets = [0]
        for k in widths:
            offsets.append(offsets[-1] + lanes * k)
        order = sorted(range(len(found_at)), key=lambda i: (-found_scores[i], found_at[i]))
        position = {}  # flat ledger index -> tree node
        tokens, parents, scores = [root], [-1], [0.0]
        stopped = False
        for i in order:
            if len(tokens) - 1 == budget:
                break
            flat = found_at[i]
            if found_scores[i] == NEG_INF:
                break
            d = next(j for j in range(len(widths)) if flat < offsets[j + 1])
            if d == 0:
                parent = 0
            else:  # the lane this node's parent was expanded in, and that lane's source at depth d - 1
                lane = (flat - offsets[d]) // widths[d]
                parent = position.get(offsets[d - 1] + lane_src[(d - 1) * lanes + lane])
                if parent is None:  # an exact tie cut the parent off: its child goes too
                    continue
            if admit is not None and not admit(len(tokens) - 1, found_scores[i]):
                stopped = True
                break
            position[flat] = len(tokens)
            tokens.append(found_ids[i])
            parents.append(parent)
            scores.append(found_scores[i])
        return BuiltTree(TokenTree(tokens, parents), scores, stopped)
