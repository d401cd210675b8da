"""The n-gram pool that training-free "self-draft" methods verify from, and the redundancy measure
that compares how much their drafted branches repeat each other.

`NGramPool` is Lookahead's token map (Fu et al. 2024, `lade/decoding.py:update_token_map`) and
Self-Draft's context cache (`self_draft/cache/context_cache.py`): key token -> at most `cap`
continuations, least recently used first; inserting a present n-gram moves it to the end, inserting
into a full list drops the oldest. Candidates for a root come back as one prefix-shared trie, so
candidates that share a prefix are verified once (the engine's tree verification).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from decoding.engine.tree import TokenTree


class NGramPool:
    def __init__(self, cap: int):
        self.cap = cap  # continuations kept per key (Lookahead's G, Self-Draft's max_val_len)
        self.table: dict[int, list[tuple[int, ...]]] = {}

    def add(self, key: int, ngram: Sequence[int]) -> None:
        if self.cap <= 0:  # G = 0: Lookahead's Jacobi-only mode keeps no candidates (lade skips the map)
            return
        ngram = tuple(ngram)
        entries = self.table.setdefault(key, [])
        if ngram in entries:
            entries.remove(ngram)
        elif len(entries) >= self.cap:
            del entries[0]
        entries.append(ngram)

    def add_text(self, tokens: Sequence[int], length: int, start: int = 0) -> None:
        """Every (key, next `length` tokens) of a committed text, keys from index `start` on
        (Lookahead's POOL_FROM_PROMPT, Self-Draft's n-grams of the generated text)."""
        for i in range(max(start, 0), len(tokens) - length):
            self.add(tokens[i], tokens[i + 1:i + 1 + length])

    def get(self, key: int, limit: int | None = None) -> list[tuple[int, ...]]:
        """The `limit` most recent continuations of `key`, oldest first (the order Lookahead tries
        them in)."""
        entries = self.table.get(key, [])
        return entries[-limit:] if limit else list(entries)

    def keep_recent(self, keep: int) -> None:
        """Shrink every key to its `keep` most recent entries (Self-Draft's reduce_cache between
        prompts)."""
        self.table = {k: v[-keep:] for k, v in self.table.items() if keep > 0 and v}

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())


class CorpusNGrams:
    """A static n-gram table built from a text corpus (Self-Draft's CorpusCache): keys of 1..
    `max_key_len` tokens -> the `top_k` most frequent next-`length`-token n-grams seen more than
    `min_count - 1` times; lookup backs off from the longest key to a single token."""

    def __init__(self, token_ids: Sequence[int] | Sequence[Sequence[int]], length: int, max_key_len: int, top_k: int,
                 min_count: int):
        """`token_ids`: one token sequence, or several documents (no n-gram crosses from one to the next).
        Counted with numpy (a self-distillation corpus is millions of tokens): every window of key + gram
        tokens, unique windows with their counts and first occurrence; per key the `top_k` most frequent
        grams (ties: first seen first, as Counter.most_common) among those seen `min_count` times or more."""
        import numpy as np

        first = token_ids[0] if len(token_ids) else 0
        nested = isinstance(first, (list, tuple)) or getattr(first, "ndim", 0) > 0  # a list of documents
        documents = token_ids if nested else [token_ids]
        # one array, documents separated by -1: a window holding -1 crosses a boundary and is dropped
        parts = [np.asarray(d, dtype=np.int64) for d in documents if len(d)]
        text = np.concatenate([x for d in parts for x in (d, np.array([-1]))]) if parts else np.zeros(0, np.int64)
        self.max_key_len = max_key_len
        self.table: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for key_len in range(1, max_key_len + 1):
            width = key_len + length
            if len(text) < width:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(text, width)
            windows = windows[(windows >= 0).all(axis=1)]
            if not len(windows):
                continue
            rows, first_seen, counts = np.unique(windows, axis=0, return_index=True, return_counts=True)
            frequent = counts >= min_count
            rows, first_seen, counts = rows[frequent], first_seen[frequent], counts[frequent]
            # per key: most frequent first, then first seen (lexsort: last key is the primary one)
            order = np.lexsort((first_seen, -counts, *(rows[:, c] for c in range(key_len - 1, -1, -1))))
            for row in rows[order].tolist():
                grams = self.table.setdefault(tuple(row[:key_len]), [])
                if len(grams) < top_k:
                    grams.append(tuple(row[key_len:]))

    def get(self, context: Sequence[int], limit: int, exclude: Iterable[tuple[int, ...]] = ()) -> list[tuple[int, ...]]:
        found: list[tuple[int, ...]] = []
        skip = set(exclude)
        for key_len in range(min(self.max_key_len, len(context)), 0, -1):
            for gram in self.table.get(tuple(context[-key_len:]), []):
                if len(found) >= limit:
                    return found
                if gram not in skip:
                    found.append(gram)
                    skip.add(gram)
        return found


def candidate_tree(root: int, ngrams: Iterable[Sequence[int]], max_nodes: int | None = None) -> TokenTree:
    """The candidates as one deduplicated trie under `root`; with `max_nodes`, whole candidates are
    taken in order while they fit (a partial last one is cut to the budget)."""
    sequences = [list(g) for g in ngrams if len(g)]
    if max_nodes is None:
        return TokenTree.from_sequences(root, sequences)
    kept: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for seq in sequences:
        new = [tuple(seq[:i + 1]) for i in range(len(seq)) if tuple(seq[:i + 1]) not in seen]
        room = max_nodes - len(seen)
        if room <= 0:
            break
        if len(new) > room:
            seq = seq[:len(seq) - len(new) + room]
            new = new[:room]
        seen.update(new)
        kept.append(seq)
    return TokenTree.from_sequences(root, kept)


def bigram_redundancy(branches: Iterable[Sequence[int]], edges: Iterable[tuple[int, int]] = ()) -> tuple[int, int]:
    """(total, duplicated) bigrams over the drafted branches of one step: a bigram is duplicated
    when another branch (or the same one) already drafted it. `edges` adds (parent, child) token
    pairs of a drafted tree, each counted once (a shared prefix is drafted once, not per leaf)."""
    pairs = [pair for b in branches for pair in zip(b, b[1:])]
    pairs.extend(edges)
    return len(pairs), len(pairs) - len(set(pairs))


def record_redundancy(stats, total: int, duplicated: int) -> None:
    """Per-step redundancy counters; the run's share is draft_bigrams_duplicated / draft_bigrams."""
    stats.add_extra("draft_bigrams", total)
    stats.add_extra("draft_bigrams_duplicated", duplicated)
