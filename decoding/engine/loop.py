"""The decoding loop every method runs on: propose -> verify in one target forward -> accept ->
compact KV -> commit -> let the method update its own state.

A method only says what to draft (`propose`) and what to remember (`observe`). Methods whose
verification is not a single target forward (a separate drafter model, a slim verifier) override
`step` and still use `verify` and `commit` from here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from decoding.engine.acceptance import Verdict, accept_greedy, accept_sampling
from decoding.engine.metrics import GenerationStats
from decoding.engine.sampling import Sampler
from decoding.engine.target import ForwardOutput, TargetModel
from decoding.engine.transfer import synchronize, to_host
from decoding.engine.tree import TokenTree


class ContextLimitError(ValueError):
    """The request does not fit the model's usable context (one line for the user)."""


Reads = Callable[[ForwardOutput], Sequence[torch.Tensor]]  # Proposal.reads


@dataclass
class Proposal:
    """What one step sends through the target: a verification tree (row 0 = root) and, optionally,
    auxiliary rows in the same forward that are not verified (e.g. Lookahead's Jacobi window or
    PTD's growing draft tree). Aux rows sit after the tree rows; `aux_depths` are position offsets
    from the root, `aux_visible` [n_aux, n_tree + n_aux] says which rows each aux row attends to
    (tree rows never see aux rows).

    `reads(output)`: the device tensors a method needs on the host from this forward (the argmax of its
    aux rows, their top-k), taken in the acceptance's own device->host copy (`StepResult.reads`): a step
    of a single-forward method then syncs with the host once, however many rows ride along."""

    tree: TokenTree
    aux_tokens: list[int] = field(default_factory=list)
    aux_depths: list[int] = field(default_factory=list)
    aux_visible: np.ndarray | None = None  # host bool array (AuxRows.visible)
    hidden_layers: tuple[int, ...] = ()
    reads: Reads | None = None


@dataclass
class StepResult:
    proposal: Proposal
    verdict: Verdict
    output: ForwardOutput  # logits/hidden of all block rows (tree rows, then aux rows)
    committed: list[int]  # tokens committed this step (accepted drafts + bonus, after stopping)

    @property
    def reads(self) -> list[list]:
        """The host values of `Proposal.reads(output)`, in its order."""
        return self.verdict.reads


class DecodeState:
    """Everything about the sequence being generated for one prompt."""

    def __init__(self, target: TargetModel, prompt_ids: list[int], temperature: float, max_new_tokens: int,
                 stop_ids: set[int], seed: int):
        self.target = target
        self.prompt_ids = list(prompt_ids)
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids
        # all randomness of this generation, on the device of the target's logits (decoding/engine/sampling.py)
        self.sampler = Sampler(seed, target.output_device)
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
    def pending(self) -> list[int]:
        """Committed tokens before the root that the target's cache lacks (settled without the
        full model, e.g. by VIA-SD's slim verifier); the next verification forward re-runs them."""
        return self.sequence[self.target.cache_len:-1]

    @property
    def root(self) -> int:
        """The last committed token; its KV is not cached yet, the next forward starts from it."""
        return self.sequence[-1]


class Method:
    """Base class of a decoding method. Subclasses set `name` and implement `propose`/`observe`,
    or override `step` entirely."""

    name = "base"
    lossless = True  # lossy methods (cascades, VIA-SD) set False: no match_rate vs AR then
    uses_drafter = False  # drafter-verifier methods receive the run's `drafter` config (conf/drafter/)

    def __init__(self, config=None, drafter=None):
        self.config = config
        self.drafter_config = drafter

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

    def finish(self, state: DecodeState) -> None:
        """Called once after the generation (e.g. to record a drafter's own forward counts)."""

    def step(self, state: DecodeState) -> None:
        t0 = time.perf_counter()
        proposal = self.propose(state)
        t1 = time.perf_counter()
        result = verify(state, proposal)
        t2 = time.perf_counter()
        self.observe(state, result)
        t3 = time.perf_counter()
        state.stats.add_time(draft=t1 - t0, verify=t2 - t1, other=t3 - t2)


