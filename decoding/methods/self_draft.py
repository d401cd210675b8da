"""Self-Draft (training-free; reference code `ZipECHO/Self-Draft`, 2024): Lookahead-style Jacobi
draft branches whose columns are perturbed by short random prefixes copied from the prompt.

Per step, in one forward with the candidate trie (see `decoding/engine/aux_rows.py`):
- column 0 is the root's own Jacobi chain (levels 1..L-2 at positions p+1..);
- column c >= 1 first holds its aux prefix a_c (1..`max_pad_len` prompt tokens at p+1..p+|a_c|,
  causal), then its levels at p+|a_c|+1..; each column sees only the root, its own prefix and its
  own earlier levels, so the columns are independent perturbed trajectories;
- the last level's outputs are one Jacobi iteration; afterwards each prefix slides along its
  column (a_c <- a_c[1:] + [level_1[c]]) and the levels move up by one.
The context cache (key = 1 token -> at most 10 n-grams, LRU) is filled with every window of every
column (inputs, then the model's output at the window's end), and with the committed text extended
by column 0's chain; it lives across prompts and is cut to `keep_num` n-grams per key every
`flush_interval` prompts (departures from the repository's cache: docs/methods/endogenous.md). An
optional static corpus table adds up to 3 n-grams (longest key first).
Candidates are verified by the engine exactly like Lookahead's (lossless at T=0 and T>0).
"""

from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from decoding.engine.argmax import row_argmax
from decoding.engine.aux_rows import AuxLayout, AuxRows
from decoding.engine.loop import DecodeState, Method, Proposal, StepResult
from decoding.drafting.ngram_pool import CorpusNGrams, NGramPool, bigram_redundancy, candidate_tree, record_redundancy
from decoding.engine.tree import TokenTree
from pipeline.errors import ConfigError, check_range


@dataclass
class SelfDraftConfig:
    _target_: str = "decoding.methods.self_draft.SelfDraft"
    name: str = "self_draft"
    branch_len: int = 6  # main.py --branch-len: levels 1..branch_len-2 are fed back (Jacobi depth)
    branch_num: int = 6  # main.py --branch-num: columns (draft branches)
    context_gram_n: int = 4  # main.py --context-gram-n: candidate length (capped at branch_len - 1)
    max_pad_len: int = 2  # main.py --max-pad-len: perturbation prefix of 1..max_pad_len prompt tokens
    context_cache_size: int = 10  # ContextCache max_val_len: n-grams per key (LRU)
    keep_num: int = 2  # main.py --keep-num: n-grams per key kept when the cache is cut between prompts
    flush_interval: int = 2  # main.py --flush-interval: prompts between cuts (0 = never cut)
    # static corpus cache (the repo ships an OANC table we cannot fetch offline): a text file, or a self-distillation
    # corpus bundle (corpus.npz of `python -m pipeline.train.corpus`: its answers' token ids, one document each;
    # relative paths also resolve among the shipped assets, e.g. corpus/smollm2-135m/corpus.npz); None = off
    corpus_path: Optional[str] = None
    corpus_max_key_len: int = 4  # main.py --max-key-len: corpus keys of 4..1 tokens (back-off)
    corpus_candidates: int = 3  # drafts.py retrieve_drafts: at most 3 corpus n-grams per step
    corpus_top_k: int = 20  # CorpusCache.sort_cache_by_freq(topk=20)
    corpus_min_count: int = 6  # seen at least 6 times: the shipped clean-5 cache (CorpusCache.clean(5): > 5)
    seed: int = 10  # self_draft_greedy_search: random.seed(10) before the prefixes are drawn

    def __post_init__(self) -> None:
        check_range("method.branch_len", self.branch_len, 3)
        check_range("method.branch_num", self.branch_num, 1)
        check_range("method.context_gram_n", self.context_gram_n, 1)
        check_range("method.max_pad_len", self.max_pad_len, 1)
        check_range("method.context_cache_size", self.context_cache_size, 0)
        check_range("method.keep_num", self.keep_num, 0)
        check_range("method.flush_interval", self.flush_interval, 0)
        check_range("method.corpus_candidates", self.corpus_candidates, 0)
        if self.corpus_path is not None and corpus_file(self.corpus_path) is None:
            raise ConfigError(f"method.corpus_path={self.corpus_path!r}: file not found")


