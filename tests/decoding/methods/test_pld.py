from decoding.methods.ar import AR
from decoding.engine.loop import generate
from decoding.methods.pld import PLDConfig, PromptLookup


def test_lookup_takes_most_recent_longest_match():
    m = PromptLookup(PLDConfig(max_ngram_size=2, num_draft_tokens=3))
    assert m.lookup([1, 2, 3, 9, 1, 2, 4, 5, 6, 1, 2]) == [4, 5, 6]
    assert m.lookup([5, 6, 7]) == []


def reference_lookup(seq, max_ngram_size, num_pred_tokens):
    """apoorvumang/prompt-lookup-decoding's find_candidate_pred_tokens, restated on a list."""
    n_in = len(seq)
    for n in range(max_ngram_size, 0, -1):
        for idx in range(n_in - n + 1):
            if seq[idx:idx + n] == seq[-n:]:
                start, end = idx + n, idx + n + num_pred_tokens
                if end <= n_in and start < n_in - n:
                    return seq[start:end]
    return []


def test_reference_match_takes_the_earliest_full_continuation():
    m = PromptLookup(PLDConfig(max_ngram_size=2, num_draft_tokens=3, match="reference"))
    seq = [1, 2, 3, 9, 8, 1, 2, 4, 5, 6, 1, 2]
    assert m.lookup(seq) == [3, 9, 8]  # earliest, where "recent" drafts [4, 5, 6]
    assert PromptLookup(PLDConfig(max_ngram_size=2, num_draft_tokens=3)).lookup(seq) == [4, 5, 6]
    # the only earlier match has 3 of the 4 tokens after it: "recent" drafts them, the reference rule nothing
    short = [4, 1, 2, 7, 1, 2]
    assert PromptLookup(PLDConfig(max_ngram_size=2, num_draft_tokens=4)).lookup(short) == [7, 1, 2]
    full = PromptLookup(PLDConfig(max_ngram_size=2, num_draft_tokens=4, match="reference"))
    assert full.lookup(short) == reference_lookup(short, 2, 4) == []
    import random

    rng = random.Random(0)
    for _ in range(300):  # the same drafts as the reference on random small-alphabet sequences
        seq = [rng.randrange(4) for _ in range(rng.randrange(2, 30))]
        k, n = rng.randrange(1, 6), rng.randrange(1, 4)
        ours = PromptLookup(PLDConfig(max_ngram_size=n, num_draft_tokens=k, match="reference")).lookup(seq)
        assert ours == reference_lookup(seq, min(n, len(seq) - 1), k), seq


def test_an_unknown_match_rule_is_one_line():
    import pytest

    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="method.match='earliest' is not allowed"):
        PLDConfig(match="earliest")


def test_greedy_equals_ar(tiny_target):
    prompt = [7, 30, 31, 32, 30, 31, 32, 30, 31]
    ar = generate(AR(), tiny_target, prompt, max_new_tokens=48).new_tokens
    for config in (PLDConfig(), PLDConfig(match="reference")):
        state = generate(PromptLookup(config), tiny_target, prompt, max_new_tokens=48)
        assert state.new_tokens == ar
        assert state.stats.num_draft_tokens > 0


def test_sampling_is_lossless_in_distribution_of_first_tokens(tiny_llama):
    """T=1: the empirical distribution of the first two generated tokens matches AR sampling."""
    import collections

    from scipy.stats import chi2_contingency

    prompt = [7, 30, 31, 30, 31, 30]
    n = 300
    counts = []
    for method in (AR(), PromptLookup(PLDConfig())):
        c = collections.Counter(
            tuple(generate(method, tiny_llama, prompt, max_new_tokens=2, temperature=1.0, seed=s).new_tokens[:1])
            for s in range(n))
        counts.append(c)
    keys = sorted(set(counts[0]) | set(counts[1]), key=lambda k: -(counts[0][k] + counts[1][k]))[:6]
    table = [[c[k] for k in keys] + [n - sum(c[k] for k in keys)] for c in counts]
    assert chi2_contingency(table).pvalue > 1e-3
