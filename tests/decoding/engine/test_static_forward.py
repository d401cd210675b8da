"""The target's block forward at fixed shapes (decoding/engine/static_forward.py, `model.cuda_graph`), replayed
by emulation on the CPU: the same padded rows, slot writes, full-capacity masks and reused KV buffer as a CUDA
graph replay, run eagerly. It must give the eager forward's logits and taps (fp32, up to summation order), keep
the cache as the eager path does, capture one graph per bucket and variant across prompts, and decode every
lossless method to AR's tokens. The capture itself needs a GPU (last test, skipped here)."""

import functools

import numpy as np
import pytest
import torch
import transformers
from packaging.version import Version

from decoding.engine import static_forward
from decoding.engine.cuda_graph import GraphReplayer
from decoding.engine.loop import generate
from decoding.engine.target import TargetModel
from decoding.methods.ar import AR
from pipeline.errors import ConfigError
from pipeline.zoo import LOSSLESS, build_method, mixed_prompts, random_config, random_target, static_passes_on_meta

NEW_TOKENS = 24
CLOSE = dict(atol=1e-4, rtol=1e-4)  # fp32: the static forward sums over more (masked) keys, in another order


def emulated() -> GraphReplayer:
    return GraphReplayer(True, "model.cuda_graph", emulate=True)


# beside Qwen3: hybrid sliding-window stacks (Gemma 3; Gemma 2, with soft-caps; Qwen2, its window above
# max_window_layers), one where every layer slides (Mistral), and families whose forward scales around the stack
# (Granite, Cohere: decoding/engine/readout.py)
OTHER_ARCHS = ("gemma3", "gemma2", "mistral", "qwen2", "granite", "cohere")


@functools.cache
def eager_target(arch: str = "qwen3"):
    return random_target("tiny", arch=arch)


def graphed_target(arch: str = "qwen3") -> TargetModel:
    return TargetModel(eager_target(arch).model, graphs=emulated())


def prompts():
    return mixed_prompts(2, 500)


@functools.cache
def ar_tokens(arch: str = "qwen3"):
    return [generate(AR(), eager_target(arch), p, max_new_tokens=NEW_TOKENS).new_tokens for p in prompts()]


def test_bucket_is_the_next_power_of_two():
    assert [static_forward.bucket(n) for n in (1, 2, 3, 4, 5, 16, 17, 1000, 1024)] == [1, 2, 4, 4, 8, 16, 32, 1024,
                                                                                      1024]
    # room for the largest padded block after the rows expected, in steps of 1024
    assert static_forward.capacity_for(1) == static_forward.capacity_for(1024) == 2048
    assert static_forward.capacity_for(1025) == 3072


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")


@pytest.mark.parametrize("device, arch", [("cpu", "qwen3"), *(("cpu", a) for a in OTHER_ARCHS),
                                          pytest.param("cuda", "qwen3", marks=GPU),
                                          pytest.param("cuda", "gemma3", marks=GPU)])
def test_static_forwards_equal_eager_ones_chain_tree_taps_last_row_and_compaction(device, arch):
    """On the CPU by emulation; on a GPU with real captures and replays. The prompt is longer than the sliding
    layers' window (8): their keys past it are in the static buffer, hidden by the mask."""
    if device == "cpu":
        eager, graphed = eager_target(arch), graphed_target(arch)
    else:
        eager = random_target("tiny", device=device, arch=arch)
        graphed = TargetModel(eager.model, graphs=GraphReplayer(True, "model.cuda_graph"))
    prompt = list(range(5, 40))
    for target in (eager, graphed):
        target.prefill(prompt, rows_expected=80)
    tree = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 0, 0, 1]], bool)
    calls = [dict(tokens=[7, 8, 9], depths=[0, 1, 2], visible=None, hidden_layers=(1, 4)),  # chain, taps, 3 -> 4 rows
             dict(tokens=[3, 4, 5, 6, 2], depths=[0, 1, 1, 2, 2], visible=tree),  # tree, 5 -> 8 rows
             dict(tokens=[11], depths=[0], visible=None, last_only=True)]
    keeps = [[0, 1, 2], [0, 2, 3], None]  # the second keeps a non-contiguous path (rows moved)
    for call, keep in zip(calls, keeps):
        a, b = (t.forward(**call) for t in (eager, graphed))
        assert a.logits.shape == b.logits.shape
        torch.testing.assert_close(b.logits, a.logits, **CLOSE)
        assert a.hidden.keys() == b.hidden.keys()
        for i in a.hidden:
            torch.testing.assert_close(b.hidden[i], a.hidden[i], **CLOSE)
        assert graphed.cache_len == eager.cache_len
        if keep is not None:
            prefix = eager.cache_len - len(call["tokens"])
            for t in (eager, graphed):
                t.keep_rows(prefix, keep)
    assert sorted(graphed.graphs.graphs) == ["target:1:last", "target:4:taps[1, 4]", "target:8"]
    # the kept rows hold the same keys and values in every layer of both caches (a sliding layer of the eager one
    # keeps its window's last keys only, where the static buffer keeps them all)
    for mine, theirs in zip(graphed.cache.layers, eager.cache.layers, strict=True):
        kept = theirs.keys.shape[-2]
        assert mine.keys.shape[-2] == graphed.cache_len >= kept
        torch.testing.assert_close(mine.keys[:, :, -kept:], theirs.keys, **CLOSE)
        torch.testing.assert_close(mine.values[:, :, -kept:], theirs.values, **CLOSE)


