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
