"""EAGLE-3 end to end on the tiny targets: a (random) drafter in the published format, drafting the
dynamic tree or the chain, reproduces AR exactly at T=0 and AR's distribution at T=1."""

import collections
import dataclasses
import json

import pytest
import torch

from decoding.engine.loop import generate
from decoding.methods.ar import AR
from decoding.drafting.eagle3_chain import Eagle3ChainDrafter
from decoding.methods.eagle3 import Eagle3, Eagle3Config
from pipeline.errors import ConfigError


def tiny_eagle3(target, folder, seed=0):
    """A random EAGLE-3 checkpoint for `target` (draft vocab: half the target's, mapped by d2t)."""
    from decoding.drafting.eagle3_drafter import Eagle3Drafter, Eagle3Spec, save_eagle3, vocab_mapping

    cfg = target.config
    spec = Eagle3Spec(hidden_size=cfg.hidden_size, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=cfg.vocab_size, draft_vocab_size=cfg.vocab_size // 2, target_hidden_size=cfg.hidden_size,
                      head_dim=cfg.hidden_size // 4, aux_layer_ids=[0, 1, 2])
    torch.manual_seed(seed)
    model = Eagle3Drafter(spec)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3) if p.dim() == 2 else torch.nn.init.uniform_(p, 0.5, 1.5)
    model.d2t, model.t2d = vocab_mapping(torch.arange(cfg.vocab_size) % 7, spec.draft_vocab_size)
    save_eagle3(model, folder, dtype=torch.float32)
    return str(folder)


PROMPT = [7, 30, 31, 32, 30, 31, 32, 30, 31, 40, 41]


@pytest.mark.parametrize("config", [dict(), dict(total_tokens=12, depth=3, top_k=3), dict(tree=False, chain_length=4),
                                    dict(tree=False, chain_policy="optimal", max_chain_length=3, draft_cost=0.01),
                                    dict(tree=False, chain_policy="optimal", draft_cost=10.0)],
                         ids=["paper-defaults", "small-tree", "chain", "chain-optimal", "chain-optimal-of-one"])
def test_greedy_equals_ar(tiny_target, tmp_path, config):
    method = Eagle3(Eagle3Config(drafter=tiny_eagle3(tiny_target, tmp_path / "eagle3"), **config))
    method.setup(tiny_target)
    ar = generate(AR(), tiny_target, PROMPT, max_new_tokens=40).new_tokens
    state = generate(method, tiny_target, PROMPT, max_new_tokens=40)
    assert state.new_tokens == ar
    assert state.stats.num_draft_tokens > 0 and state.stats.extra["drafter_forwards"] > 0
    if "chain_policy" in config:  # after 4 steps of chain_length = 5 drafts, at most 3 (1 where a draft costs 10 steps)
        shortest = 3 if config["draft_cost"] < 1 else 1
        assert state.stats.num_draft_tokens <= 4 * 5 + (state.stats.num_drafts - 4) * shortest
        assert "draft_rejections" in state.stats.extra
    one = generate(method, tiny_target, PROMPT[:1], max_new_tokens=8)  # a one-token prompt: no row to draft from yet
    assert one.new_tokens == generate(AR(), tiny_target, PROMPT[:1], max_new_tokens=8).new_tokens


@pytest.mark.parametrize("config", [dict(total_tokens=12, depth=3, top_k=3), dict(tree=False, chain_length=4)],
                         ids=["tree", "chain"])