def test_outputs_are_copies_the_next_replay_does_not_overwrite():
    graphed = graphed_target()
    graphed.prefill(list(range(5, 20)), rows_expected=40)
    first = graphed.forward([7, 8], [0, 1], None, hidden_layers=(2,))
    kept = first.logits.clone(), first.hidden[2].clone()
    graphed.keep_rows(15, [])
    graphed.forward([9, 10], [0, 1], None, hidden_layers=(2,))  # the same graph, other tokens
    assert torch.equal(first.logits, kept[0]) and torch.equal(first.hidden[2], kept[1])


def test_graphs_are_captured_once_across_prompts_and_dropped_when_the_buffer_is_replaced():
    graphed = graphed_target()
    for prompt, tokens in zip(prompts(), ar_tokens()):
        assert generate(AR(), graphed, prompt, max_new_tokens=NEW_TOKENS).new_tokens == tokens
    assert graphed.graphs.captures == 1  # AR: one row per step, every prompt, one buffer
    graphed.forward([5, 6], [0, 1], None, hidden_layers=(1,))  # a second graph, on the same buffer
    assert sorted(graphed.graphs.graphs) == ["target:1", "target:2:taps[1]"]
    keys = graphed._static_buffer.keys
    long_prompt = (prompts()[1] * 120)[:2100]  # beyond the buffer's 2048 rows: a new buffer
    generate(AR(), graphed, long_prompt, max_new_tokens=4)
    assert graphed._static_buffer.keys is not keys and graphed.graphs.captures == 3
    assert list(graphed.graphs.graphs) == ["target:1"]  # the taps' graph, which read the old buffer, is gone
    assert graphed._static_buffer.capacity == 4096
    # a short prompt after it keeps the buffer (2x what it needs: prompts of mixed lengths recapture nothing) ...
    assert generate(AR(), graphed, prompts()[0], max_new_tokens=NEW_TOKENS).new_tokens == ar_tokens()[0]
    assert graphed._static_buffer.capacity == 4096 and graphed.graphs.captures == 3
    graphed.prefill(prompts()[0][:5], rows_expected=7000)  # ... but not one 4x its need (CaDDTree's profile
    assert graphed._static_buffer.capacity == 9216 and not graphed.graphs.graphs  # reaches 8192 rows of context)
    for _ in range(2):  # every replay reads the whole buffer: rebuilt to the prompt's size, once
        assert generate(AR(), graphed, prompts()[0], max_new_tokens=NEW_TOKENS).new_tokens == ar_tokens()[0]
    assert graphed._static_buffer.capacity == 2048 and graphed.graphs.captures == 4


