"""The best-first tree of marginal scoring (DDTree, CaDDTree, DominoTree scoring=marginal), built depth by
depth in a few array operations instead of one heap operation per node.

With path-independent children (row d of the drafter's logits scores every depth-(d+1) token, the same
list under every parent), a path's score is a sum of per-depth log-probs, each <= 0, so the `budget` best
paths are prefix-closed and best-first by a heap is the same as "the `budget` best paths of any depth".
That set is found depth by depth:
- a depth-d path in the best `budget` extends a depth-(d-1) path in the best `budget` of its depth, with
  a token among the best `budget` of depth d (a better parent, or a better token, gives a better path);
- parent rank i and token rank j are only worth pairing if (i + 1)(j + 1) <= budget (every pair at or
  above both ranks is at least as good), so a depth looks at about budget x ln(budget) pairs, not budget^2;
- once `budget` shallower paths are known, a deeper one must beat the budget-th of them.
Ties are broken as a stable sort over (depth, parent rank, token rank), which puts a parent before a child
of equal score; the heap breaks them by push order, so on exact ties the two may pick different (equally
scored) nodes. CaDDTree's cost-aware stop applies to the best-first order as a whole
(`CostAwareStop.admitted`), the same rule the heap applies node by node.

Only the first ranks of each depth are read to the host (one copy); a tree that uses the last rank read
at some depth could need the next one, so it reads twice as many and builds again (rare after the first
round: `first_read_after`). Small trees (DDTree's default 16 nodes) are cheaper node by node: they go to
the shared heap (`draft_tree.build_best_first`), which gives the same trees.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from decoding.drafting.draft_tree import FIRST_READ, BuiltTree, build_best_first, first_read_after, marginal_expand
from decoding.engine.tree import TokenTree

# up to this many nodes a heap is cheaper (a few microseconds per node) than the depth-by-depth build (tens
# of microseconds per depth, whatever the size): `bench_marginal_reads.py --small` times both
HEAP_NODES = 64
FIRST_NODES = 32  # paths built first by a cost-aware tree with no last round to go by


class MarginalTrees:
    """A method's marginal trees, round after round: each round first reads twice the ranks, and (with a
    stop rule) first builds twice the paths, that the last round's tree needed. Where a round starts
    changes its cost, not its tree (ties aside: the heap and the depth-by-depth build may keep different
    nodes of equal score). `reset` at every prompt, so a prompt's trees never depend on the prompt before."""

    def __init__(self, k: int, budget: int):
        self.k, self.budget = k, budget
        self.reset()

    def reset(self) -> None:
        self.ranks = self.nodes = 0

    def build(self, root: int, logits: torch.Tensor, admit=None) -> BuiltTree:
        built = build_marginal_tree(root, logits, self.k, self.budget, admit, first_read=first_read_after(self.ranks),
                                    first_nodes=max(FIRST_NODES, 2 * self.nodes))
        self.ranks, self.nodes = built.ranks_read, built.tree.num_draft_nodes()
        return built


def build_marginal_tree(root: int, logits: torch.Tensor, k: int, budget: int, admit=None,
                        first_read: int = FIRST_READ, first_nodes: int = FIRST_NODES) -> BuiltTree:
    """The best `budget` paths (each depth's tokens among its top `k`) of `logits` [D, V] (row d: depth
    d + 1) as a tree in best-first order; `admit` (a `CostAwareStop`) may keep only a prefix of it. The
    first `first_read` ranks of each depth are read first. A tree expected to be small (`budget`, or
    with `admit` `first_nodes`, at most HEAP_NODES) is built by the heap; a larger one depth by depth,
    the best `first_nodes` paths first and twice as many while the rule admits them all (the best n
    paths are the first n of the best `budget`, so the prefix it keeps is the same)."""
    size = budget if admit is None else min(budget, max(first_nodes, 1))
    if size <= HEAP_NODES or not len(logits):
        return build_best_first(root, marginal_expand(logits, k, first_read), budget, len(logits), admit)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    width = min(k, logits.shape[-1])
    read = min(width, max(first_read, 1), size)
    while True:
        values, ids = torch.topk(logprobs, read, dim=-1)
        # one device->host copy; ids are exact in float32 (vocabularies are far below 2**24)
        host = torch.stack([values, ids.to(values.dtype)]).numpy(force=True)
        paths = _best_paths(host[0].astype(np.float64), size)
        order, stopped = paths.order, False
        if admit is not None:
            kept = admit.admitted(paths.scores[order])
            stopped, order = kept < len(order), order[:kept]
        used = paths.token_rank[order]
        if len(order) and used.max() == read - 1 and read < min(width, size):
            read = min(width, size, 2 * read)  # a depth used its last rank read: the next could be in the tree
        elif admit is not None and not stopped and len(order) == size < budget:
            size = min(budget, 2 * size)  # the rule admitted every path built: build more
            read = min(width, max(read, first_read), size)
        else:
            break
    # as the heap's `ranks_read`: the deepest rank used plus one, plus one for the sibling after it
    ranks_read = min(width, int(used.max()) + 2) if len(order) else 1
    return _as_tree(root, paths, order, host[1], stopped, ranks_read)