def test_graph_replayed_tree_drafts_as_eager_with_one_capture_per_buffer(tiny_target, tmp_path, monkeypatch, caplog,
                                                                         config):
    """On CUDA the tree's (and the chain's) expansion replays from one CUDA graph per step (method.cuda_graph). The
    replay is emulated here (decoding/engine/cuda_graph.py: inputs copied into static buffers, the cache's buffers
    read in place, outputs overwritten by the next replay), with the setup made to ask for graphs as on a GPU. The
    same trees and tokens as eager decoding, over prompts whose cache outgrows its buffer: one capture per
    buffer (new buffers drop the old graph; the next prompt reuses the buffers and the graph), no warning."""
    from decoding.drafting.eagle3_drafter import Eagle3Cache
    from decoding.engine import cuda_graph

    monkeypatch.setattr(Eagle3Cache, "MIN_CAPACITY", 8)  # so these prompts need buffers of different sizes
    folder = tiny_eagle3(tiny_target, tmp_path / "eagle3")
    config = Eagle3Config(drafter=folder, **config)
    eager = Eagle3(config)
    eager.setup(tiny_target)
    assert not eager.graphs.enabled  # a CPU drafter: no graphs
    asked = []
    monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what: asked.append(enabled) or
                        cuda_graph.GraphReplayer(enabled, what, emulate=True))
    graphed = Eagle3(config)
    graphed.setup(tiny_target)
    assert asked == [True] and graphed.graphs.enabled
    drafts = {eager: [], graphed: []}
    buffers = []  # the cache buffers the graphed trees read, in order (kept alive: identity, not id())

    def seen(proposal):
        if not buffers or buffers[-1] is not graphed.cache.buffer_k:
            buffers.append(graphed.cache.buffer_k)
        return proposal

    for method in drafts:
        propose = method.propose
        method.propose = lambda state, m=method, p=propose: drafts[m].append(p(state)) or drafts[m][-1]
    graphed_propose = graphed.propose
    graphed.propose = lambda state: seen(graphed_propose(state))
    capacities = []
    for prompt, temperature in ((PROMPT, 0.0), (PROMPT[:4], 1.0), (PROMPT * 12, 0.0), (PROMPT[:2], 1.0)):
        want, got = (generate(m, tiny_target, prompt, max_new_tokens=30, temperature=temperature, seed=2)
                     for m in (eager, graphed))
        assert got.new_tokens == want.new_tokens
        capacities.append(graphed.cache.capacity)
    trees = {m: [(p.tree.tokens, p.tree.parents) for p in drafts[m]] for m in drafts}
    assert trees[graphed] == trees[eager] and len(trees[graphed]) > 20
    assert max(len(tokens) for tokens, _ in trees[graphed]) == (5 if not config.tree else 12)
    # sized for each prompt at its start: kept for the short one after the first, grown for the long one,
    # then shrunk (a short prompt does not attend over a long one's rows)
    assert capacities[1] == capacities[0] < capacities[2] > capacities[3] and len(buffers) == 3
    assert graphed.graphs.captures == len(buffers)  # one graph per buffer: none for the prompts that fit
    assert "captured" not in caplog.text
    off = []
    monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what: off.append(enabled) or
                        cuda_graph.GraphReplayer(False, what))
    Eagle3(Eagle3Config(drafter=folder, cuda_graph=False)).setup(tiny_target)
    assert off == [False]


@pytest.mark.slow
def test_compiled_expansion_drafts_as_eager_and_compiles_once_as_the_cache_grows(tiny_target, tmp_path, monkeypatch):
    """method.compile=true (torch.compile of the tree's expansion, ~35 s on a CPU core): the eager trees and
    AR's tokens, over prompts whose cache outgrows its buffer, compiled for any buffer size (one compiled graph,
    not one per growth); on CUDA it is not also captured (method.cuda_graph)."""
    from torch._dynamo.utils import counters

    from decoding.drafting.eagle3_drafter import Eagle3Cache
    from decoding.engine import cuda_graph

    monkeypatch.setattr(Eagle3Cache, "MIN_CAPACITY", 8)  # so these prompts need buffers of different sizes
    folder = tiny_eagle3(tiny_target, tmp_path / "eagle3")
    eager, fast = (Eagle3(Eagle3Config(drafter=folder, total_tokens=12, depth=3, top_k=3, compile=on)) for on in
                   (False, True))
    for m in (eager, fast):
        m.setup(tiny_target)
    assert eager.expand is None and fast.expand is not None
    drafts = {eager: [], fast: []}
    for method in drafts:
        propose = method.propose
        method.propose = lambda state, m=method, p=propose: drafts[m].append(p(state)) or drafts[m][-1]
    torch._dynamo.reset()  # a compile of another test's drafter would otherwise count or serve here
    graphs_before = counters["stats"]["unique_graphs"]
    capacities = set()
    for prompt in (PROMPT, PROMPT * 3):
        want, got = (generate(m, tiny_target, prompt, max_new_tokens=30) for m in (eager, fast))
        assert got.new_tokens == want.new_tokens == generate(AR(), tiny_target, prompt, max_new_tokens=30).new_tokens
        capacities.add(fast.cache.capacity)
    trees = {m: [(p.tree.tokens, p.tree.parents) for p in drafts[m]] for m in drafts}
    assert trees[fast] == trees[eager] and len(capacities) == 2
    assert counters["stats"]["unique_graphs"] - graphs_before == 1
    asked = []
    monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what: asked.append(enabled) or
                        cuda_graph.GraphReplayer(False, what))
    Eagle3(Eagle3Config(drafter=folder, compile=True)).setup(tiny_target)
    assert asked == [False]


