"""The shared best-first builder: marginal (DDTree) and conditional (DominoTree) trees against a
brute-force scoring of every path in a tiny vocabulary; the fast conditional scorer builds exactly
the reference scorer's trees; CaDDTree's cost model and stopping rule."""

import math

import numpy as np
import pytest
import torch

from decoding.drafting.domino_head import Float32Head, correction, gru_path_state
from decoding.drafting.domino_scorer import LevelBuilder, ReferenceScorer
from decoding.drafting.draft_tree import build_best_first, first_read_after, marginal_expand
from decoding.drafting.verify_cost import CostAwareStop, VerifyCostModel, fit_monotone_convex


def brute_force_tree(score_children, depth: int, budget: int):
    """Every root path of length <= depth whose tokens are each among their parent's candidate
    children, scored by cumulative log-prob; the best `budget` of them (prefix-closed, since
    log-probs are <= 0)."""
    paths = {}
    frontier = [()]
    for _ in range(depth):
        nxt = []
        for path in frontier:
            tokens, logprobs = score_children(path)
            for t, lp in zip(tokens, logprobs):
                paths[path + (t,)] = paths.get(path, 0.0) + lp
                nxt.append(path + (t,))
        frontier = nxt
    best = sorted(paths.items(), key=lambda kv: -kv[1])[:budget]
    return {p: s for p, s in best}


def tree_paths(built):
    tree = built.tree
    return {tuple(tree.tokens[i] for i in tree.path_to(n)[1:]): built.scores[n] for n in range(1, len(tree))}


def test_marginal_tree_is_the_top_budget_paths():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, generator=gen) * 2
    lp = torch.log_softmax(logits, -1)
    built = build_best_first(99, marginal_expand(logits, 6), budget=12, max_depth=3)
    want = brute_force_tree(lambda path: (list(range(6)), lp[len(path)].tolist()), 3, 12)
    got = tree_paths(built)
    assert got.keys() == want.keys()
    for p in want:
        assert got[p] == pytest.approx(want[p], abs=1e-5)
    assert built.tree.num_draft_nodes() == 12 and not built.stopped_early


def test_marginal_tree_reads_more_ranks_when_a_depth_needs_them():
    """A wide cap (CaDDTree's) reads only the first ranks of each depth; a flat distribution makes the
    tree go past them, and the extra reads give the same tree as the brute force."""
    from decoding.drafting import draft_tree

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 100, generator=gen) * 0.1  # nearly flat: the root alone gets dozens of children
    lp = torch.log_softmax(logits, -1)
    built = build_best_first(99, marginal_expand(logits, 100), budget=90, max_depth=3)
    want = brute_force_tree(lambda path: (list(range(100)), lp[len(path)].tolist()), 3, 90)
    got = tree_paths(built)
    assert got.keys() == want.keys()
    assert len(built.tree.children[0]) > draft_tree.FIRST_READ  # the lazy read was needed


@pytest.mark.parametrize("seed, scale", [(0, 0.1), (1, 3.0), (2, 10.0)])
def test_a_tree_rebuilt_from_the_ranks_the_last_one_read_needs_no_further_read(seed, scale, monkeypatch):
    """CaDDTree's next round reads first the ranks its last tree looked at (`ranks_read`), not its node
    count: a 1024-node tree on a 152k vocabulary read 16 x 1024 ranks, ~1.4 ms of host conversion on this CPU.
    `ranks_read` bounds every rank the heap looked at, so the same logits rebuilt with that first read
    take no second read and give the same tree."""
    from decoding.drafting import draft_tree

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 300, generator=gen) * scale
    reference = build_best_first(7, marginal_expand(logits, 300, first_read=300), budget=120, max_depth=4)
    assert 1 <= reference.ranks_read <= 300
    rereads = []
    real = draft_tree.MarginalRows.ranked

    def counting(rows, depth, rank):
        if rank >= len(rows.host[depth][0]):
            rereads.append((depth, rank))
        return real(rows, depth, rank)

    monkeypatch.setattr(draft_tree.MarginalRows, "ranked", counting)
    again = build_best_first(7, marginal_expand(logits, 300, first_read=reference.ranks_read), budget=120, max_depth=4)
    assert rereads == []
    assert again.tree.tokens == reference.tree.tokens and again.tree.parents == reference.tree.parents
    assert again.ranks_read == reference.ranks_read
    rule = build_best_first(7, marginal_expand(logits, 300, first_read=first_read_after(reference.ranks_read)),
                            budget=120, max_depth=4)  # CaDDTree's next-round rule reads at least that much
    assert rereads == [] and rule.tree.tokens == reference.tree.tokens
    if reference.ranks_read > 1:  # one rank fewer is not enough
        short = build_best_first(7, marginal_expand(logits, 300, first_read=reference.ranks_read - 1), budget=120,
                                 max_depth=4)
        assert rereads and short.tree.tokens == reference.tree.tokens