def corpus_file(location: str) -> Path | None:
    from pipeline.resources import ASSETS

    return next((p for p in (Path(location).expanduser(), ASSETS / location) if p.is_file()), None)


def corpus_documents(path: Path, tokenizer) -> list[list[int]]:
    """The static cache's token sequences: a corpus bundle's answers (already the target's tokens), or
    a text file tokenised as one document."""
    if path.suffix == ".npz":
        from pipeline.train.corpus import load_corpus

        return [s["ids"][s["prompt_len"]:].tolist() for s in load_corpus(str(path))]
    return [tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)]


def corpus_table(path: Path, tokenizer, gram_n: int, cfg) -> CorpusNGrams:
    """The static table of a corpus file, built once and cached by the file's digest and the table's
    settings (a 2 M-token corpus takes ~40 s to count on a CPU)."""
    import hashlib
    import pickle

    from pipeline.models import cache_root

    settings = (gram_n, cfg.corpus_max_key_len, cfg.corpus_top_k, cfg.corpus_min_count,
                getattr(tokenizer, "name_or_path", None) if path.suffix != ".npz" else None)
    digest = hashlib.sha1(path.read_bytes() + repr(settings).encode()).hexdigest()[:16]
    cached = cache_root() / "ngram_tables" / f"{path.stem}-{digest}.pkl"
    if cached.is_file():
        return pickle.loads(cached.read_bytes())
    table = CorpusNGrams(corpus_documents(path, tokenizer), gram_n, cfg.corpus_max_key_len, cfg.corpus_top_k,
                         cfg.corpus_min_count)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(table))
    tmp.replace(cached)
    return table


