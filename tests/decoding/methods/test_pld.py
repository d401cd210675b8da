from decoding.methods.ar import AR
from decoding.engine.loop import generate
from decoding.methods.pld import PLDConfig, PromptLookup


def test_lookup_takes_most_recent_longest_match():
    m = PromptLookup(PLDConfig(max_ngram_size=2, num_draft_tokens=3))
    assert m.lookup([1, 2, 3, 9, 1, 2, 4, 5, 6, 1, 2]) == [4, 5, 6]
    assert m.lookup([5, 6, 7]) == []


def test_greedy_equals_ar(tiny_target):
    prompt = [7, 30, 31, 32, 30, 31, 32, 30, 31]
    ar = generate(AR(), tiny_target, prompt, max_new_tokens=48).new_tokens
    state = generate(PromptLookup(PLDConfig()), tiny_target, prompt, max_new_tokens=48)
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