def test_a_wider_read_keeps_the_ranks_already_handed_out():
    """Tied log-probs: a larger top-k may order them differently; the ranks a tree already used keep
    their tokens and no token appears twice."""
    from decoding.drafting.draft_tree import MarginalRows

    rows = MarginalRows(torch.zeros(2, 200), k=200, first_read=8)
    first = list(rows.ranked(0, 0)[0])
    ids, values = rows.ranked(0, 150)
    assert ids[:8] == first and len(set(ids)) == len(ids) >= 151 and len(values) == len(ids)


def domino_case(make, seed: int, vocab=9, depth=4):
    drafter = make(vocab=vocab, domino=True, seed=seed)
    spec = drafter.spec
    gen = torch.Generator().manual_seed(seed)
    embed = torch.nn.Embedding(vocab, spec.hidden_size)
    torch.nn.init.normal_(embed.weight, generator=gen)
    z = torch.randn(depth, spec.hidden_size, generator=gen)
    base = torch.randn(depth, vocab, generator=gen) * 2
    return drafter, embed, z, base


@pytest.mark.parametrize("seed", range(4))
def test_conditional_tree_matches_brute_force_scoring_of_every_path(seed, tiny_drafter):
    drafter, embed, z, base = domino_case(tiny_drafter, seed)
    k, m, budget, root = 3, 5, 14, 4

    def score_children(path):
        d = len(path)
        with torch.no_grad():
            if d < drafter.spec.pure_draft_prefix_len:
                vals, ids = torch.topk(torch.log_softmax(base[d], -1), k)
                return ids.tolist(), vals.tolist()
            h = gru_path_state(drafter.prefix_gru, embed(torch.tensor((root,) + path)))
            cand = torch.topk(base[d], m).indices
            s = base[d][cand] + correction(drafter.embed_proj, z[d][None], h[None], cand)[0]
            vals, local = torch.topk(torch.log_softmax(s, -1), k)
            return cand[local].tolist(), vals.tolist()

    want = brute_force_tree(score_children, len(base), budget)
    head = Float32Head(drafter)
    for built in (build_best_first(root, ReferenceScorer(drafter, head, embed, z, base, k, m), budget, len(base)),
                  LevelBuilder(drafter, head, embed, z, base, k, m).build(root, budget, len(base))):
        got = tree_paths(built)
        assert got.keys() == want.keys()
        for p in want:
            assert got[p] == pytest.approx(want[p], abs=1e-4)


