"""PTD's drafting machinery: width cap, the depth window (keeps the earliest-added child), pool
merge (idempotent recursive union of same-root subtrees) and eviction, seeds, and the one-forward
step layout. Losslessness against AR: test_endogenous.py."""

import pytest

from decoding.engine.loop import DecodeState, generate
from decoding.methods.ptd import PTD, PTDConfig
from decoding.drafting.ngram_pool import candidate_tree
from decoding.drafting.ptd_tree import DraftForest, TriePool, graft_branches, graft_tree
from pipeline.errors import ConfigError


def chain_forest(tokens):
    f = DraftForest()
    parent = -1
    for step, tok in enumerate(tokens):
        parent = f.add(tok, parent, birth=step)
    return f


def test_expand_caps_children_per_parent_at_width_and_serves_first_children_first():
    f = DraftForest()
    a, b = f.add(1, -1, 0), f.add(2, -1, 0)
    proposals = {a: [(10, -0.1), (11, -0.5), (12, -0.9)], b: [(20, -0.2), (21, -0.3), (22, -0.4)]}
    assert f.expand(proposals, width=2, budget=100, birth=1) == 4
    assert [f.nodes[c].token for c in f.nodes[a].children] == [10, 11]
    assert [f.nodes[c].token for c in f.nodes[b].children] == [20, 21]
    g = DraftForest()
    a, b = g.add(1, -1, 0), g.add(2, -1, 0)
    g.expand(proposals, width=3, budget=5, birth=1)  # room for 3: both first children, then the best second
    assert sorted(g.nodes[i].token for i in range(2, 5)) == [10, 20, 21]


def test_depth_window_keeps_the_earliest_added_child_and_prunes_older_branches():
    f = DraftForest()
    top = f.add(1, -1, birth=0)
    early = f.add(2, top, birth=1)
    late = f.add(3, top, birth=2)
    f.add(4, early, birth=2)
    deep = f.add(5, late, birth=3)
    f.add(6, deep, birth=4)  # depth 4 under the late branch
    f.slide(max_depth=3)
    # top retired; the earliest child (2) is the new top with its descendant (4); branch 3-5-6 pruned
    assert [n.token for n in f.nodes] == [2, 4]
    assert f.nodes[0].parent == -1 and f.nodes[1].parent == 0 and f.depths() == [1, 2]


def test_depth_window_slides_a_chain_by_one():
    f = chain_forest([1, 2, 3, 4])
    f.slide(max_depth=3)
    assert [n.token for n in f.nodes] == [2, 3, 4] and f.depths() == [1, 2, 3]
    f.slide(max_depth=3)  # within the window: unchanged
    assert [n.token for n in f.nodes] == [2, 3, 4]


def test_merge_of_same_root_subtrees_is_a_recursive_union_and_idempotent():
    pool = TriePool(cap=10)
    pool.merge(7, {1: {2: {}, 3: {}}}, stamp=1)
    pool.merge(7, {1: {2: {4: {}}}, 5: {}}, stamp=2)
    merged = pool.as_nested(7)
    assert merged == {1: {2: {4: {}}, 3: {}}, 5: {}}
    pool.merge(7, {1: {2: {4: {}}}, 5: {}}, stamp=2)
    assert pool.as_nested(7) == merged
    assert [b for _, b in pool.branches(7)] == [[1, 2, 4], [5], [1, 3]]  # freshest first


def test_pool_keeps_at_most_cap_branches_per_root_dropping_the_stalest():
    pool = TriePool(cap=2)
    pool.merge(7, {1: {}}, stamp=1)
    pool.merge(7, {2: {3: {}}}, stamp=2)
    pool.merge(7, {4: {}}, stamp=3)
    assert pool.as_nested(7) == {2: {3: {}}, 4: {}}


def test_eviction_keeps_a_prefix_refreshed_after_its_leaf_and_drops_only_the_stale_tail():
    """Chain 1-2-3 merged at step 0, its prefix 1-2 confirmed again at steps 2-3 (a merge, a recycled
    row): when {6} overfills the pool, the stale leaf 3 goes, 1-2 stays as a branch of its own, and
    the branch [5] (step 1) is the stalest that remains."""
    pool = TriePool(cap=2)
    pool.merge(7, {1: {2: {3: {}}}}, stamp=0)
    pool.merge(7, {5: {}}, stamp=1)
    pool.merge(7, {1: {2: {}}}, stamp=2)
    pool.merge_leaves(7, [1], stamp=3)
    pool.merge(7, {6: {}}, stamp=4)
    assert pool.as_nested(7) == {1: {2: {}}, 6: {}}
    assert pool.leaves[7] == len(pool.branches(7)) == 2


