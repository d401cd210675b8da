"""DFlash, DDTree, CaDDTree, Domino and DominoTree (+ ablations) on the tiny targets: greedy output
equals AR token for token over many random prompts; sampling at T = 0.5 and 1.0 keeps the target's
distribution (chi-square on the first two tokens); wrong checkpoints fail loudly."""

import collections

import pytest
import torch
from hydra.utils import get_class
from scipy.stats import chi2_contingency

from decoding.methods import caddtree, ddtree, dflash, domino, dominotree
from decoding.methods.ar import AR
from decoding.drafting.dflash_drafter import save_drafter
from decoding.engine.loop import generate
from pipeline.errors import ConfigError

SMALL_PROFILE = dict(profile_node_counts=[0, 1, 2, 4, 8, 16, 24], profile_context_lengths=[8, 64], profile_repeats=1)
METHODS = {
    "dflash": (dflash, {}),
    "dflash_sampled_draft": (dflash, {"sample_draft": True}),
    "ddtree": (ddtree, {"budget": 12}),
    "caddtree": (caddtree, {"max_budget": 24, **SMALL_PROFILE}),
    "domino": (domino, {}),
    "domino_pool": (domino, {"candidate_pool": 20, "verify": "rejection"}),
    "dominotree": (dominotree, {}),
    "dominotree_reference": (dominotree, {"builder": "reference"}),
    "dominotree_marginal": (dominotree, {"scoring": "marginal"}),
    "cond_adaptive": (dominotree, {"budget": "cond_adaptive", "max_budget": 24, **SMALL_PROFILE}),
}
NEEDS_DOMINO = (domino, dominotree)


def train_tiny(drafter, target, steps=300):
    """A few hundred Adam steps of the real training objective on the tiny target's own greedy
    continuations, so that drafts get accepted and the equality test exercises multi-token steps."""
    from pipeline.train.objectives import dflash_loss, domino_loss, sample_blocks

    gen = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(12):
        prompt = torch.randint(6, 90, (8,), generator=gen).tolist()
        ids = prompt + generate(AR(), target, prompt, max_new_tokens=40).new_tokens
        out = target.prefill(ids[:-1], hidden_layers=tuple(drafter.spec.target_layer_ids))
        hidden = torch.stack([out.hidden[i] for i in drafter.spec.target_layer_ids], dim=1)
        samples.append({"ids": torch.tensor(ids), "prompt_len": len(prompt), "hidden": hidden})
    embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    drafter.train()
    opt = torch.optim.Adam(drafter.parameters(), lr=5e-3)
    losses = []
    for step in range(steps):
        sample = samples[step % len(samples)]
        blocks = sample_blocks(sample["ids"], sample["prompt_len"], drafter.spec.block_size, 8, 7.0,
                               drafter.spec.shift_label, gen)
        if drafter.spec.is_domino:
            loss, _ = domino_loss(drafter, embed, head, sample, blocks, drafter.spec.mask_token_id, 0.3)
        else:
            loss, _ = dflash_loss(drafter, embed, head, sample, blocks, drafter.spec.mask_token_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-20:]) < 0.75 * sum(losses[:20])  # the objective trains
    return drafter.eval()


