import pytest
import torch

from decoding.engine.tree import TokenTree


def test_from_sequences_shares_prefixes_in_first_seen_order():
    tree = TokenTree.from_sequences(7, [[1, 2, 3], [1, 2, 4], [5], [1, 9]])
    assert tree.tokens == [7, 1, 2, 3, 4, 5, 9]
    assert tree.parents == [-1, 0, 1, 2, 2, 0, 1]
    assert tree.depths == [0, 1, 2, 3, 3, 1, 2]
    assert tree.children[0] == [1, 5] and tree.children[2] == [3, 4]
    assert tree.path_to(4) == [0, 1, 2, 4]


def test_ancestor_mask_is_ancestors_and_self():
    tree = TokenTree.from_sequences(0, [[1, 2], [3]])
    expected = torch.tensor([
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree.ancestor_mask(), expected)


def test_chain_and_root_only():
    assert TokenTree.chain(5, [6, 7]).parents == [-1, 0, 1]
    assert TokenTree.root_only(3).num_draft_nodes() == 0


@pytest.mark.parametrize("parents", [[0, 0], [-1, 1], [-1, 2, 0]])
def test_rejects_malformed_parents(parents):
    with pytest.raises(ValueError):
        TokenTree(list(range(len(parents))), parents)
