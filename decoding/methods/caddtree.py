"""CaDDTree (Zhang et al., ZhangShuai1230/CaDDTree): DDTree's best-first tree with a per-round,
cost-aware budget. Instead of a fixed node count, keep adding the next best node while the
surrogate throughput (1 + sum of accepted-path probabilities) / (Cd + Cv(n, ctx)) still rises;
with a convex verify cost the surrogate is unimodal, so the greedy stop is optimal. Cv is profiled
on this machine (see `decoding/drafting/verify_cost.py`) and cached per model + device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from decoding.methods.block_draft import BlockDraftMethod
from decoding.drafting.marginal_tree import MarginalTrees
from decoding.engine.loop import DecodeState, Proposal
from decoding.engine.target import TargetModel
from decoding.drafting.verify_cost import STEADY_STATE_NEW_ROWS, CostAwareStop, check_profile_grid, profiled_cost_model
from pipeline.errors import check_range


@dataclass
class CaDDTreeConfig:
    _target_: str = "decoding.methods.caddtree.CaDDTree"
    name: str = "caddtree"
    drafter: Optional[str] = None  # local folder or HF hub id; null = the model's `drafters.dflash`
    max_budget: int = 1024  # CaDDTree `max_tree_budget`
    # profiling grid. Node counts: null = 0, 1, 2, 4, ... up to max_budget (the reference profiles
    # n = 1..1024); a given grid must reach max_budget. Contexts: null = the reference's 0..8192 (step
    # 1024) on a GPU, 64 / 512 / 1024 on a CPU (cheaper; CPU runs are short); beyond the last one Cv is
    # clamped as in the reference, with a warning. Repeats: the reference takes 20 after 5 warm-ups.
    profile_node_counts: Optional[list[int]] = None
    profile_context_lengths: Optional[list[int]] = None
    profile_repeats: int = 5

    def __post_init__(self) -> None:
        check_range("method.max_budget", self.max_budget, 1)
        check_profile_grid(self)


def machine_cost_model(method: BlockDraftMethod, target: TargetModel, cfg) -> "VerifyCostModel":  # noqa: F821
    """Profile (once per model + drafter + device + profile grid) the verify cost and the draft cost."""
    spec = method.drafter.spec
    width = len(spec.target_layer_ids) * spec.hidden_size
    block = method.embed(torch.full((spec.block_size,), spec.mask_token_id, device=target.device))
    cache = method.drafter.new_cache()
    # a warm cache, as mid-generation: each timed pass then projects only the few context rows
    # committed since the previous round, like a real drafting pass (not the whole prompt again)
    method.drafter.draft(cache, torch.zeros(256, width, device=target.device, dtype=target.dtype), block, 256)
    committed = torch.zeros(STEADY_STATE_NEW_ROWS, width, device=target.device, dtype=target.dtype)

    def draft_once():
        method.head_logits(method.drafter.draft(cache, committed, block, cache.length + len(committed)))

    return profiled_cost_model(target, cfg, draft_once, method=method)


class CaDDTree(BlockDraftMethod):
    name = "caddtree"

    def setup(self, target: TargetModel) -> None:
        super().setup(target)
        self.cost = machine_cost_model(self, target, self.config)
        self.trees = MarginalTrees(self.config.max_budget, self.config.max_budget)

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        self.trees.reset()

    def propose(self, state: DecodeState) -> Proposal:
        logits = self.draft_pass(state).logits
        cap = self.config.max_budget
        built = self.trees.build(state.root, logits, admit=CostAwareStop(self.cost, self.target.cache_len))
        state.stats.add_extra("tree_nodes", built.tree.num_draft_nodes())
        state.stats.add_extra("budget_cap_hits", int(not built.stopped_early and built.tree.num_draft_nodes() == cap))
        return Proposal(built.tree, hidden_layers=self.taps)


CONFIG = CaDDTreeConfig
