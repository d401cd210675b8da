"""Lookahead Decoding (Fu et al., ICML 2024; reference code `hao-ai-lab/LookaheadDecoding`, `lade`).

One forward per step carries two branches:
- the lookahead branch, a 2D Jacobi window: level 0 holds W-1 tokens after the root, levels
  1..N-2 hold W tokens each. Level l, column i sits at position p+l+i and sees block 0 (root +
  level 0) up to column i plus column i of the levels above it: a contiguous position chain. The
  last level's outputs are one Jacobi iteration; every column's diagonal trajectory is harvested
  as an N-gram into the pool, keyed by its first token;
- the verification branch: the pool's (at most G) n-grams that start at the root, as one trie.
The window KV is dropped after the step (the engine keeps only the accepted path). Warm-up takes
N-2 steps in which the window fills level by level and nothing is verified, as in `lade`.

Acceptance is the engine's: greedy follows the longest matching candidate (a fully matched
candidate yields all N-1 tokens plus the bonus; `lade`'s loop yields N-2 there, a quirk we do not
copy); sampling tries candidates in order, accepting x with probability p(x), else zeroing p(x)
and renormalising, with a residual sample if none is accepted (lossless).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from decoding.engine.argmax import row_argmax
from decoding.engine.aux_rows import AuxLayout, AuxRows
from decoding.engine.loop import DecodeState, Method, Proposal, StepResult
from decoding.drafting.ngram_pool import NGramPool, bigram_redundancy, candidate_tree, record_redundancy
from decoding.engine.tree import TokenTree
from pipeline.errors import check_range


@dataclass
class LookaheadConfig:
    _target_: str = "decoding.methods.lookahead.Lookahead"
    name: str = "lookahead"
    ngram_size: int = 5  # N (lade LEVEL): 5 in Spec-Bench eval.sh and the lade README
    window_size: int = 7  # W (lade WINDOW_SIZE): 7 in Spec-Bench eval.sh and the lade README
    guess_set_size: int = 7  # G (lade GUESS_SET_SIZE): LRU cap per key, G = W as in Spec-Bench eval.sh
    pool_from_prompt: bool = False  # lade POOL_FROM_PROMPT (default 0): seed the pool with prompt/output n-grams
    seed: int = 0  # seeds the window's random prompt-token initialisation (lade uses unseeded `random`)

    def __post_init__(self) -> None:
        check_range("method.ngram_size", self.ngram_size, 3)  # N-2 >= 1 Jacobi level
        check_range("method.window_size", self.window_size, 1)
        check_range("method.guess_set_size", self.guess_set_size, 0)


class Lookahead(Method):
    name = "lookahead"

    def begin(self, state: DecodeState) -> None:
        cfg = self.config
        self.rng = random.Random(cfg.seed)
        self.pool = NGramPool(cfg.guess_set_size)
        # levels[0] = level 0; levels[1:] fill one per warm-up step (lade's past_tokens)
        prompt = state.prompt_ids
        self.levels: list[list[int]] = [[self.rng.choice(prompt) for _ in range(cfg.window_size + cfg.ngram_size - 3)]]
        if cfg.pool_from_prompt:
            self.pool.add_text(prompt, cfg.ngram_size - 1)

    @property
    def warm(self) -> bool:
        return len(self.levels) == self.config.ngram_size - 1

    def propose(self, state: DecodeState) -> Proposal:
        layout = window_layout(tuple(map(len, self.levels)))
        tree = TokenTree.root_only(state.root)
        if self.warm and self.config.guess_set_size > 0:
            tree = candidate_tree(state.root, self.pool.get(state.root))
        n_rows = len(tree) + len(layout.depths)
        state.stats.add_extra("forward_rows", n_rows)
        last_level = slice(n_rows - len(self.levels[-1]), n_rows)
        # one Jacobi iteration: the last level's argmax (also at T > 0), read with the acceptance's copy
        return layout.proposal(tree, [tok for level in self.levels for tok in level],
                               reads=lambda output: (row_argmax(output.logits[last_level]),))

    def observe(self, state: DecodeState, result: StepResult) -> None:
        cfg = self.config
        (new,) = result.reads  # the last level's argmax (propose)
        if not self.warm:
            # warm-up: every level moves one column left; the new level keeps len(level 0) + 1 columns
            self.levels = [lv[1:] for lv in self.levels]
            self.levels.append(new[len(new) - len(self.levels[0]) - 1:])
        else:
            root = result.proposal.tree.tokens[0]
            keys = [root, *self.levels[0]]
            grams = [tuple(lv[i] for lv in self.levels[1:]) + (new[i],) for i in range(cfg.window_size)]
            for key, gram in zip(keys, grams):
                self.pool.add(key, gram)
            record_redundancy(state.stats, *bigram_redundancy([(k, *g) for k, g in zip(keys, grams)]))
            # the window always moves by one (lade asserts ALWAYS_FWD_ONE), whatever was accepted
            before_step = state.sequence[:len(state.sequence) - len(result.committed)]
            new = [self.rng.choice(before_step) if t in state.stop_ids else t for t in new]  # lade filter_window
            self.levels = [self.levels[1][1:], *self.levels[2:], new]
        if cfg.pool_from_prompt:  # lade append_new_generated_pool: n-grams ending in each new token
            seq, n = state.sequence, cfg.ngram_size
            for end_index in range(len(seq) - len(result.committed) + 1, len(seq) + 1):
                if end_index >= n:
                    self.pool.add(seq[end_index - n], seq[end_index - n + 1:end_index])


@functools.lru_cache(maxsize=64)
def window_layout(level_lengths: tuple[int, ...]) -> AuxLayout:
    """The window's rows for levels of these lengths, level by level (the tokens in that order): block 0 (root +
    level 0) is causal; level l, column i sits at depth l + i and sees block 0 up to column i and column i of the
    levels above it. One shape per warm-up step, then one for the whole generation."""
    aux = AuxRows()
    block0 = aux.add_chain([0] * level_lengths[0], 1)
    columns: list[list[int]] = [[] for _ in range(level_lengths[0] + 1)]
    for level_index, length in enumerate(level_lengths[1:], start=1):
        for i in range(length):
            columns[i].append(aux.add(0, level_index + i, [*block0[:i], *columns[i]]))
    return aux.layout()


CONFIG = LookaheadConfig
