"""The EAGLE-3 drafter: the published checkpoint format (config fields, tensor names, d2t/t2d, the
official .bin and vLLM's renaming) on scaled-down fixtures, and EAGLE-2's dynamic tree against a
node-by-node reference."""

import json

import pytest
import torch

from decoding.drafting.eagle3_drafter import (Eagle3Drafter, Eagle3Spec, load_eagle3, save_eagle3, vocab_mapping)
from decoding.drafting.eagle_tree import dynamic_tree
from pipeline.errors import ConfigError

VOCAB, DRAFT_VOCAB, HIDDEN = 40, 24, 32


def published_config(**extra) -> dict:
    """Field names of the SpecForge / SGLang EAGLE-3 configs (LlamaForCausalLMEagle3), scaled down."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": HIDDEN, "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "target_hidden_size": 48, "hidden_act": "silu", **extra}


def published_tensors(seed=0, embeddings=False) -> dict:
    """The tensor names and shapes of a published checkpoint (q/k/v read 2H, fc reads 3 * target H)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    used = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    state = {
        "midlayer.self_attn.q_proj.weight": w(32, 64), "midlayer.self_attn.k_proj.weight": w(16, 64),
        "midlayer.self_attn.v_proj.weight": w(16, 64), "midlayer.self_attn.o_proj.weight": w(32, 32),
        "midlayer.mlp.gate_proj.weight": w(48, 32), "midlayer.mlp.up_proj.weight": w(48, 32),
        "midlayer.mlp.down_proj.weight": w(32, 48), "midlayer.input_layernorm.weight": 1 + w(32),
        "midlayer.hidden_norm.weight": 1 + w(32), "midlayer.post_attention_layernorm.weight": 1 + w(32),
        "fc.weight": w(32, 144), "norm.weight": 1 + w(32), "lm_head.weight": w(DRAFT_VOCAB, 32),
        "d2t": used - torch.arange(DRAFT_VOCAB), "t2d": t2d,
    }
    if embeddings:
        state["embed_tokens.weight"] = w(VOCAB, HIDDEN)
    return state


def write_checkpoint(folder, config, state, fmt="safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_a_published_checkpoint_loads_with_its_vocab_mapping_and_layer_ids(tmp_path):
    state = published_tensors()
    cfg = published_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 14, 26], "use_aux_hidden_state": True})
    model = load_eagle3(str(write_checkpoint(tmp_path / "sf", cfg, state)))
    spec = model.spec
    assert (spec.hidden_size, spec.target_hidden_size, spec.head_dim, spec.draft_vocab_size) == (32, 48, 8, 24)
    assert spec.rope_theta == 1e6 and spec.layer_ids(30) == [1, 14, 26]  # SpecForge ids are output-of-layer ids
    assert torch.equal(model.d2t, state["d2t"]) and torch.equal(model.t2d, state["t2d"])
    ids = torch.arange(DRAFT_VOCAB)
    assert torch.equal(model.to_target_ids(ids), state["t2d"].nonzero()[:, 0])  # draft i -> target i + d2t[i]
    assert model.embed_tokens is None  # the target's embeddings are used
    # vLLM / EAGLE ids name layer inputs (2, L//2, L-3): the same layers as SpecForge's 1, L//2-1, L-4
    vllm = Eagle3Spec.from_config(published_config(eagle_aux_hidden_state_layer_ids=[2, 15, 27]))
    assert vllm.layer_ids(30) == [1, 14, 26]
    assert Eagle3Spec.from_config(published_config()).layer_ids(30) == [1, 14, 26]  # EAGLE's default choice


def test_the_official_bin_and_vllm_names_load_to_the_same_model(tmp_path):
    state = published_tensors(embeddings=True)
    reference = load_eagle3(str(write_checkpoint(tmp_path / "a", published_config(), state)))
    official = load_eagle3(str(write_checkpoint(tmp_path / "b", published_config(), state, fmt="bin")))
    renamed = {k.replace("midlayer.", "layers.0.").replace("d2t", "draft_id_to_target_id"): v for k, v in state.items()}
    vllm = load_eagle3(str(write_checkpoint(tmp_path / "c", published_config(), renamed)))
    for other in (official, vllm):
        assert other.embed_tokens is not None
        for (name, a), (_, b) in zip(reference.state_dict().items(), other.state_dict().items()):
            assert torch.equal(a, b), name


