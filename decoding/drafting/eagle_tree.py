"""EAGLE-2's dynamic draft tree (Li et al. 2024, SafeAILab/EAGLE `cnets.py topK_genrate`), drafted by an
EAGLE-3 model from its last cached row; the chain mode is the tree of width one (`top_k=1`: each draft the
argmax after its predecessors, fed its own h, as vLLM / SGLang draft a chain).

    depth 1: the top_k tokens of the last row's draft distribution, scored by their log-probs
    `depth` times: run the top_k frontier nodes (hidden = parent's h, token = the node's) in one pass,
        each sees the cached rows, its ancestors' scratch rows and itself; every frontier node's top_k
        children enter the pool with score = parent score + log-prob, and the best top_k of those
        top_k^2 children are the next frontier
    rerank: the best `total_tokens - 1` nodes of the pool by cumulative log-prob, in creation order

A node scores no higher than its parent and ties are broken by creation order (parents first), so the
kept nodes are closed under ancestry. Everything stays on the device until one host copy of the kept
nodes per step, at fixed shapes (the drafter's cache is a buffer of fixed capacity, its length a device
scalar), so on CUDA the whole expansion, its `depth` drafter passes included, replays from one CUDA graph
(`method.cuda_graph`, decoding/engine/cuda_graph.py), captured again only when the cache outgrows its
buffer. The tree is deterministic (top-k of untempered log-probs, as EAGLE drafts at any
temperature), so the engine's acceptance keeps it lossless at every T.
"""

from __future__ import annotations

import torch

from decoding.drafting.eagle3_drafter import Eagle3Cache, Eagle3Drafter
from decoding.engine.cuda_graph import GraphReplayer
from decoding.engine.transfer import to_host
from decoding.engine.tree import TokenTree


@torch.inference_mode()
def dynamic_tree(drafter: Eagle3Drafter, cache: Eagle3Cache, h_last: torch.Tensor, embed, root: int, top_k: int,
                 depth: int, total_tokens: int, graphs: GraphReplayer | None = None,
                 expand=None, admit=None) -> tuple[TokenTree, int]:
    """The tree (root + at most total_tokens - 1 drafts) and the number of drafter passes it took. `graphs`
    (enabled on CUDA): the expansion replays from one CUDA graph per step (`expand_tree`), else it runs eagerly,
    as `expand` (`compiled_expansion`) or `expand_tree`. `admit` (method.budget=cost_aware): given the kept nodes'
    scores best first, how many to keep (verify_cost.CostAwareStop); the best that many are kept, a set closed
    under ancestry as the rerank's is."""
    k = min(top_k, drafter.spec.draft_vocab_size)
    # scratch rows for the deepest expansion yet: a chain whose length changes step to step (chain_policy=optimal)
    # keeps its buffers, and with them its graphs, one per shape
    cache.reserve(0, scratch=max(cache.scratch, depth * k))
    if cache.take_moved() and graphs is not None:  # a graph on old buffers goes (a regrowth, not a recapture bug)
        graphs.forget()
    keep = min(total_tokens - 1, k + depth * k * k)  # the pool's size, known on the host
    inputs = {"h_last": h_last}
    constants = {"keys": cache.buffer_k, "values": cache.buffer_v, "length": cache.length_t, "drafter": drafter,
                 "embed": embed, "k": k, "depth": depth, "keep": keep, "scratch": cache.scratch}
    if graphs is not None and graphs.enabled:
        found = graphs(f"eagle3_tree_{k}x{depth}_{keep}", expand_tree, inputs, constants)  # one graph per shape
    else:
        found = (expand or expand_tree)(**inputs, **constants)
    # the graph's outputs, read before the next replay; the scores only where a stop reads them (the three id
    # tensors alone take to_host's int64 path, without a float64 round trip)
    kept_tokens, kept_parents, kept, *scores = to_host(*(found if admit is not None else found[:3]))
    if admit is not None:
        scores = scores[0]
        best_first = sorted(range(len(kept)), key=lambda i: (-scores[i], i))  # ties: parents first, as the rerank
        chosen = sorted(best_first[:admit([scores[i] for i in best_first])])
        kept_tokens, kept_parents, kept = ([values[i] for i in chosen] for values in (kept_tokens, kept_parents, kept))
    node_of = {-1: 0, **{pool_index: node for node, pool_index in enumerate(kept, start=1)}}
    return TokenTree([root, *kept_tokens], [-1, *(node_of[p] for p in kept_parents)]), depth


