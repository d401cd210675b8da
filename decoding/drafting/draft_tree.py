"""The best-first draft-tree builder shared by DDTree, CaDDTree and DominoTree (for marginal trees
of more than 64 nodes, `decoding/drafting/marginal_tree.py` builds the same trees depth by depth).

One heap keyed by cumulative log-probability. A node's candidate children come from `expand`,
called once when the node enters the tree, as token ids with log-probabilities sorted best
first; only the best child is pushed then, and popping a node pushes its next sibling (lazy k-best
enumeration: the pop order equals pushing every child at once, with at most two pushes per pop).
Which scorer fills `expand` is the whole difference between the methods:
- marginal (DDTree, DominoTree scoring=marginal): the per-depth top-k of the drafter's marginals,
  the same list for every node of a depth;
- conditional (DominoTree): the Domino correction recomputed along the node's own root path.
`admit(n, score)` may stop the build before the budget (CaDDTree's cost-aware rule).
Trees are deterministic (top-k), so `draft_probs` stays None and the engine's acceptance keeps
them lossless at every temperature.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from decoding.engine.transfer import to_host
from decoding.engine.tree import TokenTree

# expand(node, parent, token, depth) -> (child tokens, child log-probs), best first; called once per
# node when it enters the tree (root: node 0, parent -1), so a path-dependent scorer can keep
# per-node state
Expand = Callable[[int, int, int, int], tuple[list[int], list[float]]]


@dataclass
class BuiltTree:
    tree: TokenTree
    scores: list[float] = field(default_factory=list)  # cumulative log-prob per node (root 0.0)
    stopped_early: bool = False  # `admit` refused a node before the budget ran out
    ranks_read: int = 0  # the deepest rank of any child list the build looked at, plus one


def build_best_first(root: int, expand: Expand, budget: int, max_depth: int,
                     admit: Optional[Callable[[int, float], bool]] = None) -> BuiltTree:
    tokens, parents, depths, scores = [root], [-1], [0], [0.0]
    candidates: list[tuple[list[int], list[float]]] = []
    heap: list[tuple[float, int, int, int]] = []  # (-score, push order, parent, rank)
    pushes = 0
    reach = 1  # every opened node's best child is read

    def open_node(index: int) -> None:
        nonlocal pushes
        kids = expand(index, parents[index], tokens[index], depths[index]) if depths[index] < max_depth else ([], [])
        candidates.append(kids)
        if kids[0] and kids[1][0] > NEG_INF:  # a -inf child (a masked token) is never drafted, nor its siblings
            heapq.heappush(heap, (-(scores[index] + kids[1][0]), pushes, index, 0))
            pushes += 1

    open_node(0)
    stopped = False
    while heap and len(tokens) - 1 < budget:
        neg, _, parent, rank = heap[0]
        if admit is not None and not admit(len(tokens) - 1, -neg):
            stopped = True
            break
        heapq.heappop(heap)
        kid_tokens, kid_logprobs = candidates[parent]
        tokens.append(kid_tokens[rank])
        parents.append(parent)
        depths.append(depths[parent] + 1)
        scores.append(-neg)
        if rank + 1 < len(kid_tokens):
            reach = max(reach, rank + 2)
            if kid_logprobs[rank + 1] > NEG_INF:
                heapq.heappush(heap, (-(scores[parent] + kid_logprobs[rank + 1]), pushes, parent, rank + 1))
                pushes += 1
        open_node(len(tokens) - 1)
    return BuiltTree(TokenTree(tokens, parents), scores, stopped, reach)


NEG_INF = float("-inf")
FIRST_READ = 32  # children per depth read at first; a tree that needs more reads more (rare)


def first_read_after(ranks_read: int) -> int:
    """Ranks per depth to read first for a tree like the last one (`BuiltTree.ranks_read`): twice what it
    looked at. A tree looks at far fewer ranks than it has nodes (a 1024-node tree on a 152k vocabulary:
    17-84 in bench_marginal_reads.py unless the distributions are flat), and each rank read is host work."""
    return max(FIRST_READ, 2 * ranks_read)


class _Ranked:
    """The best-first children of one depth as a sequence of length `width`, read from the device
    in growing chunks: a large cap (CaDDTree's 1024) costs the host only the ranks a tree reaches."""

    def __init__(self, rows: "MarginalRows", depth: int, values: bool):
        self.rows, self.depth, self.values = rows, depth, values

    def __len__(self) -> int:
        return self.rows.width

    def __getitem__(self, rank: int):
        ids, vals = self.rows.ranked(self.depth, rank)
        return (vals if self.values else ids)[rank]


class MarginalRows:
    def __init__(self, logits: torch.Tensor, k: int, first_read: int = FIRST_READ):
        self.logprobs = torch.log_softmax(logits.float(), dim=-1)
        self.width = min(k, logits.shape[-1])
        self.read = min(self.width, max(first_read, 1))
        values, ids = torch.topk(self.logprobs, self.read, dim=-1)
        flat_values, flat_ids = to_host(values, ids)  # one device->host copy for the whole tree
        r = self.read
        self.host = [(flat_ids[d * r:(d + 1) * r], flat_values[d * r:(d + 1) * r]) for d in range(len(logits))]

    def ranked(self, depth: int, rank: int) -> tuple[list[int], list[float]]:
        ids, values = self.host[depth]
        if rank >= len(ids):  # this depth needs more children than read so far: read twice as many
            more = min(self.width, max(2 * len(ids), rank + 1))
            top = torch.topk(self.logprobs[depth], more)
            new_values, new_ids = to_host(top.values, top.indices)
            # ranks already handed out keep their tokens (a larger top-k may order tied values differently)
            seen = set(ids)
            extra = [(t, v) for t, v in zip(new_ids, new_values) if t not in seen]
            self.host[depth] = (ids + [t for t, _ in extra], values + [v for _, v in extra])
        return self.host[depth]


def marginal_expand(logits: torch.Tensor, k: int, first_read: int = FIRST_READ) -> Expand:
    """Path-independent children: row d of `logits` [D, V] scores the tokens at depth d + 1, its top
    `k` best first. One device->host copy of the first `first_read` ranks of every depth (a tree of
    n nodes uses at most n ranks of any depth); more only if a tree reaches further down a list."""
    rows = MarginalRows(logits, k, first_read)
    if rows.read == rows.width:  # every rank already read: plain lists
        children = rows.host
    else:
        children = [(_Ranked(rows, d, False), _Ranked(rows, d, True)) for d in range(len(logits))]

    def expand(_node: int, _parent: int, _token: int, depth: int):
        return children[depth]

    return expand