def random_subtree(rng, depth: int, tokens: int, max_width: int) -> dict:
    """A random {token: {...}} trie `depth` levels deep, 1..max_width children per node."""
    if depth == 0:
        return {}
    return {rng.randrange(tokens): random_subtree(rng, depth - 1, tokens, max_width)
            for _ in range(rng.randint(1, max_width))}


def test_pool_branch_counts_stay_exact_under_random_merges():
    """The incremental branch count (what decides whether to walk the trie for eviction) equals a
    full walk after any sequence of merges, and the cap holds."""
    import random

    rng = random.Random(0)
    pool = TriePool(cap=5)
    for step in range(300):
        root = rng.randrange(3)
        pool.merge(root, random_subtree(rng, rng.randint(1, 4), tokens=6, max_width=2), step)
        assert pool.leaves[root] == len(pool.branches(root)) <= 5


def test_merge_leaves_is_the_merge_of_one_token_continuations():
    """The recycled rows' fast path leaves the pool (tries, stamps, counts, evictions) exactly as
    `merge` with {t: {}} does, mixed with deeper merges."""
    import random

    rng = random.Random(1)
    fast, slow = TriePool(cap=4), TriePool(cap=4)
    for step in range(300):
        root = rng.randrange(3)
        if rng.random() < 0.5:
            tokens = [rng.randrange(6) for _ in range(rng.randint(1, 3))]
            fast.merge_leaves(root, tokens, step)
            slow.merge(root, dict.fromkeys(tokens, {}), step)
        else:
            subtree = random_subtree(rng, rng.randint(1, 4), tokens=6, max_width=2)
            fast.merge(root, subtree, step)
            slow.merge(root, subtree, step)
        assert fast.roots == slow.roots and fast.leaves == slow.leaves
        assert fast.leaves[root] == len(fast.branches(root)) <= 4


def test_subtree_extraction_gives_the_continuations_below_a_node():
    f = chain_forest([1, 2, 3])
    f.add(9, 0, birth=5)
    assert f.subtree(0) == {2: {3: {}}, 9: {}} and f.edges() == [(1, 2), (2, 3), (1, 9)]


def test_one_step_sends_the_forest_as_aux_rows_with_tree_visibility(tiny_llama):
    m = PTD(PTDConfig(num_seeds=2, depth=3, drafting_budget=8))
    state = DecodeState(tiny_llama, [7, 30, 31, 32], 0.0, 20, set(), 0)
    tiny_llama.prefill(state.prompt_ids[:-1])
    m.begin(state)
    for _ in range(4):
        m.step(state)
    proposal = m.propose(state)
    depths = m.forest.depths()
    assert proposal.aux_depths == depths and len(proposal.aux_tokens) <= 8
    anc = m.forest.ancestors()
    n_tree = len(proposal.tree)
    for i in range(len(depths)):
        seen = [j for j in range(len(depths)) if proposal.aux_visible[i, n_tree + j]]
        assert seen == sorted([*anc[i], i]) and proposal.aux_visible[i, 0]
    assert max(depths) <= 3 and len(m.forest.tops()) == 2


def test_context_seeds_are_tokens_that_followed_the_root_before(tiny_llama):
    m = PTD(PTDConfig(num_seeds=2, seed_mode="context"))
    state = DecodeState(tiny_llama, [5, 40, 9, 5, 41, 9, 5], 0.0, 4, set(), 0)
    m.begin(state)
    m.plant_seeds(state)
    assert [m.forest.nodes[t].token for t in m.forest.tops()] == [40, 41]  # the most recent (41) is newest
    m.steps += 1
    state.new_tokens = [9]  # a new root: 9 was followed by 5 twice -> one fresh seed replaces the oldest subtree
    m.plant_seeds(state)
    assert [m.forest.nodes[t].token for t in m.forest.tops()] == [41, 5]