@pytest.fixture(scope="module")
def drafter_dirs(tmp_path_factory, tiny_drafter, tiny_model_dirs):
    """{arch: {"dflash": dir, "domino": dir}}: tiny drafters trained on each tiny target, saved in
    the published layout (Domino with the published shift_label semantics)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.engine.target import TargetModel

    dirs = {}
    for arch, model_dir in tiny_model_dirs.items():
        target = TargetModel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                             AutoTokenizer.from_pretrained(model_dir))
        dirs[arch] = {}
        for kind in ("dflash", "domino"):
            path = tmp_path_factory.mktemp(f"{arch}_{kind}")
            drafter = tiny_drafter(vocab=target.config.vocab_size, domino=kind == "domino", hidden=64, block_size=6,
                                   seed=3)
            save_drafter(train_tiny(drafter, target), path, dtype=torch.float32)
            dirs[arch][kind] = str(path)
    return dirs


def build(name, drafter_dirs, target, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))  # the cost profile cache
    module, overrides = METHODS[name]
    kind = "domino" if module in NEEDS_DOMINO else "dflash"
    arch = target.config.model_type
    cfg = module.CONFIG(drafter=drafter_dirs[arch][kind], **overrides)
    method = get_class(cfg._target_)(cfg)
    method.setup(target)  # profiles the machine's verify cost (cost-aware budgets)
    if getattr(method, "cost", None) is not None:
        # A fixed cost model in place of the profile: under load the measured curve can make every
        # node unprofitable, and a test of losslessness must not depend on the machine's timing.
        from decoding.drafting.verify_cost import VerifyCostModel

        counts = list(cfg.profile_node_counts)
        method.cost = VerifyCostModel(counts, [0, 1000], [[1.0 + 0.01 * n for n in counts]] * 2, draft_s=0.5)
    return method


@pytest.mark.parametrize("name", METHODS)
def test_greedy_equals_ar(name, tiny_target, drafter_dirs, monkeypatch, tmp_path):
    method = build(name, drafter_dirs, tiny_target, monkeypatch, tmp_path)
    gen = torch.Generator().manual_seed(1)
    accepted = 0
    for _ in range(6):
        prompt = torch.randint(6, 90, (int(torch.randint(3, 20, (1,), generator=gen)),), generator=gen).tolist()
        ar = generate(AR(), tiny_target, prompt, max_new_tokens=30).new_tokens
        state = generate(method, tiny_target, prompt, max_new_tokens=30)
        assert state.new_tokens == ar
        assert state.stats.num_draft_tokens > 0
        accepted += state.stats.num_accepted_tokens
    assert accepted > 0  # the comparison exercised accepted drafts, not only bonus tokens


@pytest.mark.parametrize("temperature", [0.5, 1.0])
@pytest.mark.parametrize("name", ["dflash", "dflash_sampled_draft", "ddtree", "caddtree", "domino", "domino_pool",
                                  "dominotree", "cond_adaptive"])
def test_sampling_keeps_the_target_distribution(name, temperature, tiny_llama, drafter_dirs, monkeypatch, tmp_path):
    method = build(name, drafter_dirs, tiny_llama, monkeypatch, tmp_path)
    prompt = [7, 30, 31, 30, 31, 30]
    n = 300
    counts = [collections.Counter(
        tuple(generate(m, tiny_llama, prompt, max_new_tokens=2, temperature=temperature, seed=s).new_tokens)
        for s in range(n)) for m in (AR(), method)]
    keys = sorted(set(counts[0]) | set(counts[1]), key=lambda k: -(counts[0][k] + counts[1][k]))[:6]
    table = [[c[k] for k in keys] + [n - sum(c[k] for k in keys)] for c in counts]
    assert chi2_contingency(table).pvalue > 1e-3


def test_wrong_checkpoint_kind_fails_loudly(tiny_llama, drafter_dirs):
    with pytest.raises(ConfigError, match="Domino checkpoint"):
        dflash.DFlash(dflash.DFlashConfig(drafter=drafter_dirs["llama"]["domino"])).setup(tiny_llama)
    with pytest.raises(ConfigError, match="plain DFlash checkpoint"):
        dominotree.DominoTree(dominotree.DominoTreeConfig(drafter=drafter_dirs["llama"]["dflash"])).setup(tiny_llama)
    with pytest.raises(ConfigError, match="no dflash drafter is known"):
        ddtree.DDTree(ddtree.DDTreeConfig()).setup(tiny_llama)


def test_cond_adaptive_stops_by_cost_and_counts_cap_hits(tiny_llama, drafter_dirs, monkeypatch, tmp_path):
    """With a fixed cost model (not this machine's timings): a nearly free verify fills the cap every
    step; a verify whose cost grows steeply stops the tree early."""
    from decoding.drafting.verify_cost import VerifyCostModel

    method = build("cond_adaptive", drafter_dirs, tiny_llama, monkeypatch, tmp_path)
    ar = generate(AR(), tiny_llama, [7, 30, 31, 30], max_new_tokens=12).new_tokens
    for slope, saturates in ((1e-6, True), (0.2, False)):
        method.cost = VerifyCostModel([0, 10, 100], [0, 1000], [[1.0, 1.0 + 10 * slope, 1.0 + 100 * slope]] * 2, 0.1)
        state = generate(method, tiny_llama, [7, 30, 31, 30], max_new_tokens=12)
        assert state.new_tokens == ar
        steps, extra = state.stats.num_steps, state.stats.extra
        if saturates:
            assert extra["tree_nodes"] == 24 * steps and extra["budget_cap_hits"] == steps
        else:
            assert extra["tree_nodes"] < 24 * steps and extra["budget_cap_hits"] == 0


def test_sampled_domino_drafts_carry_their_pool_distribution_over_the_whole_vocabulary(tiny_llama, drafter_dirs,
                                                                                        monkeypatch, tmp_path):
    """At T > 0 with a candidate pool, every drafted position's distribution (the corrected softmax over the pool,
    scattered into the vocabulary; the uncorrected prefix over the whole vocabulary) sums to one, is zero outside
    the pool, and gives its own drafted token positive mass; the same seed drafts the same chain."""
    from decoding.engine.loop import DecodeState

    method = build("domino_pool", drafter_dirs, tiny_llama, monkeypatch, tmp_path)
    prefix = method.drafter.spec.pure_draft_prefix_len
    chains = []
    for _ in range(2):
        state = DecodeState(tiny_llama, [7, 30, 31, 30, 31, 30], 1.0, 8, set(), seed=5)
        out = tiny_llama.prefill(state.prompt_ids[:-1], method.prefill_hidden_layers())
        method.on_prefill(state, out)
        method.begin(state)
        tree = method.propose(state).tree
        chains.append(tree.tokens)
        for node in range(1, len(tree)):
            q = tree.draft_probs[node]
            assert q.shape == (tiny_llama.config.vocab_size,)
            assert torch.isclose(q.sum(), torch.tensor(1.0), atol=1e-5)
            assert q[tree.tokens[node]] > 0
            if node > prefix:  # a corrected position: support inside the pool of 20 candidates
                assert int((q > 0).sum()) <= 20
    assert chains[0] == chains[1]


@pytest.mark.parametrize("module", [domino, dflash])
def test_a_sampled_chain_is_verified_by_exact_match_unless_rejection_is_asked_for(module, tiny_llama, drafter_dirs,
                                                                                 monkeypatch, tmp_path):
    """The released DFlash and Domino verify a sampled draft by exact match: the chain carries no
    distributions (the engine then draws a target token per position); `verify=rejection` carries them.
    The draft itself is the same draw."""
    from decoding.engine.loop import DecodeState

    kind = "domino" if module is domino else "dflash"
    chains = {}
    for verify in ("exact", "rejection"):
        cfg = module.CONFIG(drafter=drafter_dirs["llama"][kind], sample_draft=True, verify=verify)
        method = get_class(cfg._target_)(cfg)
        method.setup(tiny_llama)
        state = DecodeState(tiny_llama, [7, 30, 31, 30, 31, 30], 1.0, 8, set(), seed=5)
        method.on_prefill(state, tiny_llama.prefill(state.prompt_ids[:-1], method.prefill_hidden_layers()))
        method.begin(state)
        chains[verify] = method.propose(state).tree
    assert all(q is None for q in chains["exact"].draft_probs)
    assert all(q is not None for q in chains["rejection"].draft_probs[1:])
    assert chains["exact"].tokens == chains["rejection"].tokens
    with pytest.raises(ConfigError, match="method.verify"):
        module.CONFIG(drafter="x", verify="typical")
    with pytest.raises(ConfigError, match="method.verify=rejection verifies a sampled draft"):
        module.CONFIG(drafter="x", verify="rejection", sample_draft=False)


@pytest.mark.parametrize("name", ["domino", "domino_pool", "dominotree"])
def test_graph_replayed_drafting_decodes_as_eager_with_one_capture_per_branch(name, tiny_llama, drafter_dirs,
                                                                              monkeypatch, tmp_path):
    """On CUDA, Domino's corrected chain and DominoTree's whole tree replay from CUDA graphs (method.cuda_graph).
    The replay is emulated here (decoding/engine/cuda_graph.py): the round's inputs copied into static buffers,
    the outputs written into buffers the next round overwrites; the methods' setup is made to ask for graphs
    as it does on a GPU. The same drafts and tokens as eager decoding at T = 0 and T = 1 (same seeds), and
    one capture per branch (T = 0, T > 0), not one per round."""
    from decoding.engine import cuda_graph

    eager = build(name, drafter_dirs, tiny_llama, monkeypatch, tmp_path)
    assert not eager.graphs.enabled  # a CPU model: no graphs
    asked = []
    monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what: asked.append(enabled) or
                        cuda_graph.GraphReplayer(enabled, what, emulate=True))
    graphed = build(name, drafter_dirs, tiny_llama, monkeypatch, tmp_path)
    assert asked == [True] and graphed.graphs.enabled
    drafts = {eager: [], graphed: []}  # every proposal's tree: a lossless run's tokens cannot show a wrong draft
    for method in drafts:
        propose = method.propose
        method.propose = lambda state, m=method, p=propose: drafts[m].append(p(state)) or drafts[m][-1]
    prompt = [7, 30, 31, 30, 31, 30]
    for temperature, seed in ((0.0, 0), (1.0, 4), (1.0, 5)):
        want, got = (generate(m, tiny_llama, prompt, max_new_tokens=24, temperature=temperature, seed=seed)
                     for m in (eager, graphed))
        assert got.new_tokens == want.new_tokens
    trees = {m: [(p.tree.tokens, p.tree.parents) for p in drafts[m]] for m in drafts}
    assert trees[graphed] == trees[eager] and len(trees[eager]) > 6
    assert max(len(tokens) for tokens, _ in trees[eager]) > 3  # drafts deeper than the uncorrected prefix
    assert graphed.graphs.captures == (1 if name == "dominotree" else 2)


def test_domino_asks_for_no_cuda_graph_when_compiled_or_switched_off(tiny_llama, drafter_dirs, monkeypatch):
    """torch.compile makes its own program of the chain (method.compile), so the chain is not also captured."""
    from decoding.engine import cuda_graph

    asked = []
    monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what: asked.append(enabled) or
                        cuda_graph.GraphReplayer(False, what))
    for overrides in ({"compile": True}, {"cuda_graph": False}):
        domino.Domino(domino.DominoConfig(drafter=drafter_dirs["llama"]["domino"], **overrides)).setup(tiny_llama)
    dominotree.DominoTree(dominotree.DominoTreeConfig(drafter=drafter_dirs["llama"]["domino"], cuda_graph=False)) \
        .setup(tiny_llama)
    assert asked == [False, False, False]


@pytest.mark.slow
def test_compiled_domino_chain_drafts_as_the_eager_one_and_decodes_as_ar(tiny_llama, drafter_dirs, monkeypatch,
                                                                        tmp_path):
    """method.compile=true (torch.compile of chain_picks, ~30 s per temperature branch on a CPU core): with the
    same inputs and noise it picks the eager chain's tokens and computes its corrected logits up to fused
    rounding; greedy decoding still equals AR, and a sampled run completes with the same seed's chain."""
    from decoding.engine.compiled import maybe_compiled
    from decoding.engine.sampling import Sampler
    from decoding.methods.domino import chain_picks

    method = build("domino_pool", drafter_dirs, tiny_llama, monkeypatch, tmp_path)
    compiled = maybe_compiled(chain_picks, True, "method.compile")
    head, gen = method.head, torch.Generator().manual_seed(0)
    table = head.input_table(method.embed)
    pool = torch.randperm(tiny_llama.config.vocab_size, generator=gen)[:20]
    z_proj = torch.randn(5, head.w2.shape[1], generator=gen)
    base_rows = torch.randn(5, 20, generator=gen)
    first = torch.tensor([7, 30])
    for noise in (None, Sampler(3).gumbel((5, 20))):
        args = (table, head.w_next_t, head.w2, z_proj, base_rows, noise, first, pool)
        (want, want_rows), (got, got_rows) = chain_picks(*args), compiled(*args)
        assert torch.equal(got, want)
        torch.testing.assert_close(got_rows, want_rows, rtol=1e-5, atol=1e-5)
    cfg = domino.DominoConfig(drafter=drafter_dirs["llama"]["domino"], candidate_pool=20, compile=True,
                              verify="rejection")  # as domino_pool, so that the sampled runs match
    fast = domino.Domino(cfg)
    fast.setup(tiny_llama)
    assert fast.chain is not chain_picks and method.chain is chain_picks  # the option chose the compiled chain
    ran = []
    compiled_chain = fast.chain
    fast.chain = lambda *args: ran.append(1) or compiled_chain(*args)
    prompt = [7, 30, 31, 30, 31, 30]
    assert generate(fast, tiny_llama, prompt, max_new_tokens=16).new_tokens == \
        generate(AR(), tiny_llama, prompt, max_new_tokens=16).new_tokens
    assert ran  # the method drafted with it
    ran.clear()
    sampled = [generate(m, tiny_llama, prompt, max_new_tokens=16, temperature=1.0, seed=4).new_tokens
               for m in (fast, method)]
    assert sampled[0] == sampled[1] and ran  # the sampled run too
