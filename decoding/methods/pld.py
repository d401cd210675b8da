"""Prompt Lookup Decoding (Saxena 2023; HF `prompt_lookup_num_tokens`): draft the tokens that
followed an earlier occurrence of the current n-gram suffix. Training-free, a chain draft, verified
by the engine. A small baseline and the simplest example of a method file.

Two match rules (`match`): "recent" (ours, the default) takes the most recent earlier occurrence and
accepts a continuation shorter than `num_draft_tokens`; "reference" is the rule of
apoorvumang/prompt-lookup-decoding, Spec-Bench and SGLang's n-gram drafter: the earliest occurrence
whose continuation is `num_draft_tokens` long in full and does not reach into the suffix itself
(`method=pld_reference`). HF's `PromptLookupCandidateGenerator` also takes the earliest, but accepts a
partial continuation.
"""

from __future__ import annotations

from dataclasses import dataclass

from decoding.engine.loop import DecodeState, Method, Proposal
from decoding.engine.tree import TokenTree
from pipeline.errors import check_choice


@dataclass
class PLDConfig:
    _target_: str = "decoding.methods.pld.PromptLookup"
    name: str = "pld"
    max_ngram_size: int = 3  # longest suffix to match (HF default 2; the reference and Spec-Bench use 3)
    min_ngram_size: int = 1
    num_draft_tokens: int = 10  # the reference's num_pred_tokens (HF: PromptLookupCandidateGenerator's default)
    match: str = "recent"  # "recent" (ours) or "reference" (earliest full continuation), see the docstring

    def __post_init__(self) -> None:
        check_choice("method.match", self.match, ("recent", "reference"))


class PromptLookup(Method):
    name = "pld"

    def propose(self, state: DecodeState) -> Proposal:
        return Proposal(TokenTree.chain(state.root, self.lookup(state.sequence)))

    def lookup(self, seq: list[int]) -> list[int]:
        cfg = self.config
        reference = cfg.match == "reference"
        length = len(seq)
        for n in range(min(cfg.max_ngram_size, length - 1), cfg.min_ngram_size - 1, -1):
            suffix = seq[-n:]
            starts = range(length - 2 * n) if reference else range(length - n - 1, -1, -1)
            for start in starts:
                if seq[start:start + n] != suffix:
                    continue
                follow = seq[start + n:start + n + cfg.num_draft_tokens]
                if len(follow) == cfg.num_draft_tokens if reference else follow:
                    return follow
        return []


CONFIG = PLDConfig