def test_a_buffer_grown_mid_answer_drops_the_graphs_and_decodes_on(monkeypatch):
    """A block past the buffer's room (here: no headroom, room for 8 rows, steps of 64) grows it inside
    `_run_static`: the graphs are dropped, and the forwards go on as the eager ones."""
    from decoding.engine import kv_cache

    monkeypatch.setattr(static_forward, "MAX_ROWS", 8)
    monkeypatch.setattr(static_forward, "CAPACITY_STEP", 64)
    monkeypatch.setattr(kv_cache, "HEADROOM", 0)
    graphed, eager = graphed_target(), eager_target()
    prompt = prompts()[0]
    for target in (graphed, eager):
        target.prefill(prompt[:-1], rows_expected=len(prompt))
    assert graphed._static_buffer.capacity == 64  # 24 rows expected + 8, in steps of 64
    graphed.forward([5, 6], [0, 1], None, hidden_layers=(1,))
    graphed.keep_rows(len(prompt) - 1, [])
    old = graphed._static_buffer.keys
    for _ in range(6):  # 8-row blocks, each kept: the sixth starts at 63, past the 64 rows
        expected = eager.forward(list(range(10, 18)), list(range(8)), None)
        got = graphed.forward(list(range(10, 18)), list(range(8)), None)
        torch.testing.assert_close(got.logits, expected.logits, **CLOSE)
    assert graphed._static_buffer.keys is not old and graphed._static_buffer.capacity > 64
    assert list(graphed.graphs.graphs) == ["target:8"] and graphed.cache_len == eager.cache_len == 23 + 48


def test_the_captured_function_changes_no_host_state_and_a_one_token_prompt_starts_its_layers_on_the_host():
    """A replay runs no Python: whatever `_static_pass` did to the cache's host state (lengths, a layer's first
    initialisation) would happen at the capture only. A one-token prompt has no prefill, so its first forward
    is static with uninitialised layers."""
    graphed = graphed_target()
    states = []
    real = graphed._static_pass

    def host_state():
        return [(layer.length, layer.is_initialized, layer.buffer, layer.slot, layer.buffer.generation)
                for layer in graphed._buffered]

    def watched(**kwargs):
        before = host_state()
        out = real(**kwargs)
        states.append(before == host_state())
        return out

    graphed._static_pass = watched
    eager = eager_target()
    for prompt in (prompts()[0], [prompts()[1][0]]):  # a normal prompt, then one of one token
        assert generate(AR(), graphed, prompt, max_new_tokens=8).new_tokens == \
            generate(AR(), eager, prompt, max_new_tokens=8).new_tokens
        assert graphed.cache_len == eager.cache_len
    assert states and all(states)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("name", [m for m in LOSSLESS if m != "ar"])
def test_every_lossless_method_on_a_graphed_target_gives_ar_tokens_in_fp32(name, arch, tmp_path, monkeypatch):
    """Qwen3, and Gemma 3's hybrid stack, whose sliding layers keep every key in the static buffer."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))  # CaDDTree's profiled cost model
    target = graphed_target(arch)
    method = build_method(name, target, tmp_path)
    states = [generate(method, target, p, max_new_tokens=NEW_TOKENS) for p in prompts()]
    assert [s.new_tokens for s in states] == ar_tokens(arch)
    assert target.graphs.captures >= 1  # the verify forwards went through the static path


@pytest.mark.parametrize("name, arch", [("ar", "qwen3"), ("ddtree", "qwen3"), ("eagle3", "qwen3"), ("via_sd", "qwen3"),
                                        ("spec_cascade", "qwen3"), ("via_sd", "gemma3"), ("ddtree", "gemma3")])
def test_sampling_on_a_graphed_target_draws_what_the_eager_one_draws(name, arch, tmp_path, monkeypatch):
    """VIA-SD's slim passes run the layer-subset path eagerly on the graphed target's buffer: on Gemma 3 its
    sliding layers then read every kept key, masked to their window."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    runs = []
    for target in (eager_target(arch), graphed_target(arch)):
        method = build_method(name, target, tmp_path)
        runs.append([generate(method, target, prompts()[1], max_new_tokens=NEW_TOKENS, temperature=1.0,
                              seed=s).new_tokens for s in (0, 1)])
    assert runs[0] == runs[1] and runs[0][0] != runs[0][1]


