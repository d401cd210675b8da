"""Standard speculative decoding (Leviathan et al., ICML 2023; Chen et al., 2023): a small
drafter samples γ tokens autoregressively, recording its distributions q; the target scores the
chain in one forward; token x is accepted with min(1, p(x)/q(x)), the first rejection is resampled
from norm(max(0, p - q)), and if all γ pass a bonus token is sampled from p. Lossless at any T;
at T=0 it is greedy matching. The verification (chain forward, acceptance, bonus, KV compaction)
is the engine's; this file only drafts.

`drafter=slim` (the target with a routing mask's layers skipped) is the self-speculative
layer-skipping baseline (Draft & Verify / SWIFT style, with the DIMR mask)."""

from __future__ import annotations

from dataclasses import dataclass

from decoding.drafting.drafter import build_draft_length, build_drafter
from decoding.engine.loop import DecodeState, Method, Proposal
from decoding.engine.tree import TokenTree


@dataclass
class SDConfig:
    _target_: str = "decoding.methods.sd.SpeculativeDecoding"
    name: str = "sd"
    # The drafter and the draft length γ come from the `drafter` config group (drafter.gamma, or
    # drafter.gamma_policy=optimal: Leviathan et al.'s γ from measured α and cost, decoding/drafting/draft_length.py).


class SpeculativeDecoding(Method):
    name = "sd"
    uses_drafter = True

    def setup(self, target) -> None:
        from decoding.drafting.drafter import DrafterConfig

        self.drafter = build_drafter(self.drafter_config or DrafterConfig(), target)
        self.draft_length = build_draft_length(self.drafter_config or DrafterConfig())

    def begin(self, state: DecodeState) -> None:
        self.drafter.begin(state.sequence, len(state.sequence) + state.max_new_tokens)
        self.draft_length.reset()

    def prefill_hidden_layers(self) -> tuple[int, ...]:
        return self.drafter.hidden_layers  # a feature drafter (EAGLE-3) reads target layers; others none

    def on_prefill(self, state: DecodeState, output) -> None:
        self.drafter.on_prefill(output, state.prompt_ids)

    def propose(self, state: DecodeState) -> Proposal:
        gamma = self.draft_length.next(state.stats)
        tokens, dists = self.drafter.draft(state.sequence, gamma, state.temperature, state.sampler,
                                           need_dists=not state.greedy)
        # At T=0 the drafts are argmaxes (deterministic proposals); at T>0 they were sampled from q.
        return Proposal(TokenTree.chain(state.root, tokens, None if state.greedy else list(dists)),
                        hidden_layers=self.drafter.hidden_layers)

    def observe(self, state: DecodeState, result) -> None:
        self.drafter.observe(result, state.sequence)

    def finish(self, state: DecodeState) -> None:
        self.drafter.record(state.stats)
        self.draft_length.record(state.stats)


CONFIG = SDConfig