def test_sampling_is_lossless_in_distribution_of_the_first_tokens(tiny_llama, tmp_path):
    from scipy.stats import chi2_contingency

    method = Eagle3(Eagle3Config(drafter=tiny_eagle3(tiny_llama, tmp_path / "eagle3"), total_tokens=8, depth=2,
                                 top_k=3))
    method.setup(tiny_llama)
    n = 300
    counts = []
    for m in (AR(), method):
        counts.append(collections.Counter(
            tuple(generate(m, tiny_llama, PROMPT, max_new_tokens=2, temperature=1.0, seed=s).new_tokens)
            for s in range(n)))
    keys = sorted(set(counts[0]) | set(counts[1]), key=lambda k: -(counts[0][k] + counts[1][k]))[:8]
    table = [[c[k] for k in keys] + [n - sum(c[k] for k in keys)] for c in counts]
    assert chi2_contingency(table).pvalue > 1e-3


def test_a_drafter_for_another_target_is_one_line(tiny_llama, tmp_path):
    folder = tiny_eagle3(tiny_llama, tmp_path / "eagle3")
    config = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 7, 9]  # a deeper target's layers
    (tmp_path / "eagle3" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"does not fit this target .*layers \[1, 7, 9\]: three of 0..2"):
        Eagle3(Eagle3Config(drafter=folder)).setup(tiny_llama)
    # the last layer's output: HF's hidden_states (training) has it after the final norm, the engine before
    with pytest.raises(ConfigError, match=r"layers \[0, 1, 3\]: three of 0..2"):
        Eagle3(Eagle3Config(drafter=folder, layer_ids=[0, 1, 3])).setup(tiny_llama)
    with pytest.raises(ConfigError, match=r"drafter=eagle3: .* does not fit this target"):
        Eagle3ChainDrafter(folder, tiny_llama)
    with pytest.raises(ConfigError, match="no EAGLE-3 drafter is known for this model"):
        Eagle3(Eagle3Config()).setup(tiny_llama)


def test_eagle3_drafts_for_sd_and_spec_cascade(tiny_target, tmp_path):
    from decoding.drafting.drafter import DrafterConfig
    from decoding.methods.sd import SDConfig, SpeculativeDecoding
    from decoding.methods.spec_cascade import SpecCascadeConfig, SpeculativeCascade

    drafter = DrafterConfig(name="eagle3", kind="eagle3", checkpoint=tiny_eagle3(tiny_target, tmp_path / "e3"), gamma=4)
    sd = SpeculativeDecoding(SDConfig(), drafter=drafter)
    sd.setup(tiny_target)
    ar = generate(AR(), tiny_target, PROMPT, max_new_tokens=30).new_tokens
    state = generate(sd, tiny_target, PROMPT, max_new_tokens=30)
    assert state.new_tokens == ar and state.stats.num_draft_tokens > 0 and state.stats.extra["drafter_forwards"] > 0
    sampled = generate(sd, tiny_target, PROMPT, max_new_tokens=12, temperature=1.0, seed=3)
    assert len(sampled.new_tokens) == 12  # drafts carry their distribution over the full vocabulary at T > 0
    cascade = SpeculativeCascade(SpecCascadeConfig(), drafter=drafter)
    cascade.setup(tiny_target)
    assert generate(cascade, tiny_target, PROMPT, max_new_tokens=12).stats.num_draft_tokens > 0
    # γ changing from step to step (drafter.gamma_policy=optimal): the chain's scratch rows follow, output is AR's
    varying = SpeculativeDecoding(SDConfig(), drafter=dataclasses.replace(
        drafter, gamma=6, gamma_policy="optimal", max_gamma=3, draft_cost=0.01))
    varying.setup(tiny_target)
    state = generate(varying, tiny_target, PROMPT, max_new_tokens=30)
    assert state.new_tokens == ar and state.stats.num_draft_tokens < 6 * state.stats.num_drafts
    with pytest.raises(ConfigError, match="no EAGLE-3 checkpoint is known"):
        DrafterConfig(kind="eagle3")


