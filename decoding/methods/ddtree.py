"""DDTree (Ringel et al., liranringel/ddtree): one DFlash pass, then a best-first draft tree from the
per-position marginals instead of a single chain.

    lp[d]  = top-k log_softmax(logits[d]), k = min(budget, V)       # per depth
    tree   = the `budget` best paths by sum of lp: best-first, as a heap would pop them
             (decoding/drafting/marginal_tree.py: by a heap up to 64 nodes, the default 16 included,
             depth by depth above; the same trees)
    verify the tree in one target forward (tree mask, positions by depth)

Under the drafter's independence assumption, best-first by path probability maximises the
expected accepted length for the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from decoding.methods.block_draft import BlockDraftMethod
from decoding.drafting.marginal_tree import MarginalTrees
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

    def setup(self, target) -> None:
        super().setup(target)
        self.trees = MarginalTrees(self.config.budget, self.config.budget)

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        self.trees.reset()

    def propose(self, state: DecodeState) -> Proposal:
        built = self.trees.build(state.root, self.draft_pass(state).logits)
        return Proposal(built.tree, hidden_layers=self.taps)


CONFIG = DDTreeConfig
