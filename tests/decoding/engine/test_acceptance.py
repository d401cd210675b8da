"""Acceptance rules: greedy walks the argmax; sampling emits tokens distributed exactly as the
target (chi-square tests with fixed seeds)."""

import pytest
import torch
from scipy.stats import chisquare

from decoding.engine.acceptance import accept_greedy, accept_sampling
from decoding.engine.sampling import Sampler
from decoding.engine.tree import TokenTree

V = 6
TEMPERATURE = 0.8


def logits_for(tree_size: int, seed: int) -> torch.Tensor:
    return torch.randn(tree_size, V, generator=torch.Generator().manual_seed(seed)) * 1.5


def test_greedy_follows_argmax_and_returns_bonus():
    tree = TokenTree.from_sequences(0, [[3, 4], [2, 5]])  # nodes: 0, 3, 4, 2, 5
    logits = torch.full((5, V), -5.0)
    logits[0, 2] = 5  # root -> 2 (node 3)
    logits[3, 5] = 5  # node 3 -> 5 (node 4)
    logits[4, 1] = 5  # bonus after node 4
    verdict = accept_greedy(tree, logits)
    assert verdict.path == [0, 3, 4] and verdict.bonus == 1 and verdict.num_accepted == 2


def emitted_first_two(tree, logits, n, seed):
    """Empirical joint distribution of the first two committed tokens."""
    gen = torch.Generator().manual_seed(seed)
    sampler = Sampler(seed + 1)
    counts = torch.zeros(V, V)
    for _ in range(n):
        verdict = accept_sampling(tree, logits, TEMPERATURE, sampler)
        toks = [tree.tokens[i] for i in verdict.path[1:]] + [verdict.bonus]
        if len(toks) < 2:  # only the bonus was emitted: the second token comes from the next step
            nxt = torch.multinomial(torch.softmax(logits_next[toks[0]] / TEMPERATURE, -1), 1, generator=gen).item()
            toks.append(nxt)
        counts[toks[0], toks[1]] += 1
    return counts


# Second-step distributions for paths that stop after one token (the next step would sample them
# from the target given that token); a fixed table makes the joint check exact.
logits_next = torch.randn(V, V, generator=torch.Generator().manual_seed(99)) * 1.5


def target_joint(tree, logits):
    """p(x1) p(x2 | x1), where the tree's node logits define p(.|x1) for drafted x1 and
    logits_next does otherwise."""
    p1 = torch.softmax(logits[0] / TEMPERATURE, -1)
    joint = torch.zeros(V, V)
    for x1 in range(V):
        child = next((c for c in tree.children[0] if tree.tokens[c] == x1), None)
        row = logits[child] if child is not None else logits_next[x1]
        joint[x1] = p1[x1] * torch.softmax(row / TEMPERATURE, -1)
    return joint


def assert_matches(counts, joint, n):
    keep = joint.flatten() * n > 5  # chi-square needs non-tiny expected counts
    obs, exp = counts.flatten()[keep], joint.flatten()[keep] * n
    exp = exp * obs.sum() / exp.sum()
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


def test_deterministic_tree_sampling_keeps_target_distribution():
    tree = TokenTree.from_sequences(0, [[1, 3], [1, 4], [2, 0], [5]])
    logits = logits_for(len(tree), seed=1)
    logits_tree = logits.clone()
    # make the drafts plausible so that acceptance paths are exercised
    logits_tree[0, 1] += 2
    n = 40000
    counts = emitted_first_two(tree, logits_tree, n, seed=0)
    assert_matches(counts, target_joint(tree, logits_tree), n)


@pytest.mark.parametrize("n_children", [1, 3])
def test_sampled_children_without_replacement_keep_target_distribution(n_children):
    """Children drawn from a draft q without replacement (a chain when n_children=1)."""
    q = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(5)), -1)
    gen = torch.Generator().manual_seed(1)
    sampler = Sampler(11)
    n = 30000
    logits_root = logits_for(1, seed=3)[0]
    p = torch.softmax(logits_root / TEMPERATURE, -1)
    counts = torch.zeros(V)
    for _ in range(n):
        # a fresh draft every trial: tokens sampled from q without replacement
        kids = torch.multinomial(q, n_children, replacement=False, generator=gen).tolist()
        tree = TokenTree([0] + kids, [-1] + [0] * n_children, [None] + [q] * n_children)
        logits = torch.cat([logits_root[None], torch.zeros(n_children, V)])
        verdict = accept_sampling(tree, logits, TEMPERATURE, sampler)
        first = tree.tokens[verdict.path[1]] if len(verdict.path) > 1 else verdict.bonus
        counts[first] += 1
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3


