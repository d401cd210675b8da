"""The shared KV buffer of the full-attention layers (decoding/engine/kv_cache.py)."""

import pytest
import torch

from decoding.engine.kv_cache import BufferedLayer, KVBuffer, buffered_cache
from decoding.engine.tree import TokenTree


def rows(n: int, start: float = 0.0, heads: int = 2, dim: int = 4) -> torch.Tensor:
    return torch.arange(start, start + heads * n * dim).reshape(1, heads, n, dim)


def test_a_layer_grows_past_its_capacity_and_keeps_every_row():
    layer = BufferedLayer(KVBuffer(1, min_capacity=4), 0)
    parts = [rows(3), rows(2, 100), rows(5, 200)]  # 3 fit, 5 need a first growth, 10 a second
    for part in parts:
        keys, values = layer.update(part, -part)
    expected = torch.cat(parts, dim=2)
    assert torch.equal(keys, expected) and torch.equal(values, -expected)
    assert layer.get_seq_length() == 10 and layer.buffer.capacity >= 10


def test_a_crop_through_transformers_own_api_cuts_the_layer():
    layer = BufferedLayer(KVBuffer(1, min_capacity=4), 0)
    layer.update(rows(6), rows(6))
    layer.crop(-2)  # DynamicLayer.crop assigns a leading view of the keys: only the length changes
    assert layer.get_seq_length() == 4 and torch.equal(layer.keys, rows(6)[:, :, :4])
    keys, _ = layer.update(rows(1, 500), rows(1, 500))
    assert torch.equal(keys[:, :, 4:], rows(1, 500))


def test_a_layer_of_another_shape_gets_a_buffer_of_its_own():
    shared = KVBuffer(2)
    first, second = BufferedLayer(shared, 0), BufferedLayer(shared, 1)
    first.update(rows(3, dim=4), rows(3, dim=4))
    second.update(rows(3, dim=8), rows(3, dim=8))  # e.g. a different head size
    assert first.buffer is shared and second.buffer is not shared
    assert torch.equal(second.keys, rows(3, dim=8)) and torch.equal(first.keys, rows(3, dim=4))


def test_move_rows_compacts_every_slot_at_once():
    buffer = KVBuffer(3, min_capacity=8)
    layers = [BufferedLayer(buffer, slot) for slot in range(3)]
    for slot, layer in enumerate(layers):
        layer.update(rows(6, 1000 * slot), rows(6, 1000 * slot))
    buffer.move_rows(torch.tensor([3, 5]), start=1)  # keep rows 0, 3, 5
    for slot, layer in enumerate(layers):
        layer.length = 3
        assert torch.equal(layer.keys, rows(6, 1000 * slot)[:, :, [0, 3, 5]])


@pytest.mark.parametrize("arch", ["qwen3", "gemma2"])
def test_only_the_full_attention_layers_a_wrapper_runs_are_buffered(arch):
    from pipeline.zoo import random_config

    from decoding.engine.attention_layout import FULL, AttentionLayout

    config = random_config("tiny", arch)
    types = AttentionLayout.of(config).types
    full = {i for i, t in enumerate(types) if t == FULL}
    cache, buffered = buffered_cache(config, (0, 1, 2, 3), full)
    assert [cache.layers.index(layer) for layer in buffered] == [i for i in (0, 1, 2, 3) if i in full]
    assert not any(isinstance(layer, BufferedLayer) for i, layer in enumerate(cache.layers)
                   if i not in full or i > 3)
    assert len({id(layer.buffer) for layer in buffered}) == 1 and buffered[0].buffer.slots == len(buffered)
    if arch == "gemma2":  # its sliding layers keep transformers' own layer
        assert any(getattr(layer, "is_sliding", False) for layer in cache.layers)


def test_under_a_device_map_each_device_has_its_own_buffer(tiny_target):
    from decoding.engine.attention_layout import FULL

    full = {i for i, t in enumerate(tiny_target.layout.types) if t == FULL}
    devices = {0: "cuda:0", 1: "cuda:0", 2: "cuda:1", 3: "cuda:1"}  # grouped before anything is allocated
    _, buffered = buffered_cache(tiny_target.config, (0, 1, 2, 3), full, devices)
    assert [(layer.buffer.slots, layer.slot) for layer in buffered] == [(2, 0), (2, 1), (2, 0), (2, 1)]
    assert buffered[0].buffer is buffered[1].buffer and buffered[1].buffer is not buffered[2].buffer


