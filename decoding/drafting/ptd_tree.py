"""Data structures of Progressive Tree Drafting (PTD, `decoding/methods/ptd.py`): the draft forest that
grows inside the target's forwards, and the per-root candidate pool its subtrees are merged into.

`DraftForest`: nodes in topological order (a parent precedes its children); a node with parent -1
hangs directly under the current root (depth 1). A node's draft is conditioned on the root and its
ancestors only (tree mask, position = depth). Per forward:
- `expand`: every leaf gets children from its own row, at most `width` per parent, highest
  probability first; a node budget caps the forest, served first-children-first, best path first;
- `slide`: the depth window. When a subtree is deeper than the threshold, its top node goes, its
  earliest-added child becomes the new top and the older sibling branches are pruned.

`TriePool`: root token -> trie of continuations with a recency stamp per node; `merge` is a
recursive union of subtrees that share a root token (idempotent), `evict` keeps at most `cap`
branches (leaves) per root, dropping the least recently refreshed first (a branch whose prefix was
refreshed later than its leaf loses only its stale tail).
"""

from __future__ import annotations

import heapq
from contextlib import contextmanager
from dataclasses import dataclass, field

from decoding.engine.tree import TokenTree


@dataclass
class DraftNode:
    token: int
    parent: int  # index in the forest, -1 = directly under the root
    birth: int  # step the node was added (earliest-added child = smallest birth, then order)
    logp: float = 0.0  # log-probability of the token under its parent's row (0 for seeds)
    children: list[int] = field(default_factory=list)


class DraftForest:
    def __init__(self) -> None:
        self.nodes: list[DraftNode] = []

    def __len__(self) -> int:
        return len(self.nodes)

    def tops(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.parent == -1]

    def leaves(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if not n.children]

    def add(self, token: int, parent: int, birth: int, logp: float = 0.0) -> int:
        self.nodes.append(DraftNode(int(token), parent, birth, logp))
        if parent >= 0:
            self.nodes[parent].children.append(len(self.nodes) - 1)
        return len(self.nodes) - 1

    def depths(self) -> list[int]:
        d = [0] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            d[i] = 1 if n.parent < 0 else d[n.parent] + 1
        return d

    def path_scores(self) -> list[float]:
        """Sum of log-probabilities from the subtree's top to each node."""
        s = [0.0] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            s[i] = n.logp if n.parent < 0 else s[n.parent] + n.logp
        return s

    def ancestors(self) -> list[list[int]]:
        anc: list[list[int]] = []
        for n in self.nodes:
            anc.append([] if n.parent < 0 else [*anc[n.parent], n.parent])
        return anc

    def edges(self) -> list[tuple[int, int]]:
        return [(self.nodes[n.parent].token, n.token) for n in self.nodes if n.parent >= 0]

    def expand(self, proposals: dict[int, list[tuple[int, float]]], width: int, budget: int, birth: int) -> int:
        """proposals: leaf -> [(token, logp)] best first. Adds at most `width` children per leaf while
        the forest has fewer than `budget` nodes: every leaf's first child before any second one,
        leaves with the most probable path first. Returns the number of nodes added."""
        scores = self.path_scores()
        ranked = sorted(((rank, -(scores[leaf] + logp), leaf, tok, logp)
                         for leaf, options in proposals.items()
                         for rank, (tok, logp) in enumerate(options[:width])))
        added = 0
        for _, _, leaf, tok, logp in ranked:
            if len(self.nodes) >= budget:
                break
            self.add(tok, leaf, birth, logp)
            added += 1
        return added

    def slide(self, max_depth: int) -> None:
        """Depth window: while a subtree is deeper than `max_depth`, replace its top by the top's
        earliest-added child (and that child's descendants); the top's other branches are pruned."""
        while True:
            depths = self.depths()
            top_of = self._top_of()
            deep = {top_of[i] for i, d in enumerate(depths) if d > max_depth}
            if not deep:
                return
            self.retire(deep)

    def retire(self, tops: set[int]) -> dict[int, int]:
        """Drop the given top nodes, keeping only each one's earliest-added child subtree. Returns the
        old -> new index of every kept node."""
        keep = [True] * len(self.nodes)
        promoted = set()
        for t in tops:
            keep[t] = False
            kids = sorted(self.nodes[t].children, key=lambda c: (self.nodes[c].birth, c))
            if kids:
                promoted.add(kids[0])
            for c in kids[1:]:
                keep[c] = False
        for i, n in enumerate(self.nodes):  # parents precede children: one pass drops whole branches
            if n.parent >= 0 and not keep[n.parent]:
                keep[i] = keep[i] and n.parent in tops and i in promoted
        return self._compact(keep, promoted)

    def drop(self, tops: set[int]) -> None:
        """Remove whole subtrees (their continuations already live in the pool)."""
        keep = [True] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            keep[i] = i not in tops and (n.parent < 0 or keep[n.parent])
        self._compact(keep, set())

    def _top_of(self) -> list[int]:
        top = [0] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            top[i] = i if n.parent < 0 else top[n.parent]
        return top

    def _compact(self, keep: list[bool], promoted: set[int]) -> dict[int, int]:
        remap: dict[int, int] = {}
        nodes: list[DraftNode] = []
        for i, n in enumerate(self.nodes):
            if not keep[i]:
                continue
            remap[i] = len(nodes)
            parent = -1 if i in promoted else remap[n.parent] if n.parent >= 0 else -1
            nodes.append(DraftNode(n.token, parent, n.birth, 0.0 if parent < 0 else n.logp))
        for i, n in enumerate(nodes):
            if n.parent >= 0:
                nodes[n.parent].children.append(i)
        self.nodes = nodes
        return remap

    def subtree(self, i: int) -> dict:
        """The continuations below node i as a nested {token: {...}} trie."""
        return {self.nodes[c].token: self.subtree(c) for c in self.nodes[i].children}