class SelfDraft(Method):
    name = "self_draft"

    def setup(self, target) -> None:
        cfg = self.config
        self.gram_n = min(cfg.context_gram_n, cfg.branch_len - 1)
        self.cache = NGramPool(cfg.context_cache_size)  # shared by the prompts of a run, as in the repo
        self.prompts_begun = 0
        self.corpus = None
        if cfg.corpus_path:
            self.corpus = corpus_table(corpus_file(cfg.corpus_path), target.tokenizer, self.gram_n, cfg)

    def begin(self, state: DecodeState) -> None:
        cfg = self.config
        if not hasattr(self, "cache"):
            self.setup(state.target)
        self.prompts_begun += 1
        if cfg.flush_interval and self.prompts_begun % cfg.flush_interval == 0:
            self.cache.keep_recent(cfg.keep_num)
        rng = random.Random(cfg.seed)
        prompt = state.prompt_ids
        # branch_num + branch_len - 3 prefixes; the first branch_len - 2 (dropped during warm-up) get one token
        self.prefixes = [[rng.choice(prompt) for _ in range(rng.randint(1, cfg.max_pad_len))]
                         for _ in range(cfg.branch_num + cfg.branch_len - 3)]
        for i in range(min(cfg.branch_len - 2, len(self.prefixes))):
            self.prefixes[i] = self.prefixes[i][:1]
        self.levels: list[list[int]] = []  # levels 1..; once filled, column c >= 1 uses prefixes[c - 1]
        self.text_mark = 0  # committed text before this index was already harvested into the cache

    @property
    def warm(self) -> bool:
        return len(self.levels) == self.config.branch_len - 2

    def propose(self, state: DecodeState) -> Proposal:
        layout, self.column_rows = branch_layout(tuple(map(len, self.prefixes)), tuple(map(len, self.levels)))
        tree = TokenTree.root_only(state.root)
        if self.warm:
            tree = candidate_tree(state.root, self.candidates(state.sequence))
        state.stats.add_extra("forward_rows", len(tree) + len(layout.depths))
        tokens = [tok for row in (*self.prefixes, *self.levels) for tok in row]  # the layout's order
        # the argmax of the root row and of the branches' rows (also at T > 0), read in the acceptance's host copy;
        # not the other tree rows', which the greedy acceptance takes itself
        tree_rows = len(tree)
        return layout.proposal(tree, tokens, reads=lambda output: (row_argmax(output.logits[:1]),
                                                                   row_argmax(output.logits[tree_rows:])))

    def candidates(self, sequence: list[int]) -> list[tuple[int, ...]]:
        cfg = self.config
        found = list(dict.fromkeys(self.cache.get(sequence[-1], cfg.context_cache_size)))
        if self.corpus is not None and cfg.corpus_candidates:
            room = cfg.context_cache_size - len(found)
            limit = 2 if room == 0 else min(cfg.corpus_candidates, room)  # retrieve_drafts
            found += self.corpus.get(sequence, limit, exclude=found)
        return found

    def observe(self, state: DecodeState, result: StepResult) -> None:
        (root_next,), out = result.reads  # the argmax of the root row and of the branches' rows (propose)
        if not self.levels:  # first step: level 1 = the prediction after each prefix
            self.levels = [[out[rows[-1]] for rows in self.column_rows]]
            self.prefixes.pop(0)  # column 0 is now the root's own column
        elif not self.warm:
            self.prefixes.pop(0)
            last = [out[rows[-1]] for rows in self.column_rows]
            self.levels = [lv[1:] for lv in self.levels] + [last[1:]]
        else:
            self.update_cache(state, result, out, root_next)
            last = [out[rows[-1]] for rows in self.column_rows]
            for c, prefix in enumerate(self.prefixes, start=1):  # each prefix slides along its column
                prefix.append(self.levels[0][c])
                prefix.pop(0)
            self.levels = [*self.levels[1:], last]

    def update_cache(self, state: DecodeState, result: StepResult, out: list[int], root_next: int) -> None:
        g = self.gram_n
        chains = []  # (column inputs, outputs at those rows), columns >= 1, aligned at the bottom
        for c in range(1, len(self.column_rows)):
            rows = self.column_rows[c]
            chains.append(([*self.prefixes[c - 1], *(lv[c] for lv in self.levels)], [out[r] for r in rows]))
        col0 = [out[r] for r in self.column_rows[0]]
        branches = [[*inputs, outs[-1]] for inputs, outs in chains] + [[*(lv[0] for lv in self.levels), col0[-1]]]
        longest = max((len(inputs) for inputs, _ in chains), default=0)
        for r in range(longest - g + 1):  # every window of every column, row-major as in the repo
            for inputs, outs in chains:
                start = r - (longest - len(inputs))
                if start >= 0:
                    self.cache.add(inputs[start], (*inputs[start + 1:start + g], outs[start + g - 1]))
        # the committed text, continued by column 0's chain; the token after slot j is the text
        # when committed, else the output of the row before it (root row, then column 0's levels)
        text = state.sequence[:len(state.sequence) - len(result.committed)]
        extended = text + [lv[0] for lv in self.levels]
        following = [root_next] + col0
        for i in range(max(0, self.text_mark - g - 1), len(extended) - g + 1):
            nxt = i + g
            last = extended[nxt] if nxt < len(text) else following[nxt - len(text)]
            self.cache.add(extended[i], (*extended[i + 1:nxt], last))
        self.text_mark = len(text)
        record_redundancy(state.stats, *bigram_redundancy(branches))


@functools.lru_cache(maxsize=256)
def branch_layout(prefix_lengths: tuple[int, ...],
                  level_lengths: tuple[int, ...]) -> tuple[AuxLayout, tuple[tuple[int, ...], ...]]:
    """The branches' rows (the prefixes' tokens, then the levels', in that order) and each column's rows: every
    prefix is a causal chain from depth 1; once levels exist, column 0 is the root's own and column c >= 1
    continues prefix c - 1; level l of column c sits after the column's prefix and sees the rows above it. One
    shape per prompt's prefixes and warm-up step (shared by every caller: tuples, and a read-only array)."""
    aux = AuxRows()
    prefix_rows = [aux.add_chain([0] * n, 1) for n in prefix_lengths]
    columns = [[], *prefix_rows] if level_lengths else prefix_rows
    offsets = [0, *prefix_lengths] if level_lengths else list(prefix_lengths)
    column_rows = [list(rows) for rows in columns]
    for level_index, length in enumerate(level_lengths, start=1):
        for c in range(length):
            column_rows[c].append(aux.add(0, offsets[c] + level_index, column_rows[c]))
    return aux.layout(), tuple(map(tuple, column_rows))


CONFIG = SelfDraftConfig