@pytest.mark.parametrize("whole", [False, True], ids=["by_depth", "whole_tree"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(12))
def test_fast_builder_builds_exactly_the_reference_trees(seed, dtype, whole, tiny_drafter):
    """Also for a bf16 drafter: both builders run the head in fp32 (Float32Head), so their
    scores differ by fp32 rounding only (stated tolerance 1e-5) and the trees are the same. `whole_tree`: the
    one-graph build of CUDA, its replay emulated."""
    from decoding.engine.cuda_graph import GraphReplayer

    drafter, embed, z, base = domino_case(tiny_drafter, seed, vocab=40, depth=6)
    drafter, embed, z = drafter.to(dtype), embed.to(dtype), z.to(dtype)
    base = base.to(dtype).float()  # lm_head output of a bf16 model, read out in fp32
    head = Float32Head(drafter)
    ref = build_best_first(3, ReferenceScorer(drafter, head, embed, z, base, 8, 16), 24, max_depth=6)
    graphs = GraphReplayer(True, "method.cuda_graph", emulate=True) if whole else None
    fast = LevelBuilder(drafter, head, embed, z, base, 8, 16, graphs=graphs).build(3, 24, max_depth=6)
    assert fast.tree.tokens == ref.tree.tokens and fast.tree.parents == ref.tree.parents
    np.testing.assert_allclose(fast.scores, ref.scores, atol=1e-5)


def domino_path_score(drafter, embed, z, base, root: int, path: tuple, m: int) -> float:
    """A path's cumulative score computed on its own: per depth, the uncorrected log-prob of its token, or the
    corrected one among the depth's top-`m` candidates given the GRU state of the path above it."""
    total = 0.0
    with torch.no_grad():
        for d, tok in enumerate(path):
            if d < drafter.spec.pure_draft_prefix_len:
                total += float(torch.log_softmax(base[d].float(), -1)[tok])
                continue
            h = gru_path_state(drafter.prefix_gru, embed(torch.tensor((root,) + path[:d])))
            cand = torch.topk(base[d], m).indices
            s = base[d][cand] + correction(drafter.embed_proj, z[d][None], h[None], cand)[0]
            where = (cand == tok).nonzero()
            assert len(where) == 1, f"token {tok} at depth {d + 1} is not among the depth's candidates"
            total += float(torch.log_softmax(s, -1)[where[0, 0]])
    return total


@pytest.mark.parametrize("whole", [False, True], ids=["by_depth", "whole_tree"])
@pytest.mark.parametrize("prefix", [1, 2, 7])
def test_under_exact_ties_the_builders_trees_score_the_same_at_every_rank(prefix, whole, tiny_drafter):
    """The stated tolerance of the fast builder: coarse base logits (exact ties, as bf16 logits have; the
    uncorrected depths' children tie outright) give trees whose scores are the reference's at every rank of
    the best-first order, each node's score being its own path's (so its parent link is the one scored), while the
    nodes kept among equal scores may differ: the
    reference heap breaks a tie by push order, the lanes by `torch.topk`, which keeps no index order for ties
    on a CPU either (`torch.topk(tensor([1., 2., 2., 2.]), 2)` gives indices 2 and 3 here)."""
    from decoding.engine.cuda_graph import GraphReplayer

    tied = 0
    for seed in range(6):
        drafter, embed, z, base = domino_case(tiny_drafter, seed, vocab=40, depth=7)
        drafter.spec.pure_draft_prefix_len = prefix
        base = (base * 2).round() / 2
        head = Float32Head(drafter)
        ref = build_best_first(5, ReferenceScorer(drafter, head, embed, z, base, 4, 12), 24, max_depth=7)
        graphs = GraphReplayer(True, "method.cuda_graph", emulate=True) if whole else None
        fast = LevelBuilder(drafter, head, embed, z, base, 4, 12, graphs=graphs).build(5, 24, max_depth=7)
        assert len(fast.tree) == len(ref.tree) == 25
        np.testing.assert_allclose(fast.scores, ref.scores, atol=1e-5)
        assert sorted(ref.scores, reverse=True) == ref.scores  # best-first: comparing rank by rank is meaningful
        for built in (fast, ref):  # every node's path scores what the path's own conditional log-probs sum to
            for path, score in tree_paths(built).items():
                assert score == pytest.approx(domino_path_score(drafter, embed, z, base, 5, path, 12), abs=1e-4)
        tied += len(set(ref.scores)) < len(ref.scores)
    assert tied >= 3  # most cases hold exact ties inside the tree


@pytest.mark.parametrize("whole", [False, True], ids=["by_depth", "whole_tree"])
@pytest.mark.parametrize("prefix", [0, 1, 2, 7, 9])  # 7, 9: every depth of the block uncorrected
@pytest.mark.parametrize("peak", [1.0, 6.0])  # 6: peaked marginals, deep narrow trees (early stop is rare)
@pytest.mark.parametrize("seed", range(3))
def test_level_builder_equals_the_heap_with_any_prefix_budget_and_stop_rule(seed, peak, prefix, whole, tiny_drafter):
    """The depth-by-depth builder pops what the node-by-node heap pops: every uncorrected-prefix
    length, shallow and deep trees, trees cut at a depth below the block's, and a cost-aware stop that ends the
    tree before the budget. `whole_tree`: the build CUDA replays as one graph (every depth, no early stop), its
    replay emulated on the CPU; its depths past the last one reached hold only dead lanes."""
    from decoding.engine.cuda_graph import GraphReplayer

    drafter, embed, z, base = domino_case(tiny_drafter, seed, vocab=40, depth=7)
    drafter.spec.pure_draft_prefix_len = prefix
    base = base * peak
    head = Float32Head(drafter)
    cost = VerifyCostModel([0, 8, 64], [0, 1000], [[1.0, 1.05, 3.0], [1.0, 1.05, 3.0]], draft_s=0.2)
    shallow = 0  # trees whose deepest node is above the last depth allowed: the build stopped early there
    for budget, admit, max_depth in ((16, None, 7), (40, None, 7), (40, "cost", 7), (16, None, 3), (40, None, 12)):
        stop = (lambda: None) if admit is None else (lambda: CostAwareStop(cost, 100))  # the rule keeps state
        ref = build_best_first(5, ReferenceScorer(drafter, head, embed, z, base, 4, 12), budget,
                               max_depth=min(max_depth, 7), admit=stop())
        graphs = GraphReplayer(True, "method.cuda_graph", emulate=True) if whole else None
        fast = LevelBuilder(drafter, head, embed, z, base, 4, 12, graphs=graphs).build(5, budget, max_depth=max_depth,
                                                                                      admit=stop())
        assert graphs is None or graphs.captures == 1
        assert fast.tree.tokens == ref.tree.tokens and fast.tree.parents == ref.tree.parents
        assert fast.stopped_early == ref.stopped_early
        np.testing.assert_allclose(fast.scores, ref.scores, atol=1e-5)
        if admit:
            assert ref.stopped_early and ref.tree.num_draft_nodes() < budget  # the rule really cut the tree
        assert max(fast.tree.depths) <= min(max_depth, 7)
        shallow += max(fast.tree.depths) < min(max_depth, 7)
    if peak == 1.0 and prefix < 7:
        assert shallow > 0  # the dead-lane depths of the whole tree were really exercised


def test_the_tree_graph_captured_in_one_round_fits_the_next_rounds(tiny_drafter):
    """The whole tree's CUDA graph (captured on a GPU only; emulated here, decoding/engine/cuda_graph.py) is
    reused while it fits: it checks the weights by identity, so every round's builder must hand it the head's
    own tensors, not fresh views (a fresh `w_s.t()` per round re-captured the graph every round). Three rounds,
    one capture, and each round's tree equal to the eager builder's."""
    from decoding.engine.cuda_graph import GraphReplayer

    drafter, embed, z, base = domino_case(tiny_drafter, 0, vocab=40, depth=6)
    head = Float32Head(drafter)
    graphs = GraphReplayer(True, "method.cuda_graph", emulate=True)
    for scale in (1.0, 2.0, 0.5):
        eager = LevelBuilder(drafter, head, embed, z, base * scale, 4, 12).build(5, 12, max_depth=6)
        graphed = LevelBuilder(drafter, head, embed, z, base * scale, 4, 12, graphs=graphs).build(5, 12, max_depth=6)
        assert graphed.tree.tokens == eager.tree.tokens and graphed.tree.parents == eager.tree.parents
        assert graphed.scores == eager.scores and max(graphed.tree.depths) > 2
    assert graphs.captures == 1


def test_conditional_scores_depend_on_the_path(tiny_drafter):
    drafter, embed, z, base = domino_case(tiny_drafter, 1)
    built = build_best_first(4, ReferenceScorer(drafter, Float32Head(drafter), embed, z, base, 3, 9), 30, max_depth=4)
    tree = built.tree
    by_depth = {}
    for node in range(1, len(tree)):
        kids = [tree.tokens[c] for c in tree.children[node]]
        if kids and tree.depths[node] >= 1:
            by_depth.setdefault(tree.depths[node], set()).add(tuple(kids))
    assert any(len(v) > 1 for v in by_depth.values())  # siblings' children differ: not marginal


def test_monotone_convex_fit():
    xs = [0, 1, 2, 4, 8, 16, 32, 64]
    noisy = [83, 126, 120, 103, 133, 167, 210, 376]
    fit = fit_monotone_convex(xs, noisy)
    slopes = np.diff(fit) / np.diff(xs)
    assert np.all(slopes >= -1e-9) and np.all(np.diff(slopes) >= -1e-9)
    convex = [5 + 0.1 * x + 0.01 * x * x for x in xs]
    np.testing.assert_allclose(fit_monotone_convex(xs, convex), convex, atol=1e-6)


def test_cost_aware_stop_picks_the_throughput_maximum():
    cost = VerifyCostModel([0, 10, 100], [0, 1000], [[1.0, 1.2, 5.0], [2.0, 2.2, 6.0]], draft_s=0.3)
    assert cost.verify_s(5, 500) == pytest.approx(0.5 * (1.1 + 2.1))
    assert cost.verify_s(10, 3000) == pytest.approx(2.2)  # beyond the profiled contexts: clamped, as the reference
    with pytest.raises(ValueError, match="outside the profiled node counts"):
        cost.verify_s(101, 0)  # never extrapolated in n
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 20, generator=gen) * 3
    built = build_best_first(1, marginal_expand(logits, 64), 64, 6, admit=CostAwareStop(cost, 300))
    full = build_best_first(1, marginal_expand(logits, 64), 64, 6)
    phi = np.cumsum([0.0] + [math.exp(s) for s in full.scores[1:]])
    throughput = [(1 + phi[n]) / (cost.draft_s + cost.verify_s(n, 300)) for n in range(len(phi))]
    n = built.tree.num_draft_nodes()
    assert built.stopped_early and n == int(np.argmax(throughput))
    assert built.tree.tokens == full.tree.tokens[:n + 1]