def test_sd_with_the_eagle3_drafter_keeps_the_targets_distribution(tiny_llama, tmp_path):
    """The drafter samples over its draft vocabulary with the draft's uniforms drawn at once and hands the
    distributions scattered over the full vocabulary: speculative sampling on them stays lossless."""
    from scipy.stats import chi2_contingency

    from decoding.drafting.drafter import DrafterConfig
    from decoding.methods.sd import SDConfig, SpeculativeDecoding

    drafter = DrafterConfig(name="eagle3", kind="eagle3", checkpoint=tiny_eagle3(tiny_llama, tmp_path / "e3"), gamma=3)
    sd = SpeculativeDecoding(SDConfig(), drafter=drafter)
    sd.setup(tiny_llama)
    n = 300
    # different seeds for the two methods: chi-square needs independent samples
    counts = [collections.Counter(tuple(generate(m, tiny_llama, PROMPT, max_new_tokens=2, temperature=1.0,
                                                 seed=offset + s).new_tokens) for s in range(n))
              for m, offset in ((AR(), 0), (sd, n))]
    keys = sorted(set(counts[0]) | set(counts[1]), key=lambda k: -(counts[0][k] + counts[1][k]))[:8]
    table = [[c[k] for k in keys] + [n - sum(c[k] for k in keys)] for c in counts]
    assert chi2_contingency(table).pvalue > 1e-3


def via_sd_with_eagle3(target, tmp_path, **config):
    from decoding.drafting.drafter import DrafterConfig
    from decoding.drafting.routing import save_mask
    from decoding.methods.via_sd import VIASD, VIASDConfig

    save_mask(tmp_path / "mask.json", [2], num_layers=4, model="tiny")
    drafter = DrafterConfig(name="eagle3", kind="eagle3", checkpoint=tiny_eagle3(target, tmp_path / "e3"), gamma=4)
    method = VIASD(VIASDConfig(mask=str(tmp_path / "mask.json"), **config), drafter=drafter)
    method.setup(target)
    return method, drafter


