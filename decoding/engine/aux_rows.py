"""Unverified rows that ride along the verification forward (`Proposal.aux_*`): Lookahead's 2D
Jacobi window, Self-Draft's perturbed branches, PTD's growing draft tree.

Each row has a token, a depth (position = cache length + depth, the root being depth 0) and the
earlier aux rows it attends to. Every aux row also sees the cached prefix and the root, and never
the verification tree's draft rows, which is the layout of Lookahead's mask ("the two branches do
not see each other"); the engine already keeps tree rows blind to aux rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from decoding.engine.loop import Proposal
from decoding.engine.tree import TokenTree


class AuxRows:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.depths: list[int] = []
        self.sees: list[list[int]] = []  # earlier aux rows each row attends to (itself implied)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, depth: int, sees: Sequence[int] = ()) -> int:
        self.tokens.append(int(token))
        self.depths.append(int(depth))
        self.sees.append(list(sees))
        return len(self.tokens) - 1

    def add_chain(self, tokens: Sequence[int], first_depth: int, sees: Sequence[int] = ()) -> list[int]:
        """A causal run of rows at consecutive depths; each sees `sees` and the run before it."""
        rows: list[int] = []
        for k, tok in enumerate(tokens):
            rows.append(self.add(tok, first_depth + k, [*sees, *rows]))
        return rows

    def visible(self, n_tree: int) -> np.ndarray:
        """[n_aux, n_tree + n_aux] bool, the `aux_visible` of a Proposal (a host array: the engine
        assembles the block's visibility on the host and copies it to the device once)."""
        n = len(self.tokens)
        mask = np.zeros((n, n_tree + n), dtype=bool)
        if n:
            mask[:, 0] = True  # the root
            rows = [i for i, s in enumerate(self.sees) for _ in range(len(s) + 1)]
            cols = [n_tree + j for i, s in enumerate(self.sees) for j in (*s, i)]
            mask[rows, cols] = True
        return mask

    def proposal(self, tree: TokenTree, hidden_layers: tuple[int, ...] = ()) -> Proposal:
        if not self.tokens:
            return Proposal(tree, hidden_layers=hidden_layers)
        return Proposal(tree, list(self.tokens), list(self.depths), self.visible(len(tree)), hidden_layers)