def test_a_separate_drafter_model_gets_graphs_of_its_own_or_runs_eagerly(tmp_path, caplog, monkeypatch):
    import pipeline.models
    from decoding.drafting.drafter import DrafterConfig, build_drafter
    from pipeline.models import ModelConfig

    graphed = graphed_target()
    sibling = graphed.sibling_graphs("cpu")  # emulated here, as the target's
    assert sibling is not graphed.graphs and sibling.enabled and sibling.what == "model.cuda_graph"
    assert eager_target().sibling_graphs("cpu") is None
    assert TargetModel(eager_target().model, graphs=GraphReplayer(True, "model.cuda_graph")).sibling_graphs("cpu") \
        is None  # graphs on a GPU, not for a drafter on a CPU
    for arch, replays in (("llama", True), ("gemma3", True), ("dynamic", False)):  # dynamic RoPE: eager, with a line
        drafter_model = random_target("tiny", arch="llama" if arch == "dynamic" else arch, seed=1).model
        if arch == "dynamic":
            drafter_model.model.rotary_emb.rope_type = "dynamic"
        monkeypatch.setattr(pipeline.models, "load_model", lambda cfg: (drafter_model, None))
        caplog.clear()
        drafter = build_drafter(DrafterConfig(kind="model", model=ModelConfig(name=arch, path="unused")), graphed)
        assert (drafter.lm.graphs is not None) == replays
        assert ("runs without CUDA graphs" in caplog.text) != replays
    # end to end: SD with the llama drafter model, both replaying their forwards, gives AR's tokens (fp32, T=0)
    llama = random_target("tiny", arch="llama", seed=1).model
    monkeypatch.setattr(pipeline.models, "load_model", lambda cfg: (llama, None))
    from decoding import method_configs
    from decoding.methods.sd import SpeculativeDecoding

    method = SpeculativeDecoding(method_configs()["sd"](),
                                 drafter=DrafterConfig(kind="model", model=ModelConfig(name="llama", path="unused")))
    method.setup(graphed)
    assert [generate(method, graphed, p, max_new_tokens=NEW_TOKENS).new_tokens for p in prompts()] == ar_tokens()
    assert method.drafter.lm.graphs.captures >= 1 and graphed.graphs.captures >= 1


def longrope_target() -> TargetModel:
    """A tiny Phi-3 with LongRoPE (Phi-3-128k, Phi-3.5, Phi-4-mini): long factors past 64 positions."""
    from transformers import AutoModelForCausalLM

    config = random_config("tiny", "phi3", 0.2, None)
    half = config.hidden_size // config.num_attention_heads // 2
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": [4.0] * half,
                              "short_factor": [1.0] * half, "original_max_position_embeddings": 64}
    config.original_max_position_embeddings = 64
    torch.manual_seed(0)
    return TargetModel(AutoModelForCausalLM.from_config(config).eval())


def test_longrope_replays_where_it_picks_its_factors_on_the_device_and_is_refused_where_it_reads_positions(
        monkeypatch):
    eager = longrope_target()
    prompt = mixed_prompts(1, eager.config.vocab_size)[0][:56]
    if Version(transformers.__version__) >= Version("5.21"):  # LongRoPE's factors chosen with torch.where
        assert not static_forward.rope_reads_host(eager.model)
        graphed = TargetModel(eager.model, graphs=emulated())
        ar = generate(AR(), eager, prompt, max_new_tokens=16).new_tokens  # past the 64 positions: long factors
        assert generate(AR(), graphed, prompt, max_new_tokens=16).new_tokens == ar
        assert graphed.graphs.captures >= 1
    rotary = eager.model.model.rotary_emb
    forward = rotary.forward

    def positions_read_on_the_host(x, position_ids, **kwargs):  # transformers 5.15-5.20's LongRoPE: an `if`
        if torch.max(position_ids) + 1 > 64:
            pass
        return forward(x, position_ids, **kwargs)

    monkeypatch.setattr(rotary, "forward", positions_read_on_the_host)
    with pytest.raises(ConfigError, match="LongRoPE picks the long or short factors on the host"):
        TargetModel(eager.model, graphs=emulated())
    assert TargetModel(eager.model).graphs is None  # no CUDA graphs asked for: nothing to refuse


