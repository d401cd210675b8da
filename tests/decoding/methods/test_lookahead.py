"""Lookahead Decoding: the 2D window layout of the published mask, warm-up, the n-gram pool, and
the full-match rule (a fully matched candidate yields all N-1 tokens). Losslessness against AR is
tested for all endogenous methods in test_endogenous.py."""

import pytest

from decoding.methods.ar import AR
from decoding.engine.loop import DecodeState, generate
from decoding.methods.lookahead import Lookahead, LookaheadConfig
from pipeline.errors import ConfigError


def test_window_rows_form_contiguous_position_chains(tiny_llama):
    """lade's j_make_causal_mask_multilevel: level l, column i sees block 0 up to column i and
    column i of levels 1..l, i.e. exactly one row at every position p..p+l+i."""
    m = Lookahead(LookaheadConfig(ngram_size=4, window_size=3, guess_set_size=3))
    state = DecodeState(tiny_llama, [7, 8, 9], 0.0, 10, set(), 0)
    m.begin(state)
    m.levels = [[11, 12], [21, 22, 23], [31, 32, 33]]  # a filled N=4, W=3 window
    proposal = m.propose(state)
    n_tree = len(proposal.tree)
    assert proposal.aux_tokens == [11, 12, 21, 22, 23, 31, 32, 33]
    assert proposal.aux_depths == [1, 2, 1, 2, 3, 2, 3, 4]
    for row, depth in enumerate(proposal.aux_depths):
        seen = [0] + [j for j in range(len(proposal.aux_tokens)) if proposal.aux_visible[row, n_tree + j]]
        seen_depths = [0] + [proposal.aux_depths[j] for j in seen[1:]]
        assert sorted(seen_depths) == list(range(depth + 1)), (row, seen_depths)
    # level 2, column 1 (token 32) sees block 0 up to column 1 (root, 11) and level 1 column 1 (22)
    row32 = proposal.aux_tokens.index(32)
    assert [proposal.aux_tokens[j] for j in range(8) if proposal.aux_visible[row32, n_tree + j]] == [11, 22, 32]


def test_warm_up_fills_one_level_per_step_and_verifies_nothing(tiny_llama):
    cfg = LookaheadConfig(ngram_size=5, window_size=4, guess_set_size=4, pool_from_prompt=True)
    m = Lookahead(cfg)
    sizes, tree_sizes = [], []
    original_propose = m.propose

    def spy(state):
        p = original_propose(state)
        sizes.append([len(lv) for lv in m.levels])
        tree_sizes.append(len(p.tree))
        return p

    m.propose = spy
    generate(m, tiny_llama, [7, 30, 31, 30, 31, 30, 31], max_new_tokens=6)
    w, n = cfg.window_size, cfg.ngram_size
    assert sizes[0] == [w + n - 3] and sizes[1] == [w + n - 4, w + n - 3] and sizes[2] == [w + n - 5] + [w + n - 4] * 2
    assert sizes[3] == [w - 1] + [w] * (n - 2)  # filled after N-2 steps
    assert tree_sizes[:3] == [1, 1, 1]  # no verification branch during warm-up


def test_full_match_yields_all_n_minus_1_tokens_plus_bonus(tiny_llama):
    prompt = [7, 30, 31, 32]
    ar = generate(AR(), tiny_llama, prompt, max_new_tokens=6).new_tokens
    m = Lookahead(LookaheadConfig(ngram_size=4, window_size=3, guess_set_size=3))
    state = DecodeState(tiny_llama, prompt, 0.0, 10, set(), 0)
    tiny_llama.prefill(prompt[:-1])
    m.begin(state)
    m.levels = [[40, 41], [42, 43, 44], [45, 46, 47]]  # a filled window
    m.pool.add(prompt[-1], (99, 98, 97))
    m.pool.add(prompt[-1], tuple(ar[:3]))
    m.step(state)
    assert state.new_tokens == ar[:4]  # N-1 = 3 drafted + the bonus
    assert state.stats.num_accepted_tokens == 3


def test_pool_harvests_each_columns_diagonal_keyed_by_its_first_token(tiny_llama):
    m = Lookahead(LookaheadConfig(ngram_size=4, window_size=3, guess_set_size=7))
    generate(m, tiny_llama, [7, 30, 31, 32], max_new_tokens=12)
    assert len(m.pool) > 0
    assert all(len(g) == 3 for grams in m.pool.table.values() for g in grams)


def test_a_zero_guess_set_runs_the_jacobi_window_alone_and_matches_ar(tiny_llama):
    """G = 0 (lade: verify nothing, keep no map) used to crash at the first harvest (an LRU drop from an
    empty list); Self-Draft's context_cache_size = 0 shares the pool."""
    from decoding.methods.self_draft import SelfDraft, SelfDraftConfig

    prompt = [7, 30, 31, 32]
    ar = generate(AR(), tiny_llama, prompt, max_new_tokens=12).new_tokens
    m = Lookahead(LookaheadConfig(ngram_size=4, window_size=3, guess_set_size=0))
    assert generate(m, tiny_llama, prompt, max_new_tokens=12).new_tokens == ar
    assert len(m.pool) == 0
    s = SelfDraft(SelfDraftConfig(branch_len=4, branch_num=3, context_cache_size=0))
    assert generate(s, tiny_llama, prompt, max_new_tokens=12).new_tokens == ar


@pytest.mark.parametrize("field, value", [("ngram_size", 2), ("window_size", 0), ("guess_set_size", -1)])
def test_bad_values_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=f"method.{field}"):
        LookaheadConfig(**{field: value})