def expand_tree(h_last, keys, values, length, drafter: Eagle3Drafter, embed, k: int, depth: int,
                keep: int, scratch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree's tensors at fixed shapes, with no host read (so a CUDA graph can hold it): the kept nodes'
    target tokens, their parents' pool indices (-1: the root), their pool indices and their scores (cumulative
    draft log-probabilities), in creation order.
    `keys`/`values`: the cache's buffers, whose first `length` (a device scalar) rows are cached and whose last
    `scratch` (>= depth * k) rows are scratch; level l's scratch rows are written at rows scratch_at + l*k and
    attend to every row below them, the cached ones (the rows between `length` and `scratch_at` masked out) and
    their ancestors' scratch rows."""
    device = h_last.device
    scratch_at = keys.shape[1] - scratch  # the cache's capacity
    logp = torch.log_softmax(drafter.logits(h_last[None])[0], dim=-1)
    scores, ids = torch.topk(logp, k)
    tokens = drafter.to_target_ids(ids)
    pool_scores, pool_tokens, pool_parents = [scores], [tokens], [torch.full((k,), -1, device=device)]
    frontier = torch.arange(k, device=device)  # pool indices of the frontier nodes
    frontier_h = h_last.expand(k, -1)
    visible = torch.zeros(k, 0, dtype=torch.bool, device=device)  # frontier rows -> earlier scratch rows
    eye = torch.eye(k, dtype=torch.bool, device=device)
    row_of_child = torch.arange(k, device=device).repeat_interleave(k)  # [k * k]: a child's frontier row
    cached = (torch.arange(scratch_at, device=device) < length).expand(k, scratch_at)
    # depth-1 nodes sit one past the last cached row; every level's positions made at once
    positions = (length + torch.arange(depth, device=device))[:, None].expand(depth, k).unbind(0)
    offset = k  # pool index of the level's first child (host arithmetic, no tensor reads)
    for level in range(depth):
        mask = torch.cat([cached, visible, eye], dim=1)
        h, _, _ = drafter.step(embed(tokens), frontier_h, positions[level], keys, values, mask,
                               write_at=scratch_at + level * k)
        child_logp, child_ids = torch.topk(torch.log_softmax(drafter.logits(h), dim=-1), k)  # [k, k]
        child_scores = (scores[:, None] + child_logp).reshape(-1)
        pool_scores.append(child_scores)
        pool_tokens.append(drafter.to_target_ids(child_ids.reshape(-1)))
        pool_parents.append(frontier.index_select(0, row_of_child))
        if level == depth - 1:
            break
        scores, best = torch.topk(child_scores, k)
        parent_row = best // k
        frontier = offset + best
        offset += k * k
        tokens = pool_tokens[-1].index_select(0, best)
        frontier_h = h.index_select(0, parent_row)
        # a child sees what its parent saw, plus its parent's own scratch row (in the block just added)
        visible = torch.cat([visible.index_select(0, parent_row), eye.index_select(0, parent_row)], dim=1)
    all_scores, all_tokens, all_parents = torch.cat(pool_scores), torch.cat(pool_tokens), torch.cat(pool_parents)
    order = torch.sort(all_scores, descending=True, stable=True).indices[:keep].sort().values
    return (all_tokens.index_select(0, order), all_parents.index_select(0, order), order,
            all_scores.index_select(0, order))


def compiled_expansion(enabled: bool):
    """`expand_tree` torch.compile'd (`method.compile`; decoding/engine/compiled.py), for any buffer size (one
    compile, not one per growth of the cache), or None (eager)."""
    if not enabled:
        return None
    from decoding.engine.compiled import maybe_compiled

    return maybe_compiled(expand_tree, True, "method.compile", growing={"keys": 1, "values": 1})
