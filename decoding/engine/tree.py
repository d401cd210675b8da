"""The one token-tree structure every drafting method builds and the verifier consumes.

Node 0 is the root: the last committed token, whose KV is not in the cache yet. Every other
node is a draft token whose parent appears before it (topological order), so one forward over
the nodes in order, with each node attending to the cached prefix plus its own ancestors, scores
every root-to-node path at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class TokenTree:
    tokens: list[int]
    parents: list[int]  # parents[0] == -1; parents[i] < i
    # Optional per-node draft distribution the node's token was *sampled* from (a probability
    # vector over the vocabulary). Siblings sampled from one distribution share the same tensor.
    # None means the node is deterministic (e.g. top-k, n-gram copy): acceptance treats it as a
    # one-hot proposal, which is what keeps deterministic trees lossless at T > 0.
    draft_probs: list[torch.Tensor | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.tokens or self.parents[0] != -1:
            raise ValueError("a token tree needs a root (node 0, parent -1)")
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        for i, p in enumerate(self.parents[1:], start=1):
            if not 0 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must precede children")
        if not self.draft_probs:
            self.draft_probs = [None] * len(self.tokens)
        self._children: list[list[int]] | None = None
        self._depths: list[int] | None = None

    @classmethod
    def root_only(cls, token: int) -> "TokenTree":
        return cls([token], [-1])

    @classmethod
    def chain(cls, root: int, drafts: list[int], draft_probs: list[torch.Tensor | None] | None = None) -> "TokenTree":
        probs = [None] + (list(draft_probs) if draft_probs is not None else [None] * len(drafts))
        return cls([root, *drafts], [-1, *range(len(drafts))], probs)

    @classmethod
    def from_sequences(cls, root: int, sequences: list[list[int]]) -> "TokenTree":
        """Merge token sequences that all continue `root` into one prefix-shared trie (first
        occurrence order is kept, so earlier sequences are tried first by sampling acceptance)."""
        tokens, parents = [root], [-1]
        index: dict[tuple[int, int], int] = {}
        for seq in sequences:
            node = 0
            for tok in seq:
                key = (node, tok)
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                node = index[key]
        return cls(tokens, parents)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def children(self) -> list[list[int]]:
        if self._children is None:
            kids: list[list[int]] = [[] for _ in self.tokens]
            for i, p in enumerate(self.parents[1:], start=1):
                kids[p].append(i)
            self._children = kids
        return self._children

    @property
    def depths(self) -> list[int]:
        if self._depths is None:
            d = [0] * len(self.tokens)
            for i, p in enumerate(self.parents[1:], start=1):
                d[i] = d[p] + 1
            self._depths = d
        return self._depths

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        path = [node]
        while self.parents[path[-1]] != -1:
            path.append(self.parents[path[-1]])
        return path[::-1]

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def ancestor_array(self) -> np.ndarray:
        """Bool [n, n] (numpy: built on the host without a torch op per row): row i is True at i and
        at every ancestor of i. A large shallow tree (CaDDTree's, up to 1024 nodes) by levels, the rest
        row by row: `bench_marginal_reads.py --small` times both."""
        n = len(self.tokens)
        if n > 64 and 16 * max(self.depths) <= n:
            return ancestors_by_levels(self.parents)
        return ancestors_by_rows(self.parents)

    def ancestor_mask(self) -> torch.Tensor:
        return torch.from_numpy(self.ancestor_array())

    def num_draft_nodes(self) -> int:
        return len(self.tokens) - 1


def ancestors_by_rows(parents: list[int]) -> np.ndarray:
    """A numpy call per node: a row is its parent's row plus itself."""
    n = len(parents)
    mask = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def ancestors_by_levels(parents: list[int]) -> np.ndarray:
    """A few numpy calls per level of depth: every node climbs one parent per pass, marking the node it
    reaches (the root is its own parent here, so a node that got there stays); work ~ depth x n."""
    n = len(parents)
    mask = np.zeros((n, n), dtype=bool)
    rows = np.arange(n)
    up = np.array(parents)  # a copy: the caller's parents are not changed
    up[0] = 0
    reached = rows
    while True:
        mask[rows, reached] = True
        if not reached.any():
            return mask
        reached = up[reached]