@dataclass
class _Paths:
    """The candidate paths of every depth, depth-major: score, depth (0-based row), rank of the parent
    within the previous depth's candidates (-1: the root), rank of the token within its depth's read;
    where each depth starts; `order`: the best `budget` of them, best first."""
    scores: np.ndarray
    depth: np.ndarray
    parent_rank: np.ndarray
    token_rank: np.ndarray
    offsets: np.ndarray
    order: np.ndarray


@lru_cache(maxsize=64)
def _rank_pairs(budget: int, read: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (parent rank i, token rank j) with (i + 1)(j + 1) <= budget and j < read, i-major, and
    where each i's pairs start: the only pairs that can be among a depth's best `budget`."""
    per_row = np.minimum(budget // np.arange(1, budget + 1), read)
    parents = np.repeat(np.arange(budget), per_row)
    starts = np.concatenate([[0], np.cumsum(per_row)])
    tokens = np.arange(len(parents)) - np.repeat(starts[:-1], per_row)
    return parents, tokens, starts


def _best_paths(values: np.ndarray, budget: int) -> _Paths:
    """`values` [D, r]: each depth's log-probs, best first (-inf: a masked token, never drafted). Worked
    on as costs (-log-prob >= 0), so that an ascending stable sort is best first."""
    costs = -values
    pair_parent, pair_token, pair_start = _rank_pairs(budget, costs.shape[1])
    beam = costs[0][np.isfinite(costs[0])][:budget]  # depth 1: the root's children
    found, parent_rank, token_rank = [beam], [np.full(len(beam), -1)], [np.arange(len(beam))]
    best = beam  # the `budget` lowest costs of the depths so far (any order)
    for row in costs[1:]:
        if not len(beam):
            break
        stop = pair_start[min(len(beam), budget)]
        parents, tokens = pair_parent[:stop], pair_token[:stop]
        candidate = beam[parents] + row[tokens]
        # a depth-d path that does not beat the budget-th shallower one is not in the tree (on a tie, the
        # shallower comes first); this also drops the masked tokens (infinite cost)
        ceiling = np.inf if len(best) < budget else best.max()
        alive = np.flatnonzero(candidate < ceiling)
        pick = alive[np.argsort(candidate[alive], kind="stable")[:budget]]
        beam = candidate[pick]
        found.append(beam)
        parent_rank.append(parents[pick])
        token_rank.append(tokens[pick])
        best = np.concatenate([best, beam])
        if len(best) > budget:
            best = np.partition(best, budget - 1)[:budget]
    sizes = [len(s) for s in found]
    all_costs = np.concatenate(found)
    order = np.argsort(all_costs, kind="stable")[:budget]
    depth = np.repeat(np.arange(len(sizes)), sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return _Paths(-all_costs, depth, np.concatenate(parent_rank), np.concatenate(token_rank), offsets, order)


def _as_tree(root: int, paths: _Paths, order: np.ndarray, ids: np.ndarray, stopped: bool,
             ranks_read: int) -> BuiltTree:
    """Nodes numbered in best-first order (a parent scores at least its child and comes first on a tie)."""
    node_of = np.zeros(len(paths.scores), dtype=np.int64)
    node_of[order] = np.arange(1, len(order) + 1)
    depth = paths.depth[order]
    # a depth-1 path's parent is the root: its (meaningless) ledger index is read and replaced by node 0
    parent_index = paths.offsets[np.maximum(depth - 1, 0)] + paths.parent_rank[order]
    parents = np.where(depth == 0, 0, node_of[parent_index])
    tokens = ids[depth, paths.token_rank[order]].astype(np.int64)
    tree = TokenTree([root, *tokens.tolist()], [-1, *parents.tolist()])
    return BuiltTree(tree, [0.0, *paths.scores[order].tolist()], stopped, ranks_read)