def test_a_target_the_static_forward_cannot_hold_is_one_config_error():
    with pytest.raises(ConfigError, match="kv_buffer=False"):
        TargetModel(eager_target().model, kv_buffer=False, graphs=emulated())
    llama = random_target("tiny", arch="llama", seed=2).model
    llama.config.logits_scaling = 2.0  # a field the readout divides by, which this model's forward does not
    with pytest.raises(ConfigError, match=r"model.cuda_graph=true: llama cannot be replayed .*the static pass "
                                          r"\(model.cuda_graph\) does not repeat"):
        TargetModel(llama, graphs=emulated())
    del llama.config.logits_scaling
    llama.model.rotary_emb.rope_type = "dynamic"  # what the model was built with, whatever its config says
    with pytest.raises(ConfigError, match="dynamic RoPE"):
        TargetModel(llama, graphs=emulated())
    gemma = random_target("tiny", arch="gemma3", seed=2).model  # RoPE types per layer type, in a dict
    gemma.model.rotary_emb.rope_type = {"sliding_attention": "default", "full_attention": "dynamic"}
    with pytest.raises(ConfigError, match="dynamic RoPE"):
        TargetModel(gemma, graphs=emulated())
    moe = random_target("tiny", arch="qwen3_moe").model
    moe.config._experts_implementation = "eager"  # transformers' experts loop: `nonzero` on the routing
    with pytest.raises(ConfigError, match="MoE experts run transformers' eager loop"):
        TargetModel(moe, graphs=emulated())
    split = random_target("tiny").model  # a device_map that put the LM head alone on another device
    split.lm_head.to("meta")
    with pytest.raises(ConfigError, match="spread over several devices"):
        TargetModel(split, graphs=emulated())
    # a layer subset (a drafter made of the target's layers) and a disabled replayer stay eager
    assert TargetModel(eager_target().model, layers=[0, 1], graphs=emulated()).graphs is None
    assert TargetModel(eager_target().model, graphs=GraphReplayer(False, "model.cuda_graph")).graphs is None


def test_layers_whose_keys_one_buffer_cannot_hold_are_refused_at_the_prefill(monkeypatch):
    """A layer whose keys differ in shape from the buffer's gets a buffer of its own, which the graphs do not read."""
    from decoding.engine import kv_cache

    graphed = graphed_target()
    monkeypatch.setattr(kv_cache.KVBuffer, "fits", lambda self, keys, values: False)
    with pytest.raises(ConfigError, match="keys or values differ in shape .* set model.cuda_graph=false"):
        graphed.prefill(prompts()[0])


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_eager_passes_on_a_graphed_sliding_target_read_every_kept_key_masked_to_the_window(arch, monkeypatch):
    """Blocks too long for a graph (MAX_ROWS lowered to 4) and VIA-SD's layer-subset passes run eagerly on the
    static buffer, whose sliding layers keep every key: they must see only the window, as on the eager target."""
    monkeypatch.setattr(static_forward, "MAX_ROWS", 4)
    eager, graphed = eager_target(arch), graphed_target(arch)
    prompt = list(range(5, 40))  # 35 tokens, past the 8-token window
    tree = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
    calls = [dict(tokens=list(range(7, 13)), depths=list(range(6)), visible=None),  # 6 rows: eager on both
             dict(tokens=[9], depths=[0], visible=None, active_layers=(0, 2, 3)),  # slim passes: one row,
             dict(tokens=[9, 10, 11], depths=[0, 1, 2], visible=None, active_layers=(0, 2, 3)),  # a chain,
             dict(tokens=[9, 10, 11], depths=[0, 1, 1], visible=tree, active_layers=(1, 2, 5))]  # a tree
    for call in calls:
        for target in (eager, graphed):
            target.prefill(prompt, rows_expected=80)
        torch.testing.assert_close(graphed.forward(**call).logits, eager.forward(**call).logits, **CLOSE)
    assert not graphed.graphs.graphs  # nothing replayed: every pass above was eager


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_the_static_pass_gives_sliding_layers_the_window_and_full_layers_the_whole_buffer(arch, monkeypatch):
    """A sliding layer attends to a fixed-width slice (window + the padded block's rows), not to every row of
    capacity: at a long context that would read far more keys than the window (docs/gpu-bf16.md)."""
    from decoding.engine.kv_cache import BufferedLayer

    eager, graphed = eager_target(arch), graphed_target(arch)
    seen = []
    real = BufferedLayer.update

    def update(self, *args, **kwargs):
        keys, _ = real(self, *args, **kwargs)
        seen.append((self.sliding, keys.shape[-2]))
        return keys, _

    # 35 tokens, past the 8-token window (the slice starts inside the buffer), and 5, within it (at its start)
    for prompt in (list(range(5, 40)), list(range(5, 10))):
        for target in (eager, graphed):
            target.prefill(prompt, rows_expected=80)
        seen.clear()
        with monkeypatch.context() as patched:
            patched.setattr(BufferedLayer, "update", update)
            logits = graphed.forward([7, 8, 9], [0, 1, 2], None).logits  # 3 rows, padded to 4
        torch.testing.assert_close(logits, eager.forward([7, 8, 9], [0, 1, 2], None).logits, **CLOSE)
        capacity = graphed._static_buffer.capacity
        assert capacity > 8 + 4
        kinds = {"gemma3": {(True, 8 + 4), (False, capacity)}, "mistral": {(True, 8 + 4)}}[arch]
        assert set(seen) == kinds and len(seen) >= len(graphed.cache.layers)  # a capture runs it once more


