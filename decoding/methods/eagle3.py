"""EAGLE-3 (Li et al. 2025, SafeAILab/EAGLE): a one-layer drafter over three target layers' features,
drafting EAGLE-2's dynamic tree (`tree=true`, the paper's inference) or a chain (`tree=false`, the
vLLM / SGLang chain mode), verified by the engine like every tree.

Bookkeeping per step: the drafter's cache holds one row per committed token but the root, each built
from the target's features of that token and the embedding of the token after it. The prefill taps
the prompt; a verified step taps the root and the accepted drafts, whose following tokens are the
accepted drafts and the bonus, so the next step's rows are exactly those (EAGLE's `stable_kv`, with
the expansion's rows discarded). The drafter (`decoding/drafting/eagle3_drafter.py`) and the tree
(`decoding/drafting/eagle_tree.py`) are separate files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from decoding.drafting.draft_length import DraftLength
from decoding.drafting.verify_cost import STEADY_STATE_NEW_ROWS, CostAwareStop, check_profile_grid, profiled_cost_model
from decoding.drafting.eagle3_drafter import fitted_embeddings, load_eagle3
from decoding.drafting.eagle_tree import compiled_expansion, dynamic_tree
from decoding.engine import cuda_graph
from decoding.engine.loop import DecodeState, Method, Proposal, StepResult
from decoding.engine.target import ForwardOutput, TargetModel
from decoding.engine.transfer import to_device
from decoding.engine.tree import TokenTree
from pipeline.errors import ConfigError, check_choice, check_range


@dataclass
class Eagle3Config:
    _target_: str = "decoding.methods.eagle3.Eagle3"
    name: str = "eagle3"
    drafter: Optional[str] = None  # local folder or HF hub id; null = the model's `drafters.eagle3`
    tree: bool = True  # EAGLE-2 dynamic tree; false: a chain of `chain_length` argmax drafts
    total_tokens: int = 60  # tree nodes including the root (EAGLE's total_token; its eval scripts use 60)
    depth: int = 5  # expansions after the first top-k: drafts reach depth + 1 (EAGLE's depth)
    top_k: int = 10  # frontier width and children per node (EAGLE's top_k)
    # fixed: the total_tokens - 1 best nodes | cost_aware (ours): of those, as many as CaDDTree's stop admits, by their
    # draft path probabilities against this machine's profiled verify cost (decoding/drafting/verify_cost.py)
    budget: str = "fixed"
    profile_node_counts: Optional[list[int]] = None  # budget=cost_aware: as method=caddtree (null: 0, 1, 2, 4, ...)
    profile_context_lengths: Optional[list[int]] = None
    profile_repeats: int = 5
    chain_length: int = 5  # tree=false: drafts per step (SGLang's speculative_num_steps default)
    # tree=false: fixed (chain_length drafts) | optimal (Leviathan et al.'s length from the measured acceptance and
    # drafter cost, each step; as drafter.gamma_policy, decoding/drafting/draft_length.py)
    chain_policy: str = "fixed"
    max_chain_length: int = 8  # chain_policy=optimal: lengths 1..max_chain_length
    draft_cost: Optional[float] = None  # chain_policy=optimal: c given (seed-exact runs at T > 0); null = measured
    layer_ids: list[int] = field(default_factory=list)  # target layers (output ids); [] = the checkpoint's
    # on CUDA, the tree's expansion (its drafter passes and top-k bookkeeping; the chain's too) replays from one
    # CUDA graph per step (decoding/drafting/eagle_tree.py); false: eager. Not used with compile.
    cuda_graph: bool = True
    # torch.compile the expansion (decoding/engine/compiled.py; inductor's C++ on a CPU): one compile per process
    # (~35 s on a 2-core CPU); wall time per step on the host-overhead model 12.4 -> 10.4 ms, but slower on SmolLM2 in
    # bf16 with packed linears, which a compiled expansion does not use (docs/methods/eagle3.md)
    compile: bool = False

    def __post_init__(self) -> None:
        check_range("method.total_tokens", self.total_tokens, 2)
        check_range("method.depth", self.depth, 1)
        check_range("method.top_k", self.top_k, 1)
        check_range("method.chain_length", self.chain_length, 1)
        check_choice("method.chain_policy", self.chain_policy, ("fixed", "optimal"))
        check_range("method.max_chain_length", self.max_chain_length, 1)
        if self.draft_cost is not None:
            check_range("method.draft_cost", self.draft_cost, 0.0)
        check_choice("method.budget", self.budget, ("fixed", "cost_aware"))
        if self.budget == "cost_aware":
            if not self.tree:
                raise ConfigError("method.budget=cost_aware trims the dynamic tree: it needs method.tree=true")
            check_profile_grid(self, "method.total_tokens - 1")
        if self.chain_policy != "fixed" and self.tree:
            raise ConfigError("method.chain_policy=optimal sets the chain's length: it needs method.tree=false")
        if self.chain_policy != "fixed" and self.compile:
            raise ConfigError("method.chain_policy=optimal with method.compile=true would compile the expansion once "
                              "per chain length (~35 s each on a 2-core CPU): set method.compile=false")

    @property
    def max_budget(self) -> int:
        """The most draft nodes a tree can have (what budget=cost_aware's profile must cover)."""
        return self.total_tokens - 1


class Eagle3(Method):
    name = "eagle3"

    def setup(self, target: TargetModel) -> None:
        if not self.config.drafter:
            raise ConfigError("method=eagle3: no EAGLE-3 drafter is known for this model; set method.drafter=<folder "
                              "or HF hub id> (train one: python -m pipeline.train drafter=eagle3)")
        self.drafter = load_eagle3(self.config.drafter, device=target.device, dtype=target.dtype)
        self.taps = tuple(self.config.layer_ids or self.drafter.spec.layer_ids(target.config.num_hidden_layers))
        self.embed = fitted_embeddings(self.drafter, self.taps, target, f"method=eagle3: drafter {self.config.drafter}")
        self.target = target
        self.graphs = cuda_graph.graphs_for(self.drafter.lm_head.weight.device,
                                            self.config.cuda_graph and not self.config.compile, "method.cuda_graph")
        self.expand = compiled_expansion(self.config.compile)
        self.cache = self.drafter.new_cache()  # its buffers are kept from prompt to prompt (so is a captured tree)
        cfg = self.config
        self.chain_length = DraftLength(cfg.chain_length, cfg.chain_policy, cfg.max_chain_length, cfg.draft_cost)
        self.cost = None
        if cfg.budget == "cost_aware":
            self.cost = self.cost_model(target)

    def cost_model(self, target: TargetModel):
        """The verify cost curve and one drafting round's cost (the drafter's extension by the rows a step commits,
        then the tree's expansion, replayed from a graph where decoding replays one), profiled once per machine
        (cached)."""
        cfg, spec = self.config, self.drafter.spec
        cache = self.drafter.new_cache()
        cache.clear(512)
        width = 3 * spec.target_hidden_size
        tokens = torch.zeros(256, dtype=torch.long, device=target.device)
        self.drafter.extend(cache, torch.zeros(256, width, device=target.device, dtype=target.dtype),
                            self.embed(tokens))
        committed = torch.zeros(STEADY_STATE_NEW_ROWS, width, device=target.device, dtype=target.dtype)
        # its own replayer: a graph captured on this throwaway cache must not be the decoding cache's
        graphs = cuda_graph.graphs_for(self.drafter.lm_head.weight.device, cfg.cuda_graph and not cfg.compile,
                                       "method.cuda_graph")

        def draft_once():
            length = cache.length
            rows = self.drafter.extend(cache, committed, self.embed(tokens[:STEADY_STATE_NEW_ROWS]))
            dynamic_tree(self.drafter, cache, rows[-1], self.embed, 0, cfg.top_k, cfg.depth, cfg.total_tokens,
                         graphs, self.expand)
            cache.set_length(length)  # every round drafts after the same rows

        return profiled_cost_model(target, cfg, draft_once, method=self, tag="eagle3",
                                   shape=(cfg.top_k, cfg.depth, cfg.total_tokens, cfg.cuda_graph, cfg.compile))

    def prefill_hidden_layers(self) -> tuple[int, ...]:
        return self.taps

    def begin(self, state: DecodeState) -> None:
        self.cache.clear(len(state.prompt_ids) + state.max_new_tokens)
        if self.cache.take_moved():  # resized for this prompt: the old buffers' graph (and memory) goes now
            self.graphs.forget()
        self.passes = 0
        self.chain_length.reset()

    def on_prefill(self, state: DecodeState, output: ForwardOutput) -> None:
        # rows 0..n-2 of the prompt, each followed by the next prompt token (the last one is the root)
        self.pending = (self._features(output, None), state.prompt_ids[1:])

    def observe(self, state: DecodeState, result: StepResult) -> None:
        rows = result.verdict.path[:len(result.committed)]  # a stop token may cut the commit short
        self.pending = (self._features(result.output, rows), result.committed[:len(rows)])

    def _features(self, output: ForwardOutput, rows: list[int] | None) -> torch.Tensor:
        if not output.hidden:  # a one-token prompt: nothing prefilled
            return torch.empty(0, 3 * self.drafter.spec.target_hidden_size, device=self.target.device,
                               dtype=self.target.dtype)
        feats = torch.cat([output.hidden[layer] for layer in self.taps], dim=-1)
        return feats if rows is None else feats.index_select(0, to_device(rows, feats.device))

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Proposal:
        features, next_tokens = self.pending
        h = self.drafter.extend(self.cache, features, self.embed(to_device(next_tokens, features.device)))
        self.passes += 1
        if not len(h):  # no row to draft from yet (a one-token prompt's first step)
            return Proposal(TokenTree.root_only(state.root), hidden_layers=self.taps)
        cfg = self.config
        # the chain: the width-one tree, chain_length drafts in chain_length - 1 passes after the first pick
        if cfg.tree:
            top_k, depth, total = cfg.top_k, cfg.depth, cfg.total_tokens
        else:
            length = self.chain_length.next(state.stats)
            top_k, depth, total = 1, length - 1, length + 1
        admit = None
        if self.cost is not None:
            stop = CostAwareStop(self.cost, self.target.cache_len)
            admit = lambda scores: stop.admitted(np.asarray(scores))  # noqa: E731
        tree, passes = dynamic_tree(self.drafter, self.cache, h[-1], self.embed, state.root, top_k, depth, total,
                                    self.graphs, self.expand, admit)
        if self.cost is not None:
            state.stats.add_extra("tree_nodes", len(tree) - 1)
        self.passes += passes
        return Proposal(tree, hidden_layers=self.taps)

    def finish(self, state: DecodeState) -> None:
        state.stats.add_extra("drafter_forwards", self.passes)
        self.chain_length.record(state.stats)


CONFIG = Eagle3Config
