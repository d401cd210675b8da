"""The depth-by-depth marginal tree (decoding/drafting/marginal_tree.py) against the node-by-node heap it
replaces for large trees: the same trees without ties, equally scored ones with ties, the same cost-aware
stop, and the same trees whatever the first read and first size."""

import numpy as np
import pytest
import torch

from decoding.drafting import marginal_tree
from decoding.drafting.draft_tree import build_best_first, marginal_expand
from decoding.drafting.marginal_tree import build_marginal_tree
from decoding.drafting.verify_cost import CostAwareStop, VerifyCostModel

COST = VerifyCostModel([0, 8, 64], [0, 1000], [[1.0, 1.05, 3.0], [1.0, 1.05, 3.0]], draft_s=0.2)


@pytest.fixture
def depth_by_depth(monkeypatch):
    """Every tree through the array builder, however small."""
    monkeypatch.setattr(marginal_tree, "HEAP_NODES", 0)


def case(seed: int):
    gen = torch.Generator().manual_seed(seed)
    depth, vocab = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 8), (2, 60)))
    logits = torch.randn(depth, vocab, generator=gen) * (0.1, 1.0, 3.0, 10.0)[seed % 4]
    if seed % 5 == 0:
        logits[:, :3] = float("-inf")  # masked tokens: never drafted
    budget = int(torch.randint(1, 80, (1,), generator=gen))
    k = int(torch.randint(1, vocab + 5, (1,), generator=gen))
    return logits, budget, k


def heap_tree(logits, budget, k, admit=None):
    return build_best_first(7, marginal_expand(logits, k, first_read=10_000), budget, len(logits), admit)


@pytest.mark.parametrize("seed", range(60))
def test_the_depth_by_depth_tree_is_the_heaps_tree(seed, depth_by_depth):
    logits, budget, k = case(seed)
    for admit in (None, "cost"):
        stop = (lambda: None) if admit is None else (lambda: CostAwareStop(COST, 100))  # the rule keeps state
        want = heap_tree(logits, budget, k, stop())
        got = build_marginal_tree(7, logits, k, budget, stop(), first_read=(1, 2, 32)[seed % 3],
                                  first_nodes=(1, 3, 100)[seed % 3])
        assert got.tree.tokens == want.tree.tokens and got.tree.parents == want.tree.parents
        assert got.stopped_early == want.stopped_early
        np.testing.assert_allclose(got.scores, want.scores, atol=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_ties_give_an_equally_scored_valid_tree(seed, depth_by_depth):
    """Rounded logits tie a lot: the two builders may pick different nodes among equals (the heap by push
    order, the arrays by a stable sort), but the score of every rank of the best-first order is the same,
    and the tree is prefix-closed with every node scored as its path."""
    logits, budget, k = case(seed)
    logits = logits.round()
    want = heap_tree(logits, budget, k)
    got = build_marginal_tree(7, logits, k, budget)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-6)
    logprobs = torch.log_softmax(logits, -1)
    tree = got.tree
    for node in range(1, len(tree)):
        path = tree.path_to(node)[1:]
        assert got.scores[node] == pytest.approx(sum(float(logprobs[d, tree.tokens[n]]) for d, n in enumerate(path)),
                                                 abs=1e-5)
        assert got.scores[tree.parents[node]] >= got.scores[node]


def test_a_short_first_read_reads_more_and_gives_the_same_tree(depth_by_depth, monkeypatch):
    """Nearly flat marginals: the root alone takes dozens of children, far past a first read of 4 ranks."""
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(1)) * 0.1
    reads = []
    topk = torch.topk
    monkeypatch.setattr(torch, "topk", lambda x, n, **kw: reads.append(n) or topk(x, n, **kw))
    got = build_marginal_tree(7, logits, 100, 90, first_read=4)
    want = heap_tree(logits, 90, 100)
    assert got.tree.tokens == want.tree.tokens and got.tree.parents == want.tree.parents
    assert reads[0] == 4 and len(reads) > 1 and len(got.tree.children[0]) > 4
    reads.clear()  # rebuilt from the ranks it reported: one read
    again = build_marginal_tree(7, logits, 100, 90, first_read=got.ranks_read)
    assert len(reads) == 1 and again.tree.tokens == got.tree.tokens