def test_a_flat_gpu_like_curve_never_admits_nodes_beyond_the_profiled_grid():
    """On a GPU verify cost is flat to a few hundred rows; extrapolating the last slope let trees run to
    the cap. Now the tree stops at the grid's end even though every node still raises throughput."""
    flat = VerifyCostModel([0, 1, 2, 4, 8, 16], [0, 1000], [[1.0] * 6, [1.0] * 6], draft_s=0.1)
    logits = torch.zeros(8, 50)  # uniform drafts: many equally good nodes
    built = build_best_first(1, marginal_expand(logits, 64), 64, 8, admit=CostAwareStop(flat, 10))
    assert built.tree.num_draft_nodes() == 16 and built.stopped_early


def test_the_default_profile_grid_reaches_the_admitted_budget_and_short_grids_are_refused():
    from decoding.methods.caddtree import CaDDTreeConfig
    from decoding.methods.dominotree import DominoTreeConfig
    from decoding.drafting.verify_cost import admissible_node_grid
    from pipeline.errors import ConfigError

    assert admissible_node_grid(1024) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert admissible_node_grid(24) == [0, 1, 2, 4, 8, 16, 24]
    assert CaDDTreeConfig().profile_node_counts[-1] == CaDDTreeConfig().max_budget == 1024
    assert DominoTreeConfig(budget="cond_adaptive").profile_node_counts[-1] == 64
    with pytest.raises(ConfigError, match=r"profile_node_counts ends at 128 but method.max_budget=1024"):
        CaDDTreeConfig(profile_node_counts=[0, 1, 2, 4, 8, 16, 32, 64, 128])


