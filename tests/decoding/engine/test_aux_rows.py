"""Aux rows: positions and visibility of unverified rows that share the verification forward."""

import torch

from decoding.engine.aux_rows import AuxRows
from decoding.engine.loop import forward_proposal
from decoding.engine.tree import TokenTree


def test_visible_marks_root_self_and_listed_rows():
    aux = AuxRows()
    a, b = aux.add_chain([10, 11], first_depth=1)
    c = aux.add(12, 2, [a])
    vis = aux.visible(n_tree=3)  # tree rows 0..2, aux rows 3..5
    assert vis.shape == (3, 6)
    assert vis[0].tolist() == [True, False, False, True, False, False]
    assert vis[1].tolist() == [True, False, False, True, True, False]
    assert vis[2].tolist() == [True, False, False, True, False, True]
    assert aux.depths == [1, 2, 2] and (a, b, c) == (0, 1, 2)


def test_aux_rows_see_what_an_equivalent_causal_chain_sees(tiny_target):
    """An aux row's logits equal those of the same tokens run as a plain chain after the root."""
    prompt = [7, 30, 31, 32, 33]
    tiny_target.prefill(prompt[:-1])
    aux = AuxRows()
    aux.add_chain([40, 41], first_depth=1)
    aux.add(50, 1)  # a sibling branch: must not see 40/41
    tree = TokenTree.from_sequences(prompt[-1], [[60, 61]])
    out = forward_proposal(tiny_target, aux.proposal(tree))
    logits = out.logits[len(tree):]
    for tokens, row in (([40, 41], 1), ([50], 2)):
        tiny_target.prefill(prompt[:-1])
        chain = tiny_target.forward(torch.tensor([prompt[-1], *tokens]), torch.arange(len(tokens) + 1), None)
        assert torch.allclose(chain.logits[-1], logits[row], atol=1e-4)


def test_a_layout_filled_with_tokens_is_the_proposal_of_the_rows_it_came_from():
    """AuxLayout (the rows' depths and visibility without tokens, built once per shape by Lookahead and
    Self-Draft) gives the proposal AuxRows gives for the same rows, and refuses a token count of another shape."""
    import pytest

    aux = AuxRows()
    a, b = aux.add_chain([10, 11], first_depth=1)
    aux.add(12, 2, [a])
    aux.add(13, 3, [a, b])
    tree = TokenTree.from_sequences(5, [[6, 7], [8]])  # 4 rows: the root, 6, 7, 8
    layout = aux.layout()
    got = layout.proposal(tree, [20, 21, 22, 23])  # the same rows, other tokens
    assert (got.aux_tokens, got.aux_depths) == ([20, 21, 22, 23], [1, 2, 2, 3])
    root, none = [True], [False] * 3  # the root's column, then the tree's drafts (never seen)
    want = [root + none + [True, False, False, False],  # row a: itself
            root + none + [True, True, False, False],  # row b: a, itself
            root + none + [True, False, True, False],  # row 12: a, itself
            root + none + [True, True, False, True]]  # row 13: a, b, itself
    assert got.aux_visible.tolist() == want
    assert aux.proposal(tree).aux_visible.tolist() == want and aux.proposal(tree).aux_tokens == [10, 11, 12, 13]
    with pytest.raises(ValueError, match="3 tokens for an aux layout of 4 rows"):
        layout.proposal(tree, [10, 11, 12])
    with pytest.raises(ValueError):  # shared by every step of its shape: not writable
        layout.sees[0, 1] = True