def forward_proposal(target: TargetModel, proposal: Proposal, pending: list[int] | tuple[int, ...] = (),
                     active_layers=None) -> ForwardOutput:
    """One forward of the proposal's rows (tree, then aux). `pending` are committed tokens before
    the root whose KV the target does not hold yet (settled by a cheaper verifier); they go first
    as a causal chain that every row sees, so the same pass fills their KV. The returned rows
    exclude them (row 0 = root); their hidden taps come back as `pending_hidden`. `active_layers`
    makes it a read-only slim pass (see TargetModel). Tokens, positions and the visibility are assembled on the host (lists, numpy) and reach the
    device as two copies, whatever the block's size."""
    tree, n_pend = proposal.tree, len(pending)
    n_tree, n_aux = len(tree), len(proposal.aux_tokens)
    tokens = [*pending, *tree.tokens, *proposal.aux_tokens]
    depths = [*range(n_pend), *(d + n_pend for d in tree.depths), *(d + n_pend for d in proposal.aux_depths)]
    visible = None
    if n_aux or not tree.is_chain:
        n = n_pend + n_tree + n_aux
        visible = np.zeros((n, n), dtype=bool)
        if n_pend:
            visible[:n_pend, :n_pend] = np.tri(n_pend, dtype=bool)
            visible[n_pend:, :n_pend] = True
        visible[n_pend:n_pend + n_tree, n_pend:n_pend + n_tree] = tree.ancestor_array()
        if n_aux:
            visible[n_pend + n_tree:, n_pend:] = np.asarray(proposal.aux_visible)
    out = target.forward(tokens, depths, visible, proposal.hidden_layers, active_layers=active_layers)
    if not n_pend:
        return out
    return ForwardOutput(out.logits[n_pend:], {k: v[n_pend:] for k, v in out.hidden.items()},
                         {k: v[:n_pend] for k, v in out.hidden.items()})


def accept(state: DecodeState, tree: TokenTree, logits: torch.Tensor, also: Sequence[torch.Tensor] = ()) -> Verdict:
    """The lossless rule of the state's temperature; `also`: tensors read to the host in the same copy."""
    if state.greedy:
        return accept_greedy(tree, logits, also)
    return accept_sampling(tree, logits, state.temperature, state.sampler, also)


def verify(state: DecodeState, proposal: Proposal, decide=None, record: bool = True) -> StepResult:
    """Run the proposal through the target, accept, compact the KV cache and commit.

    `decide(tree, logits) -> Verdict` replaces the lossless acceptance (a lossy method's rule, e.g.
    speculative cascades); `record=False` leaves the step counters to the caller (a method that
    settled part of the block elsewhere records the whole block once)."""
    target = state.target
    prefix_len = target.cache_len
    pending = state.pending
    output = forward_proposal(target, proposal, pending)
    also = proposal.reads(output) if proposal.reads is not None else ()
    if decide is None:
        verdict = accept(state, proposal.tree, output.logits, also)
    else:
        verdict = decide(proposal.tree, output.logits)
        if also:  # a lossy rule reads on its own: the method's reads take a copy of their own
            verdict.reads = to_host(*also)
    target.keep_rows(prefix_len, list(range(len(pending))) + [len(pending) + i for i in verdict.path])
    tree = proposal.tree
    drafted = [tree.tokens[i] for i in verdict.path[1:]]
    committed = commit(state, drafted + [verdict.bonus])
    if record:
        accepted = committed_drafts(verdict.num_accepted, committed)
        state.stats.record_step(
            num_draft_tokens=tree.num_draft_nodes(),
            num_accepted=accepted,
            accepted_depths=[tree.depths[i] for i in verdict.path[1:1 + accepted]],
        )
    return StepResult(proposal, verdict, output, committed)


def committed_drafts(num_accepted: int, committed: list[int]) -> int:
    """The accepted drafts a step counts: all of them, unless a stop token or the token limit cut the step
    short; then only the committed tokens count (the last one in the bonus's place), so that τ × steps is
    exactly the tokens generated. Counting drafts accepted past the cut inflated τ by up to a block."""
    return min(num_accepted, max(len(committed) - 1, 0))


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


@torch.inference_mode()  # once for the whole loop: every op of a step skips autograd's bookkeeping
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
                                f"model's {limit}-token context (max_position_embeddings); lower max_new_tokens or use "
                                f"shorter prompts")
    state = DecodeState(target, prompt_ids, temperature, max_new_tokens, set(stop_ids), seed)
    t0 = time.perf_counter()
    # the KV buffer sized for the prompt and the answer (prefill adds room for a block of draft rows)
    out = target.prefill(prompt_ids[:-1], method.prefill_hidden_layers(), len(prompt_ids) + max_new_tokens)
    method.on_prefill(state, out)
    method.begin(state)
    synchronize(target.output_device)  # a GPU may still run the prefill (a device_map copies its output here, after it)
    state.stats.prefill_s = time.perf_counter() - t0
    state.done = max_new_tokens <= 0
    while not state.done:
        method.step(state)
        if on_step is not None:
            on_step(state)
    state.stats.target_forwards = target.num_forwards
    state.stats.target_forward_cost = target.forward_cost
    method.finish(state)
    state.stats.new_tokens = len(state.new_tokens)
    synchronize(target.output_device)
    state.stats.wall_s = time.perf_counter() - t0
    return state
