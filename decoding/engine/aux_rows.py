"""Unverified rows that ride along the verification forward (`Proposal.aux_*`): Lookahead's 2D
Jacobi window, Self-Draft's perturbed branches, PTD's growing draft tree.

Each row has a token, a depth (position = cache length + depth, the root being depth 0) and the
earlier aux rows it attends to. Every aux row also sees the cached prefix and the root, and never
the verification tree's draft rows, which is the layout of Lookahead's mask ("the two branches do
not see each other"); the engine already keeps tree rows blind to aux rows.

Rows that keep one shape from step to step (Lookahead's window, Self-Draft's branches) are laid out
once per shape (`AuxRows.layout`, an `AuxLayout` without tokens) and filled with each step's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decoding.engine.loop import Proposal, Reads
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

    def layout(self) -> "AuxLayout":
        """The rows' depths and visibility, without their tokens."""
        n = len(self.tokens)
        sees = np.zeros((n, n), dtype=bool)
        rows = [i for i, s in enumerate(self.sees) for _ in range(len(s) + 1)]
        cols = [j for i, s in enumerate(self.sees) for j in (*s, i)]
        sees[rows, cols] = True
        sees.flags.writeable = False  # a layout is shared by every step of its shape (lru_cache)
        return AuxLayout(tuple(self.depths), sees)

    def visible(self, n_tree: int) -> np.ndarray:
        return self.layout().visible(n_tree)

    def proposal(self, tree: TokenTree, hidden_layers: tuple[int, ...] = (), reads: Reads | None = None) -> Proposal:
        """`reads`: Proposal.reads (what the method needs from the forward's rows on the host)."""
        return self.layout().proposal(tree, self.tokens, hidden_layers, reads)


@dataclass(frozen=True, eq=False)
class AuxLayout:
    depths: tuple[int, ...]
    sees: np.ndarray  # [n_aux, n_aux] bool: the aux rows each row attends to, itself included

    def visible(self, n_tree: int) -> np.ndarray:
        """[n_aux, n_tree + n_aux] bool, the `aux_visible` of a Proposal (a host array: the engine
        assembles the block's visibility on the host and copies it to the device once)."""
        n = len(self.depths)
        mask = np.zeros((n, n_tree + n), dtype=bool)
        if n:
            mask[:, 0] = True  # the root
            mask[:, n_tree:] = self.sees
        return mask

    def proposal(self, tree: TokenTree, tokens: Sequence[int], hidden_layers: tuple[int, ...] = (),
                 reads: Reads | None = None) -> Proposal:
        """This layout's rows with `tokens` (one per row, in row order) after the verification tree."""
        if len(tokens) != len(self.depths):
            raise ValueError(f"{len(tokens)} tokens for an aux layout of {len(self.depths)} rows")
        if not tokens:
            return Proposal(tree, hidden_layers=hidden_layers, reads=reads)
        return Proposal(tree, [int(t) for t in tokens], list(self.depths), self.visible(len(tree)), hidden_layers,
                        reads)