def test_ptd_drafts_and_accepts_on_a_repetitive_prompt(tiny_llama):
    state = generate(PTD(PTDConfig()), tiny_llama, [7, 30, 31, 32, 30, 31, 32, 30, 31], max_new_tokens=60)
    assert state.stats.num_draft_tokens > 0 and state.stats.num_accepted_tokens > 0
    assert state.stats.extra["draft_bigrams"] > 0


@pytest.mark.parametrize("field, value", [("width", 0), ("depth", 1), ("seed_mode", "beam"),
                                          ("drafting_budget", 1), ("pool_size", 0)])
def test_bad_values_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=f"method.{field}"):
        PTDConfig(**{field: value})


def test_graft_joins_subtrees_that_share_a_root_token_into_deeper_candidates():
    pool = TriePool(cap=8)
    pool.merge(1, {2: {3: {}}}, stamp=1)
    pool.merge(3, {4: {}}, stamp=1)
    pool.merge(4, {5: {}}, stamp=1)
    # root 1 -> 2 -> 3 from its own trie; 3's trie adds 4, 4's adds 5
    assert graft_branches(pool, 1, budget=10, max_depth=8) == [[2, 3, 4, 5]]
    assert graft_branches(pool, 1, budget=10, max_depth=3) == [[2, 3, 4]]
    assert graft_branches(pool, 1, budget=2, max_depth=8) == [[2, 3]]
    assert graft_branches(pool, 9, budget=10, max_depth=8) == []


def test_graft_prefers_the_longest_matching_context_and_counts_every_node_once():
    pool = TriePool(cap=8)
    pool.merge(1, {2: {7: {}}}, stamp=2)  # after "1 2": 7
    pool.merge(2, {8: {}}, stamp=3)  # after "2" alone (fresher, but a shorter context): 8
    branches = graft_branches(pool, 1, budget=10, max_depth=2)
    assert branches == [[2, 7], [2, 8]]  # 7 (full context, rank 0) before 8 (one suffix token dropped)
    tree = candidate_tree(1, branches, 10)
    assert len(tree) - 1 == 3  # nodes 2, 7, 8: the shared prefix once


def test_context_subtrees_merge_the_committed_continuation_of_every_token(tiny_llama):
    m = PTD(PTDConfig(depth=2, context_subtrees=True, pool_size=8))
    state = DecodeState(tiny_llama, [5, 6, 7, 5, 8], 0.0, 4, set(), 0)
    m.begin(state)
    assert m.pool.as_nested(5) == {6: {7: {}}, 8: {}}
    assert m.pool.as_nested(6) == {7: {5: {}}}
    m.merge_context([5, 6, 7, 5, 8, 9], new=1)  # 9 committed: the chains that reach it grow
    assert m.pool.as_nested(5) == {6: {7: {}}, 8: {9: {}}} and m.pool.as_nested(8) == {9: {}}


def test_recycle_merges_the_verification_rows_top_tokens(tiny_llama):
    m = PTD(PTDConfig(width=2, recycle=True, num_seeds=1, drafting_budget=2))
    state = DecodeState(tiny_llama, [7, 30, 31, 32], 0.0, 20, set(), 0)
    tiny_llama.prefill(state.prompt_ids[:-1])
    m.begin(state)
    root = state.root
    m.step(state)
    committed = state.new_tokens[0]  # the root's row predicted it (greedy): it is among the root's top 2
    assert committed in m.pool.as_nested(root)


@pytest.mark.parametrize("recycle", [True, False])
def test_read_forward_returns_top_tokens_and_log_probs_of_the_leaves_and_edges(tiny_llama, recycle):
    """Against a plain log-softmax of the forward's rows: every row's top-`width` tokens, the leaves'
    proposals with their log-probabilities and every forest edge's log-probability under the new root."""
    import torch

    from decoding.engine.loop import verify

    m = PTD(PTDConfig(width=3, num_seeds=2, depth=4, drafting_budget=8, recycle=recycle))
    state = DecodeState(tiny_llama, [7, 30, 31, 32, 30, 31], 0.0, 40, set(), 0)
    tiny_llama.prefill(state.prompt_ids[:-1])
    m.begin(state)
    for _ in range(3):
        m.step(state)
    result = verify(state, m.propose(state))
    assert any(n.parent >= 0 for n in m.forest.nodes), "the forest must have edges to check"
    recycled, edges, proposals = m.read_forward(result)
    n_tree = len(result.proposal.tree)
    logp = torch.log_softmax(result.output.logits.float(), dim=-1)
    top = torch.topk(logp, 3, dim=-1).indices.tolist()
    assert recycled == (top[:n_tree] if recycle else [])
    kids = [n for n in m.forest.nodes if n.parent >= 0]
    want = [float(logp[n_tree + n.parent, n.token]) for n in kids]
    assert edges == pytest.approx(want, abs=1e-5)
    assert sorted(proposals) == m.forest.leaves()
    for leaf, options in proposals.items():
        assert [t for t, _ in options] == top[n_tree + leaf]
        assert [v for _, v in options] == pytest.approx([float(logp[n_tree + leaf, t]) for t in top[n_tree + leaf]],
                                                        abs=1e-5)