def test_a_layer_moved_to_a_buffer_of_its_own_after_a_reset_sees_its_new_rows():
    layer = BufferedLayer(KVBuffer(2), 1)
    BufferedLayer(layer.buffer, 0).update(rows(2, dim=4), rows(2, dim=4))  # the shared buffer: head_dim 4
    layer.update(rows(2, dim=4), rows(2, dim=4))
    layer.reset()
    keys, _ = layer.update(rows(3, dim=8), rows(3, dim=8))  # no longer fits: a private buffer
    assert torch.equal(keys, rows(3, dim=8))


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_tree_steps_that_grow_the_buffer_leave_the_cache_a_fresh_prefill(arch, monkeypatch):
    """Capacity for the prompt only: the first tree steps grow the shared buffer (all layers at once) before
    keep_rows moves a non-contiguous path; the next forward equals a plain forward over the kept tokens."""
    from pipeline.zoo import random_target

    from decoding.engine import kv_cache

    monkeypatch.setattr(kv_cache, "MIN_CAPACITY", 4)
    monkeypatch.setattr(kv_cache, "HEADROOM", 0)
    target = random_target("tiny", arch=arch)
    kept = list(range(10, 16))
    target.prefill(kept)
    buffer = target._buffered[0].buffer
    assert buffer.capacity == 6
    for step in range(4):
        tree = TokenTree.from_sequences(kept[-1] + 1, [[50 + step, 31], [32, 60 + step, 34], [35]])
        target.forward_tree(tree)
        path = tree.path_to(tree.tokens.index(34))  # root -> 32 -> 60 + step -> 34: block rows 0, 3, 4, 5
        assert path == [0, 3, 4, 5]
        target.keep_rows(len(kept), path)
        kept += [tree.tokens[i] for i in path]
    assert target.cache_len == len(kept) and buffer.generation > 2  # allocated, then grown at least twice
    out = target.forward(torch.tensor([40]), torch.tensor([0]), None)
    with torch.inference_mode():
        ref = target.model(torch.tensor([kept + [40]])).logits[0, -1].float()
    torch.testing.assert_close(out.logits[0], ref, atol=1e-4, rtol=1e-4)


def test_a_zero_row_first_update_allocates_the_buffer():
    layer = BufferedLayer(KVBuffer(1), 0)
    keys, values = layer.update(rows(0), rows(0))
    assert keys.shape == (1, 2, 0, 4) and layer.get_seq_length() == 0
    assert torch.equal(layer.update(rows(2), rows(2))[0], rows(2))


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_generate_sizes_the_buffers_so_that_a_run_never_grows_them(method, tmp_path):
    """The target's buffer is sized for the prompt and the answer; a drafter's (sd: an early exit, its own
    wrapper and cache) for its prompt plus HEADROOM rows."""
    from pipeline.zoo import build_method, mixed_prompts, random_target

    from decoding.engine.loop import generate

    target = random_target("tiny")
    m = build_method(method, target, tmp_path)
    generate(m, target, mixed_prompts(1, 500)[0], max_new_tokens=300)
    wrappers = [target] + ([m.drafter.lm] if method == "sd" else [])
    assert all(w._buffered[0].buffer.generation == 1 for w in wrappers)  # allocated once, never grown
    assert target._buffered[0].buffer.capacity >= 24 + 300


class CountCalls(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("shape", ["llama", "qwen3"])
@pytest.mark.parametrize("kv_buffer, calls", [(True, (10, 10)), (False, (26, 126))])
def test_cutting_and_compacting_the_cache_costs_the_same_ops_at_any_depth(shape, kv_buffer, calls):
    """A tree step's keep_rows on a 2-layer and a 12-layer model of one architecture makes the same
    number of torch calls with the shared buffer (moved and cut as one); transformers' DynamicCache
    (kv_buffer=False) pays per layer."""
    from pipeline.zoo import random_config
    from transformers import AutoModelForCausalLM

    from decoding.engine.target import TargetModel

    counts = []
    for layers in (2, 12):
        config = random_config("tiny", "qwen3" if shape == "qwen3" else "llama")
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = ["full_attention"] * layers
        torch.manual_seed(0)
        target = TargetModel(AutoModelForCausalLM.from_config(config).eval(), kv_buffer=kv_buffer)
        target.prefill(list(range(10, 40)))
        target.forward_tree(TokenTree.from_sequences(40, [[41, 42], [43, 44, 45]]))
        with CountCalls() as counter:
            target.keep_rows(30, [0, 3, 4, 5])  # root + the second branch: rows move
        counts.append(counter.calls)
        assert target.cache_len == 34
    assert tuple(counts) == calls
