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


@pytest.mark.parametrize("size, seed", [(10, 0), (64, 1), (65, 2), (300, 3), (1025, 4)])
def test_ancestor_mask_of_small_and_large_trees_is_every_root_path(size, seed):
    """Row by row and level by level (large shallow trees) both give each node's root path."""
    from decoding.engine.tree import ancestors_by_levels, ancestors_by_rows

    gen = torch.Generator().manual_seed(seed)
    # a wide part (parents among the first few nodes) and a deep part (parents anywhere before)
    parents = [-1] + [int(torch.randint(0, i if i % 3 else min(i, 4), (1,), generator=gen)) for i in range(1, size)]
    tree = TokenTree(list(range(size)), parents)
    for mask in (tree.ancestor_array(), ancestors_by_rows(parents), ancestors_by_levels(parents)):
        for node in range(size):
            assert set(mask[node].nonzero()[0].tolist()) == set(tree.path_to(node))
    assert tree.parents == parents and parents[0] == -1  # not changed by the level-by-level climb
    chain = list(range(-1, 199))
    want = torch.tril(torch.ones(200, 200, dtype=torch.bool)).numpy()
    assert (TokenTree(list(range(200)), chain).ancestor_array() == want).all()
    assert (ancestors_by_levels(chain) == want).all()


def test_chain_and_root_only():
    assert TokenTree.chain(5, [6, 7]).parents == [-1, 0, 1]
    assert TokenTree.root_only(3).num_draft_nodes() == 0


@pytest.mark.parametrize("parents", [[0, 0], [-1, 1], [-1, 2, 0]])
def test_rejects_malformed_parents(parents):
    with pytest.raises(ValueError):
        TokenTree(list(range(len(parents))), parents)