def test_the_sd_chain_after_slim_settled_tokens_is_the_argmax_path_after_them(tiny_target, tmp_path, monkeypatch):
    """drafter=eagle3 drafting after tokens without target features yet (VIA-SD's slim tier settled them): they
    are fed on the drafter's own states, their rows kept in the buffer after the cache's, and the chain drafts
    after them; a second draft feeds only the tail's new tokens, also when the buffer grows in between (the fed
    rows are copied along). Checked against the same path recomputed by concatenation."""
    from decoding.drafting.eagle3_chain import Eagle3ChainDrafter
    from decoding.drafting.eagle3_drafter import Eagle3Cache
    from decoding.engine.sampling import Sampler

    monkeypatch.setattr(Eagle3Cache, "MIN_CAPACITY", 8)
    drafter = Eagle3ChainDrafter(tiny_eagle3(tiny_target, tmp_path / "e3"), tiny_target)
    model, embed = drafter.model, drafter.embed
    g = torch.Generator().manual_seed(0)
    features = torch.randn(6, 3 * tiny_target.config.hidden_size, generator=g)
    sequence = [7, 30, 31, 32, 33, 34, 35, 40, 41, 42]

    def reference(tail, gamma=4):
        """The drafts and their distributions over the target's vocabulary (T = 1 softmax of their logits)."""
        cache = model.new_cache()
        with torch.inference_mode():
            h = model.extend(cache, features, embed(torch.tensor(sequence[1:7])))[-1:]
            past_k, past_v, out, dists = cache.keys, cache.values, [], []
            for tok in [*tail, None]:  # the tail, then the drafts
                while tok is None and len(out) < gamma:
                    logits = model.logits(h)[0]
                    dists.append(torch.zeros(tiny_target.config.vocab_size).index_copy_(
                        0, drafter.draft_to_target, torch.softmax(logits, -1)))
                    out.append(int(model.to_target_ids(logits.argmax())))
                    if len(out) < gamma:
                        h, past_k, past_v = model.step(embed(torch.tensor(out[-1:])), h,
                                                       torch.tensor([past_k.shape[1]]), past_k, past_v)
                if tok is not None:
                    h, past_k, past_v = model.step(embed(torch.tensor([tok])), h, torch.tensor([past_k.shape[1]]),
                                                   past_k, past_v)
        return out, torch.stack(dists)

    def same(drafted, expected):
        assert drafted[0] == expected[0]
        torch.testing.assert_close(drafted[1], expected[1], rtol=1e-5, atol=1e-6)

    drafter.begin(sequence, rows_expected=0)
    drafter.pending = (features, sequence[1:7])  # target-fed rows for tokens 0-5: the tail is tokens 7-9
    same(drafter.draft(sequence, 4, 0.0, Sampler(0)), reference(sequence[7:]))
    buffer, passes = drafter.cache.buffer_k, drafter.passes
    assert drafter.cache.capacity == 16  # grown once for the tail (from 8)
    longer = sequence + [50, 51, 52, 53, 54, 55, 56, 57]  # 6 cached + 11 tail rows: past the capacity again
    second = drafter.draft(longer, 4, 0.0, Sampler(0))
    assert drafter.cache.buffer_k is not buffer and drafter.passes - passes == 8 + 3  # the new tail, then drafts
    same(second, reference(longer[7:]))


