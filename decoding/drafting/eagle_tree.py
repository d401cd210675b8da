"""EAGLE-2's dynamic draft tree (Li et al. 2024, SafeAILab/EAGLE `cnets.py topK_genrate`) and the
chain mode, drafted by an EAGLE-3 model from its last cached row.

    depth 1: the top_k tokens of the last row's draft distribution, scored by their log-probs
    `depth` times: run the top_k frontier nodes (hidden = parent's h, token = the node's) in one pass,
        each sees the cached rows, its ancestors' scratch rows and itself; every frontier node's top_k
        children enter the pool with score = parent score + log-prob, and the best top_k of those
        top_k^2 children are the next frontier
    rerank: the best `total_tokens - 1` nodes of the pool by cumulative log-prob, in creation order

A node scores no higher than its parent and ties are broken by creation order (parents first), so the
kept nodes are closed under ancestry. Everything stays on the device until one host copy of the kept
nodes per step. The tree is deterministic (top-k of untempered log-probs, as EAGLE drafts at any
temperature), so the engine's acceptance keeps it lossless at every T.
"""

from __future__ import annotations

import torch

from decoding.drafting.eagle3_drafter import Eagle3Cache, Eagle3Drafter
from decoding.engine.argmax import row_argmax
from decoding.engine.transfer import to_host
from decoding.engine.tree import TokenTree


@torch.inference_mode()
def dynamic_tree(drafter: Eagle3Drafter, cache: Eagle3Cache, h_last: torch.Tensor, embed, root: int,
                 top_k: int, depth: int, total_tokens: int) -> tuple[TokenTree, int]:
    """The tree (root + at most total_tokens - 1 drafts) and the number of drafter passes it took."""
    device = h_last.device
    k = min(top_k, drafter.spec.draft_vocab_size)
    logp = torch.log_softmax(drafter.logits(h_last[None])[0], dim=-1)
    scores, ids = torch.topk(logp, k)
    tokens = drafter.to_target_ids(ids)
    pool_scores, pool_tokens, pool_parents = [scores], [tokens], [torch.full((k,), -1, device=device)]
    frontier = torch.arange(k, device=device)  # pool indices of the frontier nodes
    frontier_h = h_last.expand(k, -1)
    visible = torch.zeros(k, 0, dtype=torch.bool, device=device)  # frontier rows -> earlier scratch rows
    past_k, past_v = cache.keys, cache.values  # then the cache followed by the scratch rows of the levels so far
    eye = torch.eye(k, dtype=torch.bool, device=device)
    row_of_child = torch.arange(k, device=device).repeat_interleave(k)  # [k * k]: a child's frontier row
    cached = torch.ones(k, cache.length, dtype=torch.bool, device=device)
    # depth-1 nodes sit one past the last cached row; every level's positions made at once
    positions = torch.arange(cache.length, cache.length + depth, device=device)[:, None].expand(depth, k).unbind(0)
    passes, offset = 0, k  # offset: pool index of the level's first child (host arithmetic, no tensor reads)
    for level in range(depth):
        mask = torch.cat([cached, visible, eye], dim=1)
        h, past_k, past_v = drafter.step(embed(tokens), frontier_h, positions[level], past_k, past_v, mask)
        passes += 1
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
    keep = min(total_tokens - 1, k + passes * k * k)  # the pool's size, known on the host
    order = torch.sort(all_scores, descending=True, stable=True).indices[:keep].sort().values
    kept_tokens, kept_parents, kept = to_host(all_tokens.index_select(0, order), all_parents.index_select(0, order),
                                              order)
    node_of = {-1: 0, **{pool_index: node for node, pool_index in enumerate(kept, start=1)}}
    return TokenTree([root, *kept_tokens], [-1, *(node_of[p] for p in kept_parents)]), passes


@torch.inference_mode()
def chain(drafter: Eagle3Drafter, cache: Eagle3Cache, h_last: torch.Tensor, embed, root: int,
          length: int) -> tuple[TokenTree, int]:
    """`length` argmax drafts, each fed back with its own h (vLLM / SGLang chain mode)."""
    device = h_last.device
    picks = [drafter.to_target_ids(row_argmax(drafter.logits(h_last[None])[0]))]
    h = h_last[None]
    past_k, past_v = cache.keys, cache.values
    for i in range(length - 1):
        h, past_k, past_v = drafter.step(embed(picks[-1].view(1)), h,
                                         torch.full((1,), cache.length + i, device=device), past_k, past_v)
        picks.append(drafter.to_target_ids(row_argmax(drafter.logits(h)[0])))
    return TokenTree.chain(root, to_host(torch.stack(picks))[0]), length - 1