def test_the_default_context_grid_reaches_gpu_run_lengths_and_a_longer_context_warns_once(caplog):
    """dominotree_table decodes 2048 new tokens on GPUs: a grid ending at 1024 priced most rounds as if
    at 1024. The default is the reference's 0..8192 on a GPU; past the grid, one warning says so."""
    from decoding.drafting.verify_cost import profiled_contexts
    from decoding.methods.caddtree import CaDDTreeConfig
    from decoding.methods.dominotree import DominoTreeConfig

    assert profiled_contexts(CaDDTreeConfig(), torch.device("cuda", 0)) == list(range(0, 8193, 1024))
    assert profiled_contexts(DominoTreeConfig(budget="cond_adaptive"), torch.device("cpu")) == [64, 512, 1024]
    assert profiled_contexts(CaDDTreeConfig(profile_context_lengths=[8, 64]), torch.device("cuda")) == [8, 64]
    cost = VerifyCostModel([0, 10], [0, 1000], [[1.0, 1.2], [2.0, 2.2]], draft_s=0.3)
    with caplog.at_level("WARNING"):
        cost.verify_curve(1000)
        assert not caplog.records
        CostAwareStop(cost, 1500)
        cost.verify_curve(3000)
    assert [r.getMessage() for r in caplog.records] == [
        "context 1500 is past the last profiled one (1000): its verify cost is priced as there; "
        "extend method.profile_context_lengths"]