def eager_graft(pool, root, budget, max_depth):
    """graft_branches with every child pushed at once (the definition the lazy builder must equal)."""
    import heapq

    def children(path):
        context = [root, *path]
        out = {}
        for start in range(len(context)):
            node = pool.roots.get(context[start])
            for tok in context[start + 1:]:
                node = node["kids"].get(tok) if node is not None else None
            if node is None or not node["kids"]:
                continue
            for rank, (tok, _) in enumerate(sorted(node["kids"].items(), key=lambda kv: -kv[1]["stamp"])):
                out.setdefault(tok, rank + start)
        return sorted(out.items(), key=lambda kv: kv[1])

    chosen, heap, counter = [], [], 0
    for tok, cost in children([]):
        heap.append((cost, counter, [tok]))
        counter += 1
    heapq.heapify(heap)
    while heap and len(chosen) < budget:
        cost, _, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < max_depth:
            for tok, c in children(path):
                heapq.heappush(heap, (cost + c, counter, [*path, tok]))
                counter += 1
    parents = {tuple(p[:-1]) for p in chosen}
    return [p for p in chosen if tuple(p) not in parents]


@pytest.mark.parametrize("seed", range(20))
def test_lazy_grafting_equals_pushing_every_child_at_once(seed):
    import random

    rng = random.Random(seed)
    pool = TriePool(cap=6)
    for step in range(60):
        pool.merge(rng.randrange(8), random_subtree(rng, rng.randint(1, 4), tokens=8, max_width=3), step)
    for root in range(8):
        for budget, depth in ((4, 3), (16, 6), (32, 8)):
            assert graft_branches(pool, root, budget, depth) == eager_graft(pool, root, budget, depth)


@pytest.mark.parametrize("config", [PTDConfig(), PTDConfig(context_subtrees=False, recycle=False, graft=False),
                                    PTDConfig(width=2, depth=4, num_seeds=2, drafting_budget=3)])
def test_every_forward_grows_the_forest(tiny_llama, config):
    """A full forest retires its oldest subtrees before it expands, so each forward's leaf rows add
    children (before, a forward that found the forest full added nothing and only then retired; a
    budget of 3 with 2 seeds needs more than one retirement when a retired top frees a single node)."""
    method = PTD(config)
    method.setup(tiny_llama)
    grown: list[int] = []
    observe = method._observe

    def counting(state, result):
        observe(state, result)
        grown.append(sum(n.birth == method.steps and n.parent >= 0 for n in method.forest.nodes))

    method._observe = counting
    generate(method, tiny_llama, [5, 6, 7, 5, 6, 8, 9, 5], max_new_tokens=24)
    assert len(grown) > 8 and all(count > 0 for count in grown)


@pytest.mark.parametrize("seed", range(20))
def test_graft_tree_equals_the_trie_of_the_grafted_branches(seed):
    """PTD verifies `graft_tree`, built from the candidates' parent links: node for node (tokens and
    parents, so also the order sampling acceptance tries children in) the trie `candidate_tree` makes of
    `graft_branches`."""
    import random

    rng = random.Random(seed)
    pool = TriePool(cap=6)
    for step in range(60):
        pool.merge(rng.randrange(8), random_subtree(rng, rng.randint(1, 4), tokens=8, max_width=3), step)
    sizes = []
    for root in range(8):
        for budget, depth in ((4, 3), (16, 6), (32, 8)):
            tree = graft_tree(pool, root, budget, depth)
            want = candidate_tree(root, graft_branches(pool, root, budget, depth), budget)
            assert (tree.tokens, tree.parents) == (want.tokens, want.parents)
            sizes.append(len(tree))
    assert max(sizes) > 16  # grafted trees that branch and reach the larger budgets were compared
