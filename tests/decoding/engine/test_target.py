"""Tree attention and KV compaction on tiny llama and qwen3 models."""

import pytest
import torch

from decoding.engine.tree import TokenTree


def sequential_logits(target, ids: list[int]) -> torch.Tensor:
    """Reference: plain causal forward of a sequence, no cache tricks."""
    with torch.inference_mode():
        return target.model(torch.tensor([ids])).logits[0].float()


def test_tree_forward_equals_sequential_forward_of_each_root_path(tiny_target):
    prefix = [10, 11, 12, 13, 14]
    tree = TokenTree.from_sequences(15, [[20, 21, 22], [20, 23], [24, 25], [26]])
    target = tiny_target
    target.prefill(prefix)
    out = target.forward_tree(tree)
    for node in range(len(tree)):
        path_tokens = [tree.tokens[i] for i in tree.path_to(node)]
        ref = sequential_logits(target, prefix + path_tokens)[-1]
        torch.testing.assert_close(out.logits[node], ref, atol=1e-4, rtol=1e-4)


def test_hidden_states_of_chosen_layers_match_full_forward(tiny_target):
    target = tiny_target
    ids = [10, 11, 12, 13]
    target.prefill(ids[:-1])
    out = target.forward(torch.tensor(ids[-1:]), torch.tensor([0]), None, hidden_layers=(0, 2))
    with torch.inference_mode():
        full = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(out.hidden[0][-1], full[1][0, -1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.hidden[2][-1], full[3][0, -1], atol=1e-4, rtol=1e-4)


def test_keep_rows_then_continued_decoding_equals_fresh_forward(tiny_target):
    target = tiny_target
    prefix = [10, 11, 12, 13]
    tree = TokenTree.from_sequences(14, [[30, 31], [32, 33, 34], [35]])
    target.prefill(prefix)
    target.forward_tree(tree)
    accepted = tree.path_to(6)  # root -> 35: block rows 0 and 6, a non-contiguous set
    target.keep_rows(len(prefix), accepted)
    kept_tokens = prefix + [tree.tokens[i] for i in accepted]
    assert target.cache_len == len(kept_tokens)
    nxt = [40, 41]
    out = target.forward(torch.tensor(nxt), torch.arange(2), None)
    ref = sequential_logits(target, kept_tokens + nxt)[-2:]
    torch.testing.assert_close(out.logits, ref, atol=1e-4, rtol=1e-4)


def test_truncate_drops_a_suffix(tiny_target):
    target = tiny_target
    target.prefill([10, 11, 12, 13, 14, 15])
    target.truncate(3)
    assert target.cache_len == 3
    out = target.forward(torch.tensor([20]), torch.tensor([0]), None)
    ref = sequential_logits(target, [10, 11, 12, 20])[-1]
    torch.testing.assert_close(out.logits[0], ref, atol=1e-4, rtol=1e-4)


def test_restore_returns_to_a_snapshot_after_the_cache_was_cut_and_overwritten(tiny_target):
    """The KV buffer is written in place, so a snapshot must be a copy; each restore is a fresh copy."""
    target = tiny_target
    target.prefill([10, 11, 12, 13, 14, 15])
    snapshot = target.snapshot()
    ref = sequential_logits(target, [10, 11, 12, 13, 14, 15, 20])[-1]
    for _ in range(2):
        target.truncate(2)
        target.forward(torch.tensor([30, 31, 32, 33]), torch.arange(4), None)  # overwrites rows 2-5 of the buffer
        target.restore(snapshot)
        assert target.cache_len == 6
        out = target.forward(torch.tensor([20]), torch.tensor([0]), None)
        torch.testing.assert_close(out.logits[0], ref, atol=1e-4, rtol=1e-4)


def test_a_cut_below_a_sliding_window_is_refused_once_keys_left_it():
    from pipeline.zoo import random_target

    assert can_cut_after(random_target("tiny", arch="llama"), 20, 3)  # no sliding layer: any cut is exact
    gemma = random_target("tiny", arch="gemma3")  # 8-token windows: a sliding layer keeps the last 7 keys
    assert can_cut_after(gemma, 7, 2) and can_cut_after(gemma, 20, 20) and can_cut_after(gemma, 20, 17, after=17)
    assert not can_cut_after(gemma, 20, 19) and not can_cut_after(gemma, 20, 16, after=17)
    assert can_cut_after(gemma, 20, 3, cut=False)  # after a forward, before any cut: it holds every key
    gemma.truncate(20)  # keys of positions 13-19 kept
    with pytest.raises(ValueError, match="cannot cut a sliding layer"):
        gemma.truncate(16)  # would leave 3 of the 7 keys the next token sees, without a word


def can_cut_after(target, cached: int, length: int, cut: bool = True, after: int | None = None) -> bool:
    """Whether `target` can cut to `length` after a forward of `cached` tokens, then (`cut`) a cut to
    `cached` as prefill leaves it (a sliding layer back to its window), or to `after`."""
    target.reset()
    target.forward(torch.arange(3, 3 + cached), torch.arange(cached), None)
    if cut:
        target.truncate(cached if after is None else after)
    return target.can_cut_to(length)