@pytest.mark.parametrize("method_name", ["sd", "via_sd"])
def test_the_eagle3_chain_from_its_cuda_graph_drafts_as_eager(tiny_target, tmp_path, monkeypatch, method_name):
    """drafter=eagle3 on CUDA replays each draft's chain from a CUDA graph (drafter.cuda_graph), one per
    temperature, γ and cache buffer; emulated here, with the setup made to ask for graphs as on a GPU. The same
    drafts, distributions and tokens as eager drafting at T = 0 and T = 1, also where VIA-SD's slim tier
    settles tokens that the drafter feeds on its own states (rows kept in the buffer past the cache's)."""
    from decoding.drafting.eagle3_drafter import Eagle3Cache
    from decoding.engine import cuda_graph
    from decoding.methods.sd import SDConfig, SpeculativeDecoding

    monkeypatch.setattr(Eagle3Cache, "MIN_CAPACITY", 8)  # so these prompts need buffers of different sizes
    real = cuda_graph.graphs_for

    def build(graphed):
        if graphed:
            monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what:
                                cuda_graph.GraphReplayer(enabled, what, emulate=True))
        if method_name == "via_sd":
            method, _ = via_sd_with_eagle3(tiny_target, tmp_path / str(graphed), slim_threshold=0.1)
        else:
            from decoding.drafting.drafter import DrafterConfig

            drafter = DrafterConfig(name="eagle3", kind="eagle3", gamma=4,
                                    checkpoint=tiny_eagle3(tiny_target, tmp_path / f"e3{graphed}"))
            method = SpeculativeDecoding(SDConfig(), drafter=drafter)
            method.setup(tiny_target)
        monkeypatch.setattr(cuda_graph, "graphs_for", real)
        return method

    eager, graphed = build(False), build(True)
    assert not eager.drafter.graphs.enabled and graphed.drafter.graphs.enabled
    drafts = {eager: [], graphed: []}
    for m in drafts:
        draft = m.drafter.draft

        def recorded(*args, m=m, draft=draft, **kwargs):
            tokens, dists = draft(*args, **kwargs)
            drafts[m].append((tokens, None if dists is None else dists.clone()))
            return tokens, dists

        m.drafter.draft = recorded
    settled = 0
    for prompt, temperature, seed in ((PROMPT, 0.0, 0), (PROMPT * 3, 1.0, 3), (PROMPT, 1.0, 4)):
        want, got = (generate(m, tiny_target, prompt, max_new_tokens=30, temperature=temperature, seed=seed)
                     for m in (eager, graphed))
        assert got.new_tokens == want.new_tokens
        assert got.stats.extra["drafter_forwards"] == want.stats.extra["drafter_forwards"]
        settled += got.stats.extra.get("settled_slim", 0)
    assert len(drafts[graphed]) == len(drafts[eager]) > 10
    for (got, got_dists), (want, want_dists) in zip(drafts[graphed], drafts[eager]):
        assert got == want and (got_dists is None) == (want_dists is None)
        if got_dists is not None:
            assert torch.equal(got_dists, want_dists)
    assert settled > 0 or method_name == "sd"  # VIA-SD's slim tier settled tokens fed on the drafter's states
    assert 2 <= graphed.drafter.graphs.captures <= 8  # per branch and buffer, not per draft
    twice = [generate(graphed, tiny_target, PROMPT, max_new_tokens=30).stats.extra["drafter_forwards"]
             for _ in range(2)]
    assert twice[0] == twice[1]  # the drafter's passes are counted per prompt, not summed over a run


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_via_sd_with_eagle3_forced_to_the_full_verifier_is_sd(tiny_target, tmp_path, temperature):
    """VIA-SD's separate drafter can be EAGLE-3; with tiers 1-2 off it is sd with that drafter."""
    from decoding.methods.sd import SDConfig, SpeculativeDecoding

    via, drafter = via_sd_with_eagle3(tiny_target, tmp_path, zones="gated", agree_threshold=2.0,
                                      slim_threshold=2.0)
    sd = SpeculativeDecoding(SDConfig(), drafter=drafter)
    sd.setup(tiny_target)
    for seed in range(2):
        a = generate(sd, tiny_target, PROMPT, max_new_tokens=20, temperature=temperature, seed=seed)
        b = generate(via, tiny_target, PROMPT, max_new_tokens=20, temperature=temperature, seed=seed)
        assert a.new_tokens == b.new_tokens and b.stats.num_accepted_tokens == a.stats.num_accepted_tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_via_sd_slim_settled_tokens_reach_eagle3_as_target_features(tiny_target, tmp_path, temperature):
    """Tokens the slim tier settles are fed on the drafter's own states until the next full pass;
    that pass's catch-up taps replace them, so the drafter's cache equals one built from the target's
    features of the whole committed text (as a fresh prefill would give it)."""
    from decoding.engine.target import TargetModel

    via, _ = via_sd_with_eagle3(tiny_target, tmp_path, slim_threshold=0.1)
    lagged: set[int] = set()

    def watch(state):  # positions committed while the target's cache lagged behind
        lagged.update(range(state.target.cache_len, len(state.sequence) - 1))

    state = generate(via, tiny_target, PROMPT, max_new_tokens=40, temperature=temperature, seed=0, on_step=watch)
    drafter = via.drafter
    rows = drafter.cache.length
    assert state.stats.extra.get("escalations", 0) > 0 and state.stats.extra.get("settled_slim", 0) > 0
    assert any(pos < rows for pos in lagged), "no slim-settled token got its target features later"
    # each committed token is fed to the drafter at most once on its own states: no re-feeding of the tail
    assert state.stats.extra["drafter_forwards"] <= state.stats.num_steps * (via.gamma + 1) + len(state.new_tokens)
    fresh = TargetModel(tiny_target.model)
    taps = fresh.prefill(state.sequence[:rows], drafter.hidden_layers).hidden
    features = torch.cat([taps[layer] for layer in drafter.hidden_layers], dim=-1)
    cache = drafter.model.new_cache()
    drafter.model.extend(cache, features, drafter.embed(torch.tensor(state.sequence[1:rows + 1])))
    torch.testing.assert_close(drafter.cache.keys, cache.keys, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(drafter.cache.values, cache.values, atol=1e-5, rtol=1e-4)


def test_via_sd_with_eagle3_on_a_one_token_prompt_runs_the_full_target_first(tiny_target, tmp_path):
    """Before EAGLE-3 has a row to draft from, the step is the full target's own (no slim-only text)."""
    via, _ = via_sd_with_eagle3(tiny_target, tmp_path, slim_threshold=0.0)
    state = generate(via, tiny_target, PROMPT[:1], max_new_tokens=6, temperature=1.0, seed=2)
    assert len(state.new_tokens) == 6 and state.stats.extra.get("escalations", 0) >= 1
    assert state.stats.target_forwards > state.stats.extra.get("slim_forwards", 0)


def test_cost_aware_budget_trims_the_tree_by_the_profiled_cost_and_stays_lossless(tiny_target, tmp_path, monkeypatch):
    """method.budget=cost_aware: CaDDTree's stop on EAGLE-2's reranked nodes. Profiled here (cached under the test's
    cache dir): greedy output equals AR. With a cost curve made flat every node pays and the whole tree is kept;
    with one flat to 4 nodes and then rising, exactly 4 are kept every step (a 5th would need a path probability
    above a quarter of 1 + the four before it, each at least its own), and they are the 4 best by score: the tree
    EAGLE-2's rerank keeps with total_tokens = 5."""
    from decoding.drafting.verify_cost import VerifyCostModel
    from decoding.methods import eagle3 as eagle3_module

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    folder = tiny_eagle3(tiny_target, tmp_path / "eagle3")
    profile = dict(profile_node_counts=[0, 1, 2, 4, 8, 11], profile_context_lengths=[8, 64], profile_repeats=1)
    config = Eagle3Config(drafter=folder, total_tokens=12, depth=3, top_k=3, budget="cost_aware", **profile)
    method = Eagle3(config)
    method.setup(tiny_target)
    assert method.cost.max_nodes == 11 and list((tmp_path / "cache" / "cost_models").iterdir())
    ar = generate(AR(), tiny_target, PROMPT, max_new_tokens=30).new_tokens
    state = generate(method, tiny_target, PROMPT, max_new_tokens=30)
    assert state.new_tokens == ar and "tree_nodes" in state.stats.extra
    original = eagle3_module.dynamic_tree
    pairs = []

    def both(drafter, cache, h_last, embed, root, top_k, depth, total, graphs=None, expand=None, admit=None):
        best_four, _ = original(drafter, cache, h_last, embed, root, top_k, depth, 5, graphs, expand)
        pairs.append((original(drafter, cache, h_last, embed, root, top_k, depth, total, graphs, expand, admit),
                      best_four))
        return pairs[-1][0]

    monkeypatch.setattr(eagle3_module, "dynamic_tree", both)
    counts = [0, 1, 2, 4, 8, 11]
    for name, curve in (("flat", [1.0] * 6), ("knee", [1.0, 1.0, 1.0, 1.0, 2.0, 3.0])):
        method.cost = VerifyCostModel(counts, [8], [curve], draft_s=0.0)
        pairs.clear()
        assert generate(method, tiny_target, PROMPT, max_new_tokens=30).new_tokens == ar
        assert pairs
        for (tree, _), best_four in pairs:
            if name == "flat":  # every node adds probability at no cost
                assert len(tree) - 1 == 11
            else:
                assert (tree.tokens, tree.parents) == (best_four.tokens, best_four.parents) and len(tree) == 5
    with pytest.raises(ConfigError, match="budget=cost_aware trims the dynamic tree"):
        Eagle3Config(drafter=folder, tree=False, budget="cost_aware")
    with pytest.raises(ConfigError, match=r"profile_node_counts ends at 4 but method.total_tokens - 1=11"):
        Eagle3Config(drafter=folder, total_tokens=12, budget="cost_aware", profile_node_counts=[0, 2, 4])