def test_acceptance_rate_of_a_chain_is_one_minus_total_variation():
    """Leviathan et al.: P(accept) = sum_x min(p, q) = 1 - TV(p, q)."""
    q = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(8)), -1)
    logits_root = logits_for(1, seed=9)[0]
    p = torch.softmax(logits_root / TEMPERATURE, -1)
    gen = torch.Generator().manual_seed(2)
    sampler = Sampler(12)
    n, accepted = 20000, 0
    for _ in range(n):
        x = torch.multinomial(q, 1, generator=gen).item()
        tree = TokenTree.chain(0, [x], [q])
        verdict = accept_sampling(tree, torch.cat([logits_root[None], torch.zeros(1, V)]), TEMPERATURE, sampler)
        accepted += verdict.num_accepted
    expected = torch.minimum(p, q).sum().item()
    assert abs(accepted / n - expected) < 4 * (expected * (1 - expected) / n) ** 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_sampled_chain_takes_its_draws_as_two_separate_calls_would(dtype):
    """The leaf's y ~ p and the chain's residual draws are one categorical call: on a CPU generator the same
    uniforms in the same order as drawing them in two calls (accept tests first, then the leaf, then the
    residuals), so each seed gives the verdict the two-call rule gives; float64 rows are not rounded."""
    from decoding.engine.acceptance import accept_against

    gen = torch.Generator().manual_seed(4)
    gamma = 3
    q = torch.softmax(torch.randn(gamma, V, generator=gen), -1)
    probs = torch.softmax(torch.randn(gamma + 1, V, generator=gen) * 2, -1).to(dtype)
    for seed in range(40):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(gamma)]
        tree = TokenTree.chain(0, drafts, list(q))
        got = accept_against(tree, probs, Sampler(seed))
        sampler = Sampler(seed)
        x = torch.tensor(drafts)
        p = probs[:gamma].float() / probs[:gamma].float().sum(-1, keepdim=True)
        accepted = sampler.uniform(gamma) * q.gather(1, x[:, None])[:, 0] < p.gather(1, x[:, None])[:, 0]
        leaf = int(sampler.categorical(probs[gamma:]))
        residual = (p - q).clamp_min(0.0)
        resampled = sampler.categorical(torch.where(residual.sum(-1, keepdim=True) > 1e-12, residual, p)).tolist()
        rejected = next((i for i in range(gamma) if not accepted[i]), None)
        want = (list(range(gamma + 1)), leaf) if rejected is None else (list(range(rejected + 1)), resampled[rejected])
        assert (got.path, got.bonus) == want


@pytest.mark.parametrize("rule", ["greedy", "deterministic tree", "sampled chain"])
def test_what_a_method_reads_along_comes_back_in_the_verdicts_copy_and_changes_no_draw(rule, monkeypatch):
    """`also` (Proposal.reads): further tensors read to the host in the acceptance's one copy. Their values
    come back exactly (ints and floats, in order), the verdict is the one without them (the same uniforms),
    and the acceptance still makes one device->host copy (`to_host` called once)."""
    from decoding.engine import acceptance
    from decoding.engine.acceptance import accept_against

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, V, generator=gen) * 2
    also = (logits.argmax(-1), torch.log_softmax(logits, -1)[:, :2])
    if rule == "sampled chain":
        q = torch.softmax(torch.randn(3, V, generator=gen), -1)
        tree = TokenTree.chain(0, [1, 2, 3], list(q))
    else:
        tree = TokenTree.from_sequences(0, [[1, 2], [3]])  # nodes 0, 1, 2, 3: four rows

    def run(extra, seed):
        if rule == "greedy":
            return accept_greedy(tree, logits, extra)
        return accept_against(tree, torch.softmax(logits, -1), Sampler(seed), extra)

    copies = []
    real = acceptance.to_host
    monkeypatch.setattr(acceptance, "to_host", lambda *t: copies.append(len(t)) or real(*t))
    for seed in range(20):
        plain, along = run((), seed), run(also, seed)
        assert (along.path, along.bonus) == (plain.path, plain.bonus) and plain.reads == []
        assert along.reads[0] == also[0].tolist()
        assert along.reads[1] == pytest.approx(also[1].reshape(-1).tolist(), abs=0)
    assert copies == [1, 3] * 20 if rule != "sampled chain" else copies == [2, 4] * 20
