"""The n-gram pool (Lookahead's token map / Self-Draft's context cache), candidate tries, the
corpus table and the redundancy measure."""

from decoding.drafting.ngram_pool import CorpusNGrams, NGramPool, bigram_redundancy, candidate_tree


def test_pool_is_lru_per_key_with_cap():
    pool = NGramPool(cap=2)
    pool.add(1, (2, 3))
    pool.add(1, (4, 5))
    pool.add(1, (2, 3))  # refresh: moves to the end
    pool.add(1, (6, 7))  # full: drops the least recently used, (4, 5)
    assert pool.get(1) == [(2, 3), (6, 7)]
    assert pool.get(1, limit=1) == [(6, 7)] and pool.get(9) == []
    pool.keep_recent(1)
    assert pool.get(1) == [(6, 7)]


def test_add_text_takes_every_key_and_following_tokens():
    pool = NGramPool(cap=5)
    pool.add_text([1, 2, 3, 1, 2, 4], length=2)
    assert pool.get(1) == [(2, 3), (2, 4)] and pool.get(2) == [(3, 1)] and pool.get(3) == [(1, 2)]


def test_candidate_tree_dedups_prefixes_and_respects_budget():
    tree = candidate_tree(0, [(1, 2, 3), (1, 2, 4), (5, 6, 7)])
    assert tree.tokens == [0, 1, 2, 3, 4, 5, 6, 7] and tree.parents == [-1, 0, 1, 2, 2, 0, 5, 6]
    cut = candidate_tree(0, [(1, 2, 3), (1, 2, 4), (5, 6, 7)], max_nodes=5)
    assert cut.tokens == [0, 1, 2, 3, 4, 5] and cut.num_draft_nodes() == 5
    assert len(candidate_tree(0, [(1, 2)], max_nodes=0)) == 1


def test_corpus_table_backs_off_from_longest_key_and_drops_rare_ngrams():
    text = [1, 2, 3, 4] * 3 + [9, 2, 7, 7]
    corpus = CorpusNGrams(text, length=2, max_key_len=2, top_k=5, min_count=2)
    assert corpus.get([5, 1, 2], limit=3) == [(3, 4)]  # key (1, 2) then (2,): (7, 7) is seen once
    assert corpus.get([9, 9], limit=3) == []
    assert corpus.get([1, 2], limit=3, exclude=[(3, 4)]) == []


def test_corpus_table_never_joins_two_documents():
    one = CorpusNGrams([[1, 2, 3]] * 2 + [[4, 5]], length=1, max_key_len=1, top_k=5, min_count=2)
    assert one.get([2], limit=3) == [(3,)]
    assert one.get([3], limit=3) == []  # as one concatenated text, 3 -> 1 would have been seen twice
    import numpy as np

    flat = CorpusNGrams(np.array([1, 2, 3] * 3, dtype=np.int32), length=1, max_key_len=1, top_k=5, min_count=2)
    assert flat.get([3], limit=3) == [(1,)]  # one array is one document


def test_corpus_table_equals_counting_every_window():
    """The numpy count gives Self-Draft's CorpusCache table: per key the top_k most frequent grams seen
    at least min_count times, ties in order of first occurrence (Counter.most_common)."""
    import random
    from collections import Counter

    rng = random.Random(0)
    docs = [[rng.randrange(5) for _ in range(rng.randint(0, 60))] for _ in range(30)]
    got = CorpusNGrams(docs, length=2, max_key_len=3, top_k=3, min_count=2).table
    want = {}
    for key_len in range(1, 4):
        counts = {}
        for ids in docs:
            for i in range(len(ids) - key_len - 2 + 1):
                counts.setdefault(tuple(ids[i:i + key_len]), Counter())[tuple(ids[i + key_len:i + key_len + 2])] += 1
        for key, counter in counts.items():
            frequent = [g for g, c in counter.most_common(3) if c >= 2]
            if frequent:
                want[key] = frequent
    assert got == want


def test_bigram_redundancy_counts_repeats_across_branches_and_tree_edges_once():
    assert bigram_redundancy([(1, 2, 3), (1, 2, 4)]) == (4, 1)
    assert bigram_redundancy([(1, 2, 3), (5, 6, 7)]) == (4, 0)
    assert bigram_redundancy([], [(1, 2), (2, 3), (1, 2)]) == (3, 1)
