"""Speculative cascades (Narasimhan et al., "Faster Cascades via Speculative Decoding", ICLR 2025;
official colab google-research/speculative_cascades). The small model q_s drafts γ tokens, the large
model q_l scores them in one pass, and a deferral rule with lenience α turns (q_s, q_l) into a target
π per position; speculative sampling then runs against π instead of q_l:
    accept x with min(1, π(x)/q_s(x)), else resample from norm(max(0, π - q_s)); bonus from q_l.
Rules (q_s small, q_l large; see research/viasd.md §3):
    chow (eq. 2)  keep q_s if max q_s >= 1 - α
    diff (eq. 5)  keep q_s if max q_s >= max q_l - α
    opt  (eq. 10) keep q_s if max q_s >= max q_l - α·TV(q_s, q_l)
      -> π = q_s if kept, else q_l
    v1 (eq. 13)   token v passes if q_s(v) >= max q_l - α
    v2 (eq. 14)   token v passes if q_l(v) >= max q_l - α
    v3 (eq. 15)   token v passes if q_l(v) >= (1 - α)·max q_l
      -> π(v) = q_s(v)·1[pass(v)] + (1 - Σ_u q_s(u)·1[pass(u)])·q_l(v)
Lossy by design (π != q_l): quality is reported next to speed, α sweeps the trade-off.
At T=0 the rules use the models' T=1 distributions and the emitted token is argmax π."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.engine.acceptance import Verdict, accept_against, accept_greedy
from decoding.drafting.drafter import DrafterConfig, build_draft_length, build_drafter
from decoding.engine.loop import DecodeState, Method, Proposal, verify
from decoding.engine.tree import TokenTree
from pipeline.errors import check_choice

RULES = ("chow", "diff", "opt", "v1", "v2", "v3")


@dataclass
class SpecCascadeConfig:
    _target_: str = "decoding.methods.spec_cascade.SpeculativeCascade"
    name: str = "spec_cascade"
    # deferral rule: chow | diff | opt | v1 | v2 | v3 (paper §4-5). OPT is the best of the rules that keep or
    # defer a whole distribution; the paper's appendix finds the token-level rules ahead of it except at low T
    rule: str = "opt"
    # lenience α [our default: the paper sweeps it]; ranges per rule in the paper: chow/v3 [0,1], diff/v1/v2
    # [-1,1], opt any real
    alpha: float = 0.1

    def __post_init__(self) -> None:
        check_choice("method.rule", self.rule, RULES)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p - q).clamp_min(0).sum(-1)


def cascade_target(rule: str, alpha: float, q_small: torch.Tensor,
                   q_large: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The deferral rule's target distribution π for one position (or a batch of positions), and the mass
    of q_s it keeps, Σ_v q_s(v)·1[pass(v)] (chow / diff / opt: 1 where q_s is kept whole, else 0)."""
    max_s = q_small.max(-1, keepdim=True).values
    max_l = q_large.max(-1, keepdim=True).values
    if rule in ("chow", "diff", "opt"):
        if rule == "chow":
            keep = max_s >= 1 - alpha
        elif rule == "diff":
            keep = max_s >= max_l - alpha
        else:
            keep = max_s >= max_l - alpha * total_variation(q_small, q_large).unsqueeze(-1)
        return torch.where(keep, q_small, q_large), keep.squeeze(-1).to(q_small.dtype)
    if rule == "v1":
        passes = q_small >= max_l - alpha
    elif rule == "v2":
        passes = q_large >= max_l - alpha
    else:
        passes = q_large >= (1 - alpha) * max_l
    kept = q_small * passes
    mass = kept.sum(-1, keepdim=True)
    return kept + (1 - mass).clamp_min(0) * q_large, mass.squeeze(-1)


class SpeculativeCascade(Method):
    name = "spec_cascade"
    lossless = False
    uses_drafter = True

    def setup(self, target) -> None:
        drafter_cfg = self.drafter_config or DrafterConfig()
        self.drafter = build_drafter(drafter_cfg, target)
        self.draft_length = build_draft_length(drafter_cfg)

    def begin(self, state: DecodeState) -> None:
        self.drafter.begin(state.sequence, len(state.sequence) + state.max_new_tokens)
        self.draft_length.reset()
        self._small_mass = torch.zeros((), dtype=torch.float32, device=state.target.output_device)

    def prefill_hidden_layers(self) -> tuple[int, ...]:
        return self.drafter.hidden_layers  # a feature drafter (EAGLE-3) reads target layers; others none

    def on_prefill(self, state: DecodeState, output) -> None:
        self.drafter.on_prefill(output, state.prompt_ids)

    def propose(self, state: DecodeState) -> Proposal:
        gamma = self.draft_length.next(state.stats)
        tokens, self._q_small = self.drafter.draft(state.sequence, gamma, state.temperature, state.sampler)
        return Proposal(TokenTree.chain(state.root, tokens, list(self._q_small)), hidden_layers=self.drafter.hidden_layers)

    def finish(self, state: DecodeState) -> None:
        self.drafter.record(state.stats)
        self.draft_length.record(state.stats)
        # per scored position (every drafted one, before or after a rejection): how much of q_s π keeps
        state.stats.add_extra("small_mass_kept", float(self._small_mass))

    def step(self, state: DecodeState) -> None:
        import time

        t0 = time.perf_counter()
        proposal = self.propose(state)
        t1 = time.perf_counter()
        result = verify(state, proposal, decide=lambda tree, logits: self.decide(state, tree, logits))
        self.drafter.observe(result, state.sequence)
        state.stats.add_time(draft=t1 - t0, verify=time.perf_counter() - t1)

    def decide(self, state: DecodeState, tree: TokenTree, logits: torch.Tensor) -> Verdict:
        temperature = state.temperature if state.temperature > 0 else 1.0
        q_large = torch.softmax(logits.float() / temperature, dim=-1)  # rows: root, x1, ..., xγ
        gamma = len(tree) - 1
        pi, mass = cascade_target(self.config.rule, self.config.alpha, self._q_small.to(q_large.device),
                                  q_large[:gamma])
        targets = torch.cat([pi, q_large[gamma:]])  # bonus position: q_l (the drafter has no q_s there)
        self._small_mass = self._small_mass + mass.sum()  # on the device, read once in finish()
        state.stats.add_extra("positions_scored", gamma)
        if state.greedy:
            return accept_greedy(tree, targets)
        return accept_against(tree, targets, state.sampler)


CONFIG = SpecCascadeConfig
