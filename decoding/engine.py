"""The decoding loop every method runs on: propose -> verify in one target forward -> accept ->
compact KV -> commit -> let the method update its own state.

A method only says what to draft (`propose`) and what to remember (`observe`). Methods whose
verification is not a single target forward (a separate drafter model, a slim verifier) override
`step` and still use `verify` and `commit` from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from decoding.acceptance import Verdict, accept_greedy, accept_sampling
from decoding.metrics import GenerationStats
from decoding.target import ForwardOutput, TargetModel
from decoding.tree import TokenTree


class ContextLimitError(ValueError):
    """The request does not fit the model's usable context (one line for the user)."""


@dataclass
class Proposal:
    """What one step sends through the target: a verification tree (row 0 = root) and, optionally,
    auxiliary rows in the same forward that are not verified (e.g. Lookahead's Jacobi window or
    PTD's growing draft tree). Aux rows sit after the tree rows; `aux_depths` are position offsets
    from the root, `aux_visible` [n_aux, n_tree + n_aux] says which rows each aux row attends to
    (tree rows never see aux rows)."""

    tree: TokenTree
    aux_tokens: list[int] = field(default_factory=list)
    aux_depths: list[int] = field(default_factory=list)
    aux_visible: torch.Tensor | None = None
    hidden_layers: tuple[int, ...] = ()


@dataclass
class StepResult:
    proposal: Proposal
    verdict: Verdict
    output: ForwardOutput  # logits/hidden of all block rows (tree rows, then aux rows)
    committed: list[int]  # tokens committed this step (accepted drafts + bonus, after stopping)

    def aux_logits(self) -> torch.Tensor:
        return self.output.logits[len(self.proposal.tree) :]


class DecodeState:
    """Everything about the sequence being generated for one prompt."""

    def __init__(self, target: TargetModel, prompt_ids: list[int], temperature: float, max_new_tokens: int,
                 stop_ids: set[int], seed: int):
        self.target = target
        self.prompt_ids = list(prompt_ids)
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids
        self.generator = torch.Generator().manual_seed(seed)
        self.new_tokens: list[int] = []
        self.stats = GenerationStats()
        self.done = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def sequence(self) -> list[int]:
        """All committed tokens: prompt plus generated."""
        return self.prompt_ids + self.new_tokens

    @property
    def root(self) -> int:
        """The last committed token; its KV is not cached yet, the next forward starts from it."""
        return self.sequence[-1]


class Method:
    """Base class of a decoding method. Subclasses set `name` and implement `propose`/`observe`,
    or override `step` entirely."""

    name = "base"
    lossless = True  # lossy methods (cascades, VIA-SD) set False: no match_rate vs AR then

    def __init__(self, config=None):
        self.config = config

    def setup(self, target: TargetModel) -> None:
        """Called once per run with the loaded target (load drafters, size buffers...)."""

    def begin(self, state: DecodeState) -> None:
        """Per-prompt reset, called after the prompt's prefill."""

    def prefill_hidden_layers(self) -> tuple[int, ...]:
        return ()

    def on_prefill(self, state: DecodeState, output: ForwardOutput) -> None:
        """Sees the prefill output (e.g. tapped hidden states for a feature drafter)."""

    def propose(self, state: DecodeState) -> Proposal:
        return Proposal(TokenTree.root_only(state.root))

    def observe(self, state: DecodeState, result: StepResult) -> None:
        """Update the method's own state after a verified step."""

    def step(self, state: DecodeState) -> None:
        t0 = time.perf_counter()
        proposal = self.propose(state)
        t1 = time.perf_counter()
        result = verify(state, proposal)
        t2 = time.perf_counter()
        self.observe(state, result)
        t3 = time.perf_counter()
        state.stats.add_time(draft=t1 - t0, verify=t2 - t1, other=t3 - t2)


def forward_proposal(target: TargetModel, proposal: Proposal) -> ForwardOutput:
    tree = proposal.tree
    if not proposal.aux_tokens:
        return target.forward_tree(tree, proposal.hidden_layers)
    n_tree, n_aux = len(tree), len(proposal.aux_tokens)
    visible = torch.zeros(n_tree + n_aux, n_tree + n_aux, dtype=torch.bool)
    visible[:n_tree, :n_tree] = tree.ancestor_mask()
    visible[n_tree:] = proposal.aux_visible
    tokens = torch.tensor(tree.tokens + list(proposal.aux_tokens))
    depths = torch.tensor(tree.depths + list(proposal.aux_depths))
    return target.forward(tokens, depths, visible, proposal.hidden_layers)


def accept(state: DecodeState, tree: TokenTree, logits: torch.Tensor) -> Verdict:
    if state.greedy:
        return accept_greedy(tree, logits)
    return accept_sampling(tree, logits, state.temperature, state.generator)


def verify(state: DecodeState, proposal: Proposal) -> StepResult:
    """Run the proposal through the target, accept, compact the KV cache and commit."""
    target = state.target
    prefix_len = target.cache_len
    output = forward_proposal(target, proposal)
    verdict = accept(state, proposal.tree, output.logits)
    target.keep_rows(prefix_len, verdict.path)
    tree = proposal.tree
    drafted = [tree.tokens[i] for i in verdict.path[1:]]
    committed = commit(state, drafted + [verdict.bonus])
    state.stats.record_step(
        num_draft_tokens=tree.num_draft_nodes(),
        num_accepted=verdict.num_accepted,
        accepted_depths=[tree.depths[i] for i in verdict.path[1:]],
    )
    return StepResult(proposal, verdict, output, committed)


def commit(state: DecodeState, tokens: list[int]) -> list[int]:
    """Append tokens, stopping at a stop token or at max_new_tokens exactly as AR would."""
    room = state.max_new_tokens - len(state.new_tokens)
    out = []
    for tok in tokens[:room]:
        out.append(tok)
        if tok in state.stop_ids:
            state.done = True
            break
    state.new_tokens.extend(out)
    if len(state.new_tokens) >= state.max_new_tokens:
        state.done = True
    return out


def generate(
    method: Method,
    target: TargetModel,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    stop_ids: set[int] | frozenset[int] = frozenset(),
    seed: int = 0,
    on_step: Callable[[DecodeState], None] | None = None,
) -> DecodeState:
    """Generate up to `max_new_tokens` after `prompt_ids` with `method`; returns the final state
    (tokens in `state.new_tokens`, metrics in `state.stats`)."""
    if not prompt_ids:
        raise ValueError("empty prompt")
    limit = target.context_limit
    if limit is not None and len(prompt_ids) + max_new_tokens > limit:
        raise ContextLimitError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds this "
                                f"model's {limit}-token sliding window; lower max_new_tokens or use shorter prompts")
    state = DecodeState(target, prompt_ids, temperature, max_new_tokens, set(stop_ids), seed)
    t0 = time.perf_counter()
    out = target.prefill(prompt_ids[:-1], method.prefill_hidden_layers())
    method.on_prefill(state, out)
    method.begin(state)
    state.stats.prefill_s = time.perf_counter() - t0
    state.done = max_new_tokens <= 0
    while not state.done:
        method.step(state)
        if on_step is not None:
            on_step(state)
    state.stats.target_forwards = target.num_forwards
    state.stats.new_tokens = len(state.new_tokens)
    state.stats.wall_s = time.perf_counter() - t0
    return state