def test_a_checkpoint_that_does_not_fit_is_one_line(tmp_path):
    state = published_tensors()
    with pytest.raises(ConfigError, match=r"fc.weight has shape \(32, 144\), config.json implies \(32, 96\)"):
        load_eagle3(str(write_checkpoint(tmp_path / "a", published_config(target_hidden_size=32), state)))
    del state["d2t"]
    with pytest.raises(ConfigError, match=r"tensor names do not match the EAGLE-3 layout \(missing \['d2t'\]"):
        load_eagle3(str(write_checkpoint(tmp_path / "b", published_config(), state)))
    for variant in ({"norm_output": False}, {"fc_norm": True}):  # SpecForge variants we do not implement
        with pytest.raises(ConfigError, match="norm_output=false / fc_norm variants are not supported"):
            Eagle3Spec.from_config(published_config(**variant))
    with pytest.raises(ConfigError, match="rope type 'llama3' is not supported"):
        Eagle3Spec.from_config(published_config(rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ConfigError, match="not an EAGLE-3 draft config"):
        Eagle3Spec.from_config({"hidden_size": 32})


def test_a_checkpoint_without_t2d_gets_it_from_d2t(tmp_path):
    """vLLM reads d2t only, so a checkpoint may carry no t2d: it is the set of target ids d2t maps to."""
    state = published_tensors()
    t2d = state.pop("t2d")
    model = load_eagle3(str(write_checkpoint(tmp_path / "a", published_config(), state)))
    assert torch.equal(model.t2d, t2d)


def test_save_and_load_round_trip_keeps_the_mapping(tmp_path):
    model = load_eagle3(str(write_checkpoint(tmp_path / "a", published_config(), published_tensors())))
    save_eagle3(model, tmp_path / "saved", dtype=torch.float32)
    again = load_eagle3(str(tmp_path / "saved"))
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_bf16_load_casts_the_weights_only(tmp_path):
    """bf16 weights; the vocab mapping keeps its integer/bool types and RoPE's inv_freq stays fp32."""
    model = load_eagle3(str(write_checkpoint(tmp_path / "a", published_config(), published_tensors())), dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.d2t.dtype == torch.long and model.t2d.dtype == torch.bool and model.inv_freq.dtype == torch.float32


def test_vocab_mapping_keeps_the_most_frequent_ids_in_order():
    counts = torch.tensor([5, 0, 9, 1, 7, 0, 3])
    d2t, t2d = vocab_mapping(counts, 3)
    assert t2d.nonzero()[:, 0].tolist() == [0, 2, 4] and (torch.arange(3) + d2t).tolist() == [0, 2, 4]


# ------------------------------------------------------------------------------------------- the tree
def random_drafter(tmp_path, seed=0) -> Eagle3Drafter:
    return load_eagle3(str(write_checkpoint(tmp_path / f"d{seed}", published_config(), published_tensors(seed))))


def primed(drafter, n=6, seed=0):
    """A drafter cache holding n rows from random target features, and the last row's h."""
    g = torch.Generator().manual_seed(seed)
    embed = torch.nn.Embedding(VOCAB, HIDDEN)
    torch.nn.init.normal_(embed.weight, generator=g)
    cache = drafter.new_cache()
    features = torch.randn(n, 144, generator=g)
    h = drafter.extend(cache, features, embed(torch.randint(0, VOCAB, (n,), generator=g)))
    return cache, h[-1], embed


def node_h(drafter, cache, h_last, embed, path_tokens):
    """The reference: a node's h recomputed on its own, its root path run as a causal chain."""
    h = h_last[None]
    past_k, past_v = cache.keys, cache.values
    for i, tok in enumerate(path_tokens):
        h, past_k, past_v = drafter.step(embed(torch.tensor([tok])), h, torch.tensor([cache.length + i]), past_k, past_v)
    return h[0]


def reference_tree(drafter, cache, h_last, embed, top_k, depth, total_tokens):
    """EAGLE-2's selection, one node at a time: (token path, score) of every kept node."""
    def children(path, h):
        logp = torch.log_softmax(drafter.logits(h[None])[0], -1)
        values, ids = torch.topk(logp, top_k)
        return [(path + [int(drafter.to_target_ids(i))], float(v)) for v, i in zip(values, ids)]

    first = children([], h_last)
    pool = list(first)
    frontier = first
    for level in range(depth):
        kids = []
        for path, score in frontier:
            kids += [(p, score + s) for p, s in children(path, node_h(drafter, cache, h_last, embed, path))]
        pool += kids
        frontier = sorted(kids, key=lambda c: -c[1])[:top_k]
    return sorted(pool, key=lambda c: -c[1])[:total_tokens - 1]


@pytest.mark.parametrize(("top_k", "depth", "total_tokens"), [(3, 3, 12), (4, 2, 30), (2, 4, 60)])
def test_the_dynamic_tree_keeps_the_nodes_of_the_node_by_node_reference(tmp_path, top_k, depth, total_tokens):
    drafter = random_drafter(tmp_path)
    cache, h_last, embed = primed(drafter)
    with torch.inference_mode():
        tree, passes = dynamic_tree(drafter, cache, h_last, embed, root=7, top_k=top_k, depth=depth,
                                    total_tokens=total_tokens)
        expected = reference_tree(drafter, cache, h_last, embed, top_k, depth, total_tokens)
    assert passes == depth and len(tree) == min(total_tokens, 1 + top_k + depth * top_k * top_k)
    paths = sorted(tuple(tree.tokens[i] for i in tree.path_to(n)[1:]) for n in range(1, len(tree)))
    assert paths == sorted(tuple(p) for p, _ in expected)
    assert max(tree.depths) <= depth + 1 and tree.tokens[0] == 7
    assert cache.length == 6  # the expansion's rows are scratch: the cache keeps only the committed rows


def test_the_tree_expansion_reads_nothing_on_the_host_and_masks_the_buffer_past_the_cache(tmp_path):
    """The expansion is what a CUDA graph holds (method.cuda_graph): no device value read on the host (a capture
    would fail on one), and rows of the buffer between the cache's length and the scratch rows are masked, so
    leftovers there (a longer earlier prompt) change nothing."""
    from decoding.drafting.eagle_tree import expand_tree
    from decoding.engine.static_forward import _HostReads

    drafter = random_drafter(tmp_path)
    cache, h_last, embed = primed(drafter)
    with torch.inference_mode():
        tree, _ = dynamic_tree(drafter, cache, h_last, embed, root=7, top_k=3, depth=3, total_tokens=12)
        assert cache.capacity > cache.length  # room past the cache: garbage there must not count
        cache.buffer_k[:, cache.length:cache.capacity] = 1e3
        cache.buffer_v[:, cache.length:cache.capacity] = -1e3
        again, _ = dynamic_tree(drafter, cache, h_last, embed, root=7, top_k=3, depth=3, total_tokens=12)
        reads = _HostReads()
        with reads:
            expand_tree(h_last, cache.buffer_k, cache.buffer_v, cache.length_t, drafter, embed, k=3, depth=3, keep=11,
                        scratch=cache.scratch)
    assert (again.tokens, again.parents) == (tree.tokens, tree.parents)
    assert reads.count == 0


def test_a_chain_of_changing_length_keeps_its_buffers_and_drafts_as_with_exact_scratch(tmp_path):
    """chain_policy=optimal: lengths change step to step; the scratch stays at the longest chain's (no new buffers,
    so a captured graph per length survives), and a shorter chain over the larger scratch drafts what it drafts
    on a cache with exactly its own scratch."""
    drafter = random_drafter(tmp_path)
    cache, h_last, embed = primed(drafter)
    with torch.inference_mode():
        dynamic_tree(drafter, cache, h_last, embed, root=7, top_k=1, depth=4, total_tokens=6)
        cache.take_moved()
        for depth in (1, 3, 0, 4):
            chain, _ = dynamic_tree(drafter, cache, h_last, embed, root=7, top_k=1, depth=depth, total_tokens=depth + 2)
            assert not cache.take_moved() and cache.scratch == 4
            exact = primed(drafter)[0]  # the same rows, its scratch made for this depth alone
            want, _ = dynamic_tree(drafter, exact, h_last, embed, root=7, top_k=1, depth=depth, total_tokens=depth + 2)
            assert exact.scratch == depth
            assert (chain.tokens, chain.parents) == (want.tokens, want.parents) and len(chain) == depth + 2


@pytest.mark.parametrize("length", [1, 4])
def test_the_width_one_tree_is_the_argmax_chain(tmp_path, length):
    """The chain mode (method.tree=false) is the tree of width one: each draft the argmax after its
    predecessors, recomputed here on its own."""
    drafter = random_drafter(tmp_path, seed=1)
    cache, h_last, embed = primed(drafter, seed=1)
    with torch.inference_mode():
        drafted, passes = dynamic_tree(drafter, cache, h_last, embed, root=3, top_k=1, depth=length - 1,
                                       total_tokens=length + 1)
    assert drafted.is_chain and passes == length - 1
    path = []
    for _ in range(length):  # every draft is the argmax after its predecessors, recomputed on its own
        h = node_h(drafter, cache, h_last, embed, path)
        path.append(int(drafter.to_target_ids(drafter.logits(h[None])[0].argmax())))
    assert drafted.tokens == [3, *path]


def test_the_sd_chain_drafts_the_argmax_path_past_leftovers_and_reads_nothing_on_the_host(tmp_path):
    """drafter=eagle3's chain (`draft_chain`, what a CUDA graph holds): at T = 0 each draft is the argmax after its
    predecessors, recomputed on its own; rows of the buffer past the cache (a longer earlier prompt's) are masked
    out; no device value is read on the host."""
    from decoding.drafting.eagle3_chain import draft_chain
    from decoding.engine.static_forward import _HostReads

    drafter = random_drafter(tmp_path, seed=2)
    cache, h_last, embed = primed(drafter, seed=2)
    identity = torch.arange(drafter.spec.draft_vocab_size)
    with torch.inference_mode():
        cache.reserve(0, scratch=3)
        cache.buffer_k[:, cache.length:cache.capacity] = 1e3
        cache.buffer_v[:, cache.length:cache.capacity] = -1e3
        reads = _HostReads()
        with reads:
            tokens, rows = draft_chain(h_last[None], None, cache.buffer_k, cache.buffer_v, cache.length_t,
                                       cache.capacity, drafter, embed, identity, gamma=4, temperature=0.0)
        path = []
        for _ in range(4):
            h = node_h(drafter, cache, h_last, embed, path)
            path.append(int(drafter.logits(h[None])[0].argmax()))
    assert tokens.tolist() == path and rows.shape == (4, drafter.spec.draft_vocab_size)
    assert reads.count == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_on_a_gpu_the_tree_and_the_chain_replay_from_real_cuda_graphs_as_eager():
    """Real captures (the CPU tests emulate them): the tree's expansion and the sd chain, captured once and
    replayed over several steps whose cache grows in place (within its buffer), give the eager tensors."""
    from decoding.drafting.eagle3_chain import draft_chain
    from decoding.engine.cuda_graph import GraphReplayer
    from decoding.engine.sampling import Sampler

    import tempfile
    from pathlib import Path

    drafter = random_drafter(Path(tempfile.mkdtemp())).to("cuda")
    g = torch.Generator().manual_seed(0)
    embed = torch.nn.Embedding(VOCAB, HIDDEN).to("cuda")
    graphs = GraphReplayer(True, "method.cuda_graph")
    cache = drafter.new_cache()
    identity = torch.arange(DRAFT_VOCAB, device="cuda")
    sampler = Sampler(0, "cuda")
    with torch.inference_mode():
        for step in range(6):  # 6, then 3 rows a step: 21 rows, past MIN_CAPACITY only if it were smaller
            n = 6 if step == 0 else 3
            features = torch.randn(n, 144, generator=g).to("cuda")
            h = drafter.extend(cache, features, embed(torch.randint(0, VOCAB, (n,), generator=g).to("cuda")))
            eager, _ = dynamic_tree(drafter, cache, h[-1], embed, root=7, top_k=3, depth=3, total_tokens=12)
            graphed, _ = dynamic_tree(drafter, cache, h[-1], embed, root=7, top_k=3, depth=3, total_tokens=12,
                                      graphs=graphs)
            assert (graphed.tokens, graphed.parents) == (eager.tokens, eager.parents)
            for temperature in (0.0, 1.0):
                uniforms = sampler.uniform(4, torch.float64) if temperature else None
                args = dict(h=h[-1:], uniforms=uniforms)
                constants = dict(keys=cache.buffer_k, values=cache.buffer_v, past=cache.length_t,
                                 scratch_at=cache.capacity, drafter=drafter, embed=embed, draft_to_target=identity,
                                 gamma=4, temperature=temperature)
                want = [t.clone() for t in draft_chain(**args, **constants)]
                got = graphs(f"chain{temperature}", draft_chain, args, constants)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert graphs.captures == 3  # the tree and the chain's two branches, once each: the cache grew in place