class TriePool:
    def __init__(self, cap: int):
        self.cap = cap  # branches (leaves) kept per root token
        self.roots: dict[int, dict] = {}  # token -> trie node {"kids": {tok: node}, "stamp": int}
        self.leaves: dict[int, int] = {}  # token -> branches under it, kept up to date by merges
        self.deferred: set[int] | None = None  # inside `batch()`: roots over the cap, evicted at its end

    @staticmethod
    def _node(stamp: int) -> dict:
        return {"kids": {}, "stamp": stamp}

    def merge(self, root: int, subtree: dict, stamp: int) -> None:
        """Union of `subtree` ({token: {...}}) into root's trie; every merged node is refreshed. The
        LRU eviction walks the trie only when the root holds more than `cap` branches."""
        if not subtree:
            return
        self._grown(root, self._merge(self._root(root, stamp), subtree, stamp, is_root=True))

    def merge_leaves(self, root: int, tokens: list[int], stamp: int) -> None:
        """`merge(root, {t: {} for t in tokens}, stamp)` without building the dict or recursing: the
        common case of one-token continuations (recycled verification rows)."""
        if not tokens:
            return
        kids, added = self._root(root, stamp)["kids"], 0
        for tok in tokens:
            child = kids.get(tok)
            if child is None:
                kids[tok] = {"kids": {}, "stamp": stamp}
                added += 1
            else:
                child["stamp"] = stamp
        self._grown(root, added)

    def _root(self, root: int, stamp: int) -> dict:
        dst = self.roots.get(root)
        if dst is None:
            dst = self.roots[root] = self._node(stamp)
        dst["stamp"] = stamp  # stamps never decrease (the step counter)
        return dst

    def _grown(self, root: int, added: int) -> None:
        self.leaves[root] = self.leaves.get(root, 0) + added
        if self.leaves[root] > self.cap:
            if self.deferred is None:
                self.evict(root)
            else:
                self.deferred.add(root)

    @contextmanager
    def batch(self):
        """Merges of one step: each root over the cap is evicted once, at the end, not after every
        merge. Every merge of a step carries the same stamp, so the branches kept are the same
        `cap` most recent ones (ties between equal stamps aside, broken by trie order)."""
        if self.deferred is not None:
            raise RuntimeError("TriePool.batch() does not nest")
        self.deferred = set()
        try:
            yield self
        finally:
            roots, self.deferred = self.deferred, None
            for root in roots:
                self.evict(root)

    def _merge(self, dst: dict, src: dict, stamp: int, is_root: bool = False) -> int:
        """Merge and return the change in the number of branches below `dst`."""
        kids = dst["kids"]
        was_leaf = not kids and not is_root  # a leaf is one branch; with children it is theirs
        added = 0
        for tok, below in src.items():
            child = kids.get(tok)
            if child is None:  # a fresh leaf (one branch), grown by whatever is below it
                child = kids[tok] = {"kids": {}, "stamp": stamp}
                if below:
                    added += 1 + self._merge(child, below, stamp)
                else:
                    added += 1
            else:
                child["stamp"] = stamp
                if below:
                    added += self._merge(child, below, stamp)
        return added - 1 if was_leaf and added else added

    def branches(self, root: int) -> list[tuple[int, list[int]]]:
        """(stamp, tokens) of every root-to-leaf branch, most recently refreshed first."""
        out: list[tuple[int, list[int]]] = []

        def walk(node: dict, prefix: list[int]) -> None:
            for tok, child in node["kids"].items():
                if child["kids"]:
                    walk(child, [*prefix, tok])
                else:
                    out.append((child["stamp"], [*prefix, tok]))

        if root in self.roots:
            walk(self.roots[root], [])
        out.sort(key=lambda b: -b[0])  # stable: ties keep trie (insertion) order
        return out

    def evict(self, root: int) -> None:
        """Down to `cap` branches, the stalest leaf first. A branch whose prefix was refreshed after its
        leaf (a merge or a recycled row confirmed the prefix again) loses only its stale tail: the nodes
        below the deepest ancestor refreshed after the leaf, which then competes as a branch of its own."""
        trie = self.roots[root]
        branches = self.branches(root)
        while len(branches) > self.cap:
            stamp, tokens = branches.pop()
            path = [trie]
            for tok in tokens[:-1]:
                path.append(path[-1]["kids"][tok])
            cut = max((i for i in range(1, len(path)) if path[i]["stamp"] > stamp), default=0)
            self._remove(path[cut], tokens[cut:])  # a removed tail takes its now-empty chain along
            if cut and not path[cut]["kids"]:  # the refreshed prefix is a leaf now: rank it again
                branches = self.branches(root)
        self.leaves[root] = len(branches)

    def _remove(self, node: dict, tokens: list[int]) -> None:
        child = node["kids"][tokens[0]]
        if len(tokens) > 1:
            self._remove(child, tokens[1:])
        if not child["kids"]:
            del node["kids"][tokens[0]]

    def as_nested(self, root: int) -> dict:
        def strip(node: dict) -> dict:
            return {tok: strip(child) for tok, child in node["kids"].items()}

        return strip(self.roots[root]) if root in self.roots else {}