@pytest.mark.parametrize("pool_size", [0, 12])
@pytest.mark.parametrize("seed", range(3))
def test_the_fast_domino_chain_equals_the_module_call_chain(seed, pool_size, tiny_drafter):
    """decoding.methods.domino.corrected_chain (fused GRU step, per-round tables) drafts what the paper's
    loop with the GRU module and embed_proj drafts."""
    from decoding.methods.domino import corrected_chain
    from decoding.engine.sampling import Sampler

    drafter, embed, z, base = domino_case(tiny_drafter, seed, vocab=40, depth=6)
    head = Float32Head(drafter)
    root, prefix = 5, drafter.spec.pure_draft_prefix_len
    pool = torch.topk(base[prefix:].max(0).values, pool_size).indices if pool_size else None
    got, _ = corrected_chain(head, embed, z, base, root, prefix, pool, 0.0, Sampler(0))
    want = []
    with torch.no_grad():
        for k in range(len(base)):
            if k < prefix:
                want.append(int(base[k].argmax()))
                continue
            h = gru_path_state(head.gru, embed(torch.tensor([root, *want])).float())
            if pool is None:
                scores = base[k] + correction(head.embed_proj, z[k][None], h[None])[0]
                want.append(int(scores.argmax()))
            else:
                scores = base[k][pool] + correction(head.embed_proj, z[k][None], h[None], pool)[0]
                want.append(int(pool[scores.argmax()]))
    assert [int(t) for t in got] == want


def test_the_vectorised_cost_curve_equals_pointwise_cv():
    cost = VerifyCostModel([0, 10, 100], [0, 1000, 4000], [[1.0, 1.2, 5.0], [2.0, 2.2, 6.0], [3.0, 3.5, 9.0]], 0.3)
    for context in (-5, 0, 300, 1000, 2500, 9000):
        curve = cost.verify_curve(context)
        assert len(curve) == 101
        pointwise = [np.interp(context, cost.context_lengths, [np.interp(n, cost.node_counts, c) for c in cost.fitted])
                     for n in range(101)]
        np.testing.assert_allclose(curve, pointwise, rtol=1e-12)


