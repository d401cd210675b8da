"""Self-Draft: perturbed, mutually invisible Jacobi columns, the context cache (filled from the
columns and the committed text, carried across prompts and cut), and the static corpus cache.
Losslessness against AR: test_endogenous.py."""

import pytest
import torch

from decoding.engine.loop import DecodeState, generate
from decoding.methods.self_draft import SelfDraft, SelfDraftConfig
from pipeline.errors import ConfigError


def warm(method, target, prompt):
    state = DecodeState(target, prompt, 0.0, 40, set(), 0)
    target.prefill(prompt[:-1])
    method.begin(state)
    while not method.warm:
        method.step(state)
    return state


def test_columns_see_only_the_root_their_prefix_and_their_own_levels(tiny_llama):
    m = SelfDraft(SelfDraftConfig(branch_len=4, branch_num=3, max_pad_len=2))
    state = warm(m, tiny_llama, [7, 30, 31, 32, 33])
    assert len(m.prefixes) == 2 and all(len(lv) == 3 for lv in m.levels) and len(m.levels) == 2
    proposal = m.propose(state)
    n_tree = len(proposal.tree)
    for c, rows in enumerate(m.column_rows):
        for k, row in enumerate(rows):
            seen = [j for j in range(len(proposal.aux_tokens)) if proposal.aux_visible[row, n_tree + j]]
            assert seen == list(rows[: k + 1])  # its own column only, causally
            assert proposal.aux_depths[row] == k + 1  # prefix at p+1.., then levels right after it
    assert proposal.aux_tokens[m.column_rows[1][0]] == m.prefixes[0][0]
    # each column's rows hold its prefix (column 0: none, the root's own), then its token of every level
    for c, rows in enumerate(m.column_rows):
        prefix = m.prefixes[c - 1] if c else []
        assert [proposal.aux_tokens[r] for r in rows] == [*prefix, *(lv[c] for lv in m.levels)]


def test_prefixes_slide_along_their_column_and_levels_move_up(tiny_llama):
    m = SelfDraft(SelfDraftConfig(branch_len=4, branch_num=3, max_pad_len=2))
    state = warm(m, tiny_llama, [7, 30, 31, 32, 33])
    prefixes = [list(a) for a in m.prefixes]
    levels = [list(lv) for lv in m.levels]
    m.step(state)
    for c, before in enumerate(prefixes, start=1):
        assert m.prefixes[c - 1] == [*before[1:], levels[0][c]]
    assert m.levels[0] == levels[1]


def test_cache_holds_gram_n_continuations_and_is_cut_between_prompts(tiny_llama):
    m = SelfDraft(SelfDraftConfig(branch_len=5, branch_num=3, context_gram_n=3, keep_num=1, flush_interval=2))
    generate(m, tiny_llama, [7, 30, 31, 32, 33], max_new_tokens=20)
    assert len(m.cache) > 0 and all(len(g) == 3 for grams in m.cache.table.values() for g in grams)
    before = len(m.cache)
    m.begin(DecodeState(tiny_llama, [7, 8], 0.0, 4, set(), 0))  # second prompt: the cache is cut to 1 per key
    assert 0 < len(m.cache) < before and all(len(v) == 1 for v in m.cache.table.values())


def test_committed_text_ngrams_enter_the_cache(tiny_llama):
    m = SelfDraft(SelfDraftConfig(branch_len=3, branch_num=2, context_gram_n=2, context_cache_size=1000))
    state = generate(m, tiny_llama, [7, 30, 31, 32, 33, 34], max_new_tokens=8)
    text = state.sequence
    for i in range(len(text) - 3):
        assert (text[i + 1], text[i + 2]) in m.cache.get(text[i])


def test_corpus_cache_adds_candidates_from_a_text_file(tiny_llama, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat. " * 20)
    m = SelfDraft(SelfDraftConfig(corpus_path=str(corpus), corpus_min_count=2, context_gram_n=4))
    m.setup(tiny_llama)
    ids = tiny_llama.tokenizer.encode("the cat", add_special_tokens=False)
    found = m.candidates(ids)
    assert tuple(tiny_llama.tokenizer.encode(" sat", add_special_tokens=False)) in found


def test_corpus_cache_reads_a_self_distillation_bundle(tiny_llama, tmp_path, monkeypatch):
    """A corpus.npz of `python -m pipeline.train.corpus`: its answers' token ids, one document each
    (the prompts are not part of the table)."""
    import numpy as np

    from pipeline.train.corpus import bundle

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    answer, prompt = [50, 51, 52, 53], [9, 9, 9, 9]
    samples = [{"ids": torch.tensor(prompt + answer), "prompt_len": len(prompt), "source": "chat"}] * 6
    path = bundle(tmp_path, samples, tiny_llama.config.vocab_size)
    m = SelfDraft(SelfDraftConfig(corpus_path=str(path), corpus_min_count=2, context_gram_n=3))
    m.setup(tiny_llama)
    assert (51, 52, 53) in m.candidates([7, 50])
    assert not m.candidates([9, 9])  # prompt tokens are not in the table
    assert np.load(path)["ids"].dtype == np.uint16
    import decoding.methods.self_draft as self_draft

    def no_counting(*args, **kwargs):
        raise AssertionError("the table should come from the cache")

    monkeypatch.setattr(self_draft, "CorpusNGrams", no_counting)
    again = SelfDraft(SelfDraftConfig(corpus_path=str(path), corpus_min_count=2, context_gram_n=3))
    again.setup(tiny_llama)  # built once, read back from the cache
    assert (51, 52, 53) in again.candidates([7, 50])


def test_missing_corpus_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="corpus_path"):
        SelfDraftConfig(corpus_path=str(tmp_path / "nope.txt"))