def graft_nodes(pool: TriePool, root: int, budget: int, max_depth: int) -> tuple[list[int], list[int]]:
    """The candidate nodes for `root`, grown best-first by grafting pool subtrees: the children of a
    candidate path are the pool's continuations of its longest suffix found in the pool (the
    path's own root-keyed trie first, then shorter suffixes: subtrees that share a root token are
    joined, so the candidates go deeper than any single merged subtree). A child's cost is its
    rank among its siblings plus one per suffix token dropped; the `budget` cheapest paths win.
    Returns (tokens, parents) in the order chosen (cheapest first), a parent being the index of an
    earlier node or -1 for the root.

    Each candidate carries the trie nodes its suffixes reach (`alive`: (suffix start, node)), so a
    child's are its parent's advanced by one token: no suffix is walked again from its root."""
    def children(alive: list[tuple[int, dict]]) -> list[tuple[int, int]]:
        grown = [(start, node["kids"]) for start, node in alive if node["kids"]]
        if len(grown) == 1:  # one suffix continues (the common case): its ranks are the costs, in order
            start, kids = grown[0]
            ranked = sorted(kids, key=lambda tok: -kids[tok]["stamp"]) if len(kids) > 1 else kids
            return [(tok, rank + start) for rank, tok in enumerate(ranked)]
        out: dict[int, int] = {}
        for start, kids in grown:  # longest suffix first
            ranked = sorted(kids, key=lambda tok: -kids[tok]["stamp"])
            for rank, tok in enumerate(ranked):
                out.setdefault(tok, rank + start)
        return sorted(out.items(), key=lambda kv: kv[1])

    def advance(alive: list[tuple[int, dict]], tok: int, start: int) -> list[tuple[int, dict]]:
        moved = [(s, node["kids"][tok]) for s, node in alive if tok in node["kids"]]
        if tok in pool.roots:  # the one-token suffix: tok's own trie
            moved.append((start, pool.roots[tok]))
        return moved

    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    # Lazy k-best: only a path's cheapest unexplored child is in the heap, and popping a child pushes
    # its next sibling. Entries: (cost, the parent's pop order, rank, parent cost, the parent's alive
    # suffixes, the parent's children sorted by cost); the first three are the order in which pushing
    # every child at once would pop them, so the result is the same with fewer pushes. The parent's
    # pop order is its node index (-1: the root).
    heap: list[tuple] = []

    def push_first(kids, parent_cost: int, order: int, alive) -> None:
        if kids:
            heapq.heappush(heap, (parent_cost + kids[0][1], order, 0, parent_cost, alive, kids))

    start_alive = [(0, pool.roots[root])] if root in pool.roots else []
    push_first(children(start_alive), 0, -1, start_alive)
    while heap and len(tokens) < budget:
        cost, parent, rank, parent_cost, parent_alive, kids = heapq.heappop(heap)
        if rank + 1 < len(kids):
            heapq.heappush(heap, (parent_cost + kids[rank + 1][1], parent, rank + 1, parent_cost, parent_alive, kids))
        tok = kids[rank][0]
        depth = depths[parent] + 1 if parent >= 0 else 1
        tokens.append(tok)
        parents.append(parent)
        depths.append(depth)
        if depth < max_depth:
            alive = advance(parent_alive, tok, depth)
            push_first(children(alive), cost, len(tokens) - 1, alive)
    return tokens, parents