@pytest.mark.parametrize("pool_size, temperature", [(0, 0.7), (5, 1.5)])
def test_sampled_domino_chain_draws_each_position_from_the_distribution_it_returns(pool_size, temperature,
                                                                                    tiny_drafter):
    """Lossless rejection sampling needs every drafted token to be distributed exactly as the row returned
    for it: over many chains, position k's token counts match the sum of the q_k returned (q_k depends on the
    tokens drawn before k, so this is the conditional law averaged over them). Gumbel-max at T, a pool."""
    from decoding.engine.sampling import Sampler
    from decoding.methods.domino import corrected_chain

    drafter, embed, z, base = domino_case(tiny_drafter, 0, vocab=9, depth=4)
    head, prefix = Float32Head(drafter), drafter.spec.pure_draft_prefix_len
    pool = torch.topk(base[prefix:].max(0).values, pool_size).indices if pool_size else None
    sampler, n = Sampler(11), 4000
    counts, expected = torch.zeros(4, 9, dtype=torch.float64), torch.zeros(4, 9, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(n):
            tokens, q = corrected_chain(head, embed, z, base, 5, prefix, pool, temperature, sampler)
            counts[torch.arange(4), tokens] += 1
            expected += q.double()
            assert bool((q[torch.arange(4), tokens] > 0).all())
    assert torch.allclose(expected.sum(1), torch.full((4,), float(n), dtype=torch.float64))
    if pool is not None:  # corrected positions never leave the pool
        outside = torch.ones(9, dtype=torch.bool)
        outside[pool] = False
        assert counts[prefix:, outside].sum() == 0 and expected[prefix:, outside].sum() == 0
    z_scores = (counts - expected) / expected.clamp(min=1.0).sqrt()
    assert z_scores.abs().max() < 4.5


@pytest.mark.parametrize("pool_size", [0, 12])
def test_the_captured_functions_never_read_a_tensor_on_the_host(pool_size, tiny_drafter):
    """A CUDA graph cannot hold a host read (.item(), int(t), nonzero, a data-dependent shape) nor a tensor made
    on the CPU mid-capture. On the meta device every such read fails, so `whole_tree` (DominoTree's graph) and
    `chain_picks` (Domino's) running there end to end, greedy and sampled, show they have none."""
    from decoding.drafting.domino_scorer import whole_tree
    from decoding.methods.domino import chain_picks

    drafter, embed, z, base = domino_case(tiny_drafter, 0, vocab=40, depth=6)
    head = Float32Head(drafter)
    meta = {name: t.to("meta") for name, t in {"w_z": head.w_z, "w2": head.w2, "table": head.input_table(embed),
                                               "w_s_t": head.w_s_t, "w_hh_t": head.w_hh_t,
                                               "w_next_t": head.w_next_t}.items()}
    for prefix in (0, 1, 6):
        found = whole_tree(torch.tensor([5], device="meta"), z.to("meta"), base.to("meta"), meta["w_z"], meta["w2"],
                           meta["table"], meta["w_s_t"], meta["w_hh_t"], m=12, k=4, k_prefix=4, prefix=prefix, lanes=16)
        assert [t.shape for t in found] == [(32,), (32,), (32,), (16 * 6,)] and found[0].is_meta
    pool = torch.arange(pool_size, device="meta") if pool_size else None
    width = pool_size or 40
    for noise in (None, torch.zeros(5, width, dtype=torch.float64, device="meta")):
        picks, rows = chain_picks(meta["table"], meta["w_next_t"], meta["w2"], torch.zeros(5, head.w2.shape[1],
                                  device="meta"), torch.zeros(5, width, device="meta"), noise,
                                  torch.zeros(2, dtype=torch.long, device="meta"), pool)
        assert picks.shape == (5,) and rows.shape == (5, width) and picks.is_meta
