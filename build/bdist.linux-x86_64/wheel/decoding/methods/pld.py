"""Prompt Lookup Decoding (Saxena 2023; HF `prompt_lookup_num_tokens`): draft the tokens that
followed the most recent earlier occurrence of the current n-gram suffix. Training-free, a chain
draft, verified by the engine. A small baseline and the simplest example of a method file."""

from __future__ import annotations

from dataclasses import dataclass

from decoding.engine.loop import DecodeState, Method, Proposal
from decoding.engine.tree import TokenTree


@dataclass
class PLDConfig:
    _target_: str = "decoding.methods.pld.PromptLookup"
    name: str = "pld"
    max_ngram_size: int = 3  # longest suffix to match (HF default 2; Spec-Bench uses 3)
    min_ngram_size: int = 1
    num_draft_tokens: int = 10  # HF prompt_lookup_num_tokens default


class PromptLookup(Method):
    name = "pld"

    def propose(self, state: DecodeState) -> Proposal:
        return Proposal(TokenTree.chain(state.root, self.lookup(state.sequence)))

    def lookup(self, seq: list[int]) -> list[int]:
        cfg = self.config
        for n in range(min(cfg.max_ngram_size, len(seq) - 1), cfg.min_ngram_size - 1, -1):
            suffix = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):  # most recent match first
                if seq[start:start + n] == suffix:
                    follow = seq[start + n:start + n + cfg.num_draft_tokens]
                    if follow:
                        return follow
        return []


CONFIG = PLDConfig