def graft_branches(pool: TriePool, root: int, budget: int, max_depth: int) -> list[list[int]]:
    """`graft_nodes`' candidates as root-to-leaf branches, cheapest leaf first."""
    tokens, parents = graft_nodes(pool, root, budget, max_depth)
    inner = set(parents)
    branches = []
    for i in range(len(tokens)):
        if i not in inner:  # a parent is always chosen before its children: the leaves are the unextended
            path, node = [], i
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            branches.append(path[::-1])
    return branches


def graft_tree(pool: TriePool, root: int, budget: int, max_depth: int) -> TokenTree:
    """The verification tree of `graft_nodes`' candidates: node for node the tree
    `candidate_tree(root, graft_branches(...), budget)` builds (its leaves' branches in order, each new
    node where its branch first reaches it), without the branches' token tuples."""
    tokens, parents = graft_nodes(pool, root, budget, max_depth)
    inner = set(parents)
    tree_tokens, tree_parents = [root], [-1]
    placed = [0] * len(tokens)  # candidate -> tree node (0: not placed yet)
    for leaf in range(len(tokens)):
        if leaf in inner:
            continue
        chain, node = [], leaf
        while node >= 0 and not placed[node]:
            chain.append(node)
            node = parents[node]
        above = placed[node] if node >= 0 else 0
        for node in reversed(chain):
            placed[node] = len(tree_tokens)
            tree_tokens.append(tokens[node])
            tree_parents.append(above)
            above = placed[node]
    return TokenTree(tree_tokens, tree_parents)