def test_small_trees_go_to_the_heap_and_large_ones_depth_by_depth(monkeypatch):
    calls = []
    real = marginal_tree._best_paths
    monkeypatch.setattr(marginal_tree, "_best_paths", lambda *a: calls.append(a[1]) or real(*a))
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2)) * 3
    build_marginal_tree(1, logits, 16, marginal_tree.HEAP_NODES)
    assert calls == []
    build_marginal_tree(1, logits, 300, 200, first_read=300)  # every rank read: one build
    assert calls == [200]
    calls.clear()  # a cost-aware tree starts at `first_nodes` and doubles while the rule admits every node
    flat = VerifyCostModel([0, 300], [0], [[1.0, 1.0]], draft_s=0.1)
    built = build_marginal_tree(1, logits, 300, 300, CostAwareStop(flat, 10), first_read=300,
                                first_nodes=70)
    assert calls == [70, 140, 280, 300] and built.tree.num_draft_nodes() == 300 and not built.stopped_early


@pytest.mark.parametrize("seed", range(10))
def test_the_stop_rule_on_a_whole_order_is_the_node_by_node_rule(seed):
    gen = torch.Generator().manual_seed(seed)
    scores = np.sort(-np.abs(torch.randn(200, generator=gen).numpy().astype(np.float64)) * (seed + 1))[::-1]
    model = VerifyCostModel([0, 16, 64, 128], [0, 500], [[1.0, 1.1, 1.6, 3.0], [1.2, 1.4, 2.0, 3.6]],
                            draft_s=0.1 * (seed % 3))
    rule = CostAwareStop(model, 37 * seed)
    node_by_node = next((n for n, s in enumerate(scores) if not rule(n, float(s))), len(scores))
    assert CostAwareStop(model, 37 * seed).admitted(scores) == node_by_node <= model.max_nodes


def test_the_stop_rule_on_a_flat_curve_rounds_as_the_node_by_node_rule():
    """On a flat curve the rule admits a node while (1 + phi) + delta > 1 + phi: for a tiny delta that is the
    last bit of the sum, so both forms must group it the same way (a review found [-0.5, -36.75] split them)."""
    flat = VerifyCostModel([0, 1024], [64], [[0.03, 0.03]], draft_s=0.005)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        scores = np.sort(-torch.rand(40, generator=gen).numpy().astype(np.float64) * 45)[::-1]
        rule = CostAwareStop(flat, 64)
        node_by_node = next((n for n, s in enumerate(scores) if not rule(n, float(s))), len(scores))
        assert CostAwareStop(flat, 64).admitted(scores) == node_by_node
    rule, found = CostAwareStop(flat, 64), np.array([-0.5, -36.75])
    node_by_node = next((n for n, s in enumerate(found) if not rule(n, float(s))), len(found))
    assert CostAwareStop(flat, 64).admitted(found) == node_by_node


def test_round_after_round_the_trees_do_not_depend_on_where_the_round_started():
    """MarginalTrees starts each round from the last round's ranks and size (heap or depth by depth, short or
    long first read): the trees are those of a fresh build every round."""
    from decoding.drafting.marginal_tree import MarginalTrees

    gen = torch.Generator().manual_seed(3)
    flat = VerifyCostModel([0, 300], [0], [[1.0, 1.0]], draft_s=0.1)
    steep = VerifyCostModel([0, 8, 300], [0], [[1.0, 1.05, 30.0]], draft_s=0.1)
    trees = MarginalTrees(k=300, budget=300)
    sizes = []
    for round_ in range(12):
        logits = torch.randn(5, 400, generator=gen) * (0.3 if round_ % 3 else 4.0)
        cost = flat if round_ % 2 else steep
        got = trees.build(2, logits, CostAwareStop(cost, 10))
        want = heap_tree(logits, 300, 300, CostAwareStop(cost, 10))
        assert got.tree.tokens[:1] == [2] and got.scores == pytest.approx(want.scores, abs=1e-6)
        assert got.tree.num_draft_nodes() == want.tree.num_draft_nodes() and got.stopped_early == want.stopped_early
        sizes.append(trees.nodes)
    assert max(sizes) == 300 and min(sizes) < 32  # both builders ran
    trees.reset()
    assert (trees.ranks, trees.nodes) == (0, 0)


def test_a_block_without_draft_rows_gives_the_root_alone():
    built = build_marginal_tree(5, torch.zeros(0, 50), 300, 300)
    assert built.tree.tokens == [5] and built.scores == [0.0]
