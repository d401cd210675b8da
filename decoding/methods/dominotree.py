"""DominoTree (Lin et al. 2026, slin-zhq/Domino-Tree): DDTree's best-first heap, but a child's score
is Domino's *corrected* log-probability along that node's own root path (a GRU state per node;
the backbone pass is shared and computed once), so the tree follows the drafter's conditional
rather than marginal distribution.

    root_state = GRU(embed(root))
    children(node, d): d < prefix: top-K log_softmax(base[d])
                       else:        C = top-M(base[d]); s = base[d][C] + W2[C] . SiLU(W1 [z_d; h_node])
                                    top-K log_softmax(s) over C
    heap by cumulative log-prob; pop -> add node (its state: GRUCell(embed(token), parent state))
    until `budget` nodes

Ablations: `scoring=marginal` (path-independent top-K of base: the DDTree analogue on the Domino
backbone, built as DDTree's trees are, `decoding/drafting/marginal_tree.py`) and `budget=cond_adaptive`
(CaDDTree's cost-aware stop on conditional scores, capped at `max_budget`; this project's issue #4, which
filed it, says the paper found it saturates, so the cap-hit share is recorded). The public code leaves
CondAdaptive out: this builder is our reconstruction, and `max_budget` (64) is our default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from decoding.methods.block_draft import BlockDraftMethod
from decoding.drafting.verify_cost import check_profile_grid
from decoding.methods.caddtree import machine_cost_model
from decoding.drafting.domino_scorer import LevelBuilder, ReferenceScorer
from decoding.drafting.draft_tree import build_best_first
from decoding.drafting.marginal_tree import MarginalTrees
from decoding.engine import cuda_graph
from decoding.engine.loop import DecodeState, Proposal
from decoding.engine.target import TargetModel
from decoding.drafting.verify_cost import CostAwareStop
from pipeline.errors import check_choice, check_range


@dataclass
class DominoTreeConfig:
    _target_: str = "decoding.methods.dominotree.DominoTree"
    name: str = "dominotree"
    drafter: Optional[str] = None  # local folder or HF hub id; null = the model's `drafters.domino`
    scoring: str = "conditional"  # conditional (the paper) | marginal (ablation: DDTree analogue)
    budget: str = "fixed"  # fixed | cond_adaptive (CaDDTree's cost-aware stop on conditional scores)
    num_nodes: int = 16  # fixed node budget (paper default 16)
    max_budget: int = 64  # cap of cond_adaptive
    node_topk: int = 8  # children per node (paper `--node-topk 8`)
    corr_topm: int = 64  # correction restricted to the top-M marginal candidates per depth (`--corr-topm 64`)
    builder: str = "fast"  # fast (depth by depth, batched; CUDA graph on GPU) | reference (node by node, heap)
    cuda_graph: bool = True  # on CUDA, the fast builder replays the whole tree from one CUDA graph (false: eager)
    # cost-model profiling grid for cond_adaptive (see method=caddtree; null node counts = 0, 1, 2, 4, ...
    # up to max_budget)
    profile_node_counts: Optional[list[int]] = None
    profile_context_lengths: Optional[list[int]] = None  # null: as method=caddtree, per device
    profile_repeats: int = 5

    def __post_init__(self) -> None:
        check_choice("method.scoring", self.scoring, ("conditional", "marginal"))
        check_choice("method.budget", self.budget, ("fixed", "cond_adaptive"))
        check_choice("method.builder", self.builder, ("fast", "reference"))
        check_range("method.num_nodes", self.num_nodes, 1)
        check_range("method.node_topk", self.node_topk, 1)
        check_range("method.corr_topm", self.corr_topm, 1)
        check_range("method.max_budget", self.max_budget, 1)
        if self.budget == "cond_adaptive":
            check_profile_grid(self)


class DominoTree(BlockDraftMethod):
    name = "dominotree"
    needs_domino = True

    def setup(self, target: TargetModel) -> None:
        super().setup(target)
        self.cost = machine_cost_model(self, target, self.config) if self.config.budget == "cond_adaptive" else None
        # the fast builder's CUDA graph (CUDA only), captured once and replayed for every tree
        self.graphs = cuda_graph.graphs_for(self.head.w2.device, self.config.cuda_graph, "method.cuda_graph")
        self.cap = self.config.num_nodes if self.cost is None else self.config.max_budget  # nodes per tree, at most
        self.marginal_trees = MarginalTrees(self.config.node_topk, self.cap)  # scoring=marginal

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        self.marginal_trees.reset()

    def propose(self, state: DecodeState) -> Proposal:
        cfg = self.config
        draft, cap = self.draft_pass(state), self.cap
        admit = None if self.cost is None else CostAwareStop(self.cost, self.target.cache_len)
        if cfg.scoring == "conditional" and cfg.builder == "fast":
            builder = LevelBuilder(self.drafter, self.head, self.embed, draft.hidden, draft.logits, cfg.node_topk,
                                   cfg.corr_topm, graphs=self.graphs)
            built = builder.build(state.root, cap, max_depth=len(draft.logits), admit=admit)
        elif cfg.scoring == "marginal":
            built = self.marginal_trees.build(state.root, draft.logits, admit)
        else:
            scorer = ReferenceScorer(self.drafter, self.head, self.embed, draft.hidden, draft.logits, cfg.node_topk,
                                     cfg.corr_topm)
            built = build_best_first(state.root, scorer, cap, max_depth=len(draft.logits), admit=admit)
        if self.cost is not None:
            state.stats.add_extra("tree_nodes", built.tree.num_draft_nodes())
            state.stats.add_extra("budget_cap_hits", int(not built.stopped_early and built.tree.num_draft_nodes() == cap))
        return Proposal(built.tree, hidden_layers=self.taps)


CONFIG = DominoTreeConfig
