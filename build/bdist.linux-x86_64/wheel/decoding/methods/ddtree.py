"""DDTree (Ringel et al., liranringel/ddtree): one DFlash pass, then a best-first draft tree from the
per-position marginals instead of a single chain.

    lp[d]  = top-k log_softmax(logits[d]), k = min(budget, V)       # per depth
    heap   = [(lp[0][0], depth 1, rank 0, parent root)]
    until budget nodes: pop the best path; push its next sibling and its best child
    verify the tree in one target forward (tree mask, positions by depth)

Under the drafter's independence assumption, best-first by path probability maximises the
expected accepted length for the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from decoding.methods.block_draft import BlockDraftMethod
from decoding.drafting.draft_tree import build_best_first, marginal_expand
from decoding.engine.loop import DecodeState, Proposal
from pipeline.errors import check_range


@dataclass
class DDTreeConfig:
    _target_: str = "decoding.methods.ddtree.DDTree"
    name: str = "ddtree"
    drafter: Optional[str] = None  # local folder or HF hub id; null = the model's `drafters.dflash`
    budget: int = 16  # draft nodes per tree (root excluded); the paper sweeps 16-1024, DominoTree compares at 16

    def __post_init__(self) -> None:
        check_range("method.budget", self.budget, 1)


class DDTree(BlockDraftMethod):
    name = "ddtree"

    def propose(self, state: DecodeState) -> Proposal:
        logits = self.draft_pass(state).logits
        built = build_best_first(state.root, marginal_expand(logits, self.config.budget), self.config.budget,
                                 max_depth=len(logits))
        return Proposal(built.tree, hidden_layers=self.taps)


CONFIG = DDTreeConfig