def described(a):
    """A tensor by its shape, and a scalar tensor by its value too (where a host number, e.g. the prefix length,
    would hide); the block's inputs are not scalars, and their values rightly change from call to call."""
    if not isinstance(a, torch.Tensor):
        return a
    return (tuple(a.shape), a.item() if a.dim() == 0 else None)


def dispatched(fn) -> list:
    """Every op `fn` dispatches, with its tensors' shapes and its other arguments: what a capture records."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat = torch.utils._pytree.tree_leaves((args, kwargs))
            self.ops.append((str(func), tuple(described(a) for a in flat)))
            return func(*args, **kwargs)

    with Recorder() as recorder:
        fn()
    return recorder.ops


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_the_captured_forward_is_the_same_program_at_every_prefix(arch):
    """A replay repeats the ops of the capture with their arguments: nothing the captured function does may
    depend on the prefix length (a host value read at the capture would be frozen into the graph). The prefixes,
    23 and 5 tokens, lie on both sides of Gemma 3's 8-token window."""
    graphed = graphed_target(arch)
    programs = []
    real = graphed._static_pass

    def recorded(**kwargs):
        programs.append(dispatched(lambda: real(**kwargs)))
        return real(**kwargs)

    graphed._static_pass = recorded
    for prompt in (prompts()[0], prompts()[1][:6]):  # prefixes 23 and 5 (the last token is the first root)
        graphed.prefill(prompt[:-1], rows_expected=64)
        graphed.graphs.forget()  # capture at this prefix
        graphed.forward([prompt[-1], 5, 6], [0, 1, 2], None, hidden_layers=(1,))
    assert len(programs) == 4 and len(programs[0]) > 100  # emulation: one run at the capture, one per replay
    assert programs[0] == programs[2]


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gemma3", "gemma2", "granite", "qwen3_moe"])
def test_the_captured_forward_reads_nothing_on_the_host(arch):
    """A CUDA graph cannot hold a host read of a device value (`.item()`, `bool(t)`, `nonzero`): run the
    captured function, transformers' own forward included, on the meta device, where any such read fails. In bf16,
    as on a GPU: an MoE's experts then run transformers' grouped kernel (its eager loop reads the routing)."""
    from pipeline.zoo import random_config

    config = random_config("tiny", arch)
    shapes = [(tuple(logits.shape), [tuple(h.shape) for h in taps]) for logits, *taps in static_passes_on_meta(arch)]
    width = config.hidden_size
    assert shapes == [((4, config.vocab_size), [(4, width)]), ((1, config.vocab_size), []),
                      ((1, config.vocab_size), [])]  # 3 rows padded to 4; the last row only; one row


def test_an_moe_whose_experts_loop_reads_the_routing_on_the_host_is_refused_before_any_capture(monkeypatch):
    """transformers' eager experts loop finds the routed experts with `nonzero`, a host read (on the meta device it
    fails), which a capture would fail on mid-run: such a target is refused when it is built, in one line."""
    from transformers import AutoModelForCausalLM

    import pipeline.zoo

    real = pipeline.zoo.random_config

    def eager_experts(*args, **kwargs):
        config = real(*args, **kwargs)
        config._experts_implementation = "eager"
        return config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(eager_experts("tiny", "qwen3_moe"), dtype=torch.bfloat16).eval()
    with pytest.raises(NotImplementedError, match="nonzero"), torch.inference_mode():
        model(input_ids=torch.zeros(1, 3, dtype=torch.long, device="meta"))
    monkeypatch.setattr(pipeline.zoo, "random_config", eager_experts)
    with pytest.raises(ConfigError, match="MoE experts run transformers' eager loop"):
        static_passes_on_meta("qwen3_moe")


@GPU
def test_a_real_capture_on_a_gpu_equals_the_eager_forward():
    model = random_target("tiny", device="cuda").model
    eager, graphed = TargetModel(model), TargetModel(model, graphs=GraphReplayer(True, "model.cuda_graph"))
    prompt = prompts()[1]
    assert generate(AR(), graphed, prompt, max_new_tokens=NEW_TOKENS).new_tokens == \
        generate(AR(), eager, prompt, max_new_tokens=NEW_TOKENS).new_tokens
    assert graphed.graphs.captures == 1
