"""Every method on every architecture we list (pipeline.zoo.ARCHITECTURES: LLaMA, Qwen3, Qwen2 with
its sliding window on, Gemma 3, Gemma 2 and Mistral), on tiny random models whose sliding layers have
an 8-token window, so every 24-token prompt crosses it.

- AR equals the model's own uncached forward (its masks, its window) token for token;
- the engine's pieces: the layer-subset path equals the model's forward, tree rows equal sequential
  forwards across the window, compaction after a rejected branch equals a fresh prefill;
- in fp32, every lossless method (drafter-free, early-exit/slim drafters, block diffusion with a
  random drafter of the matching shape) gives AR's greedy tokens on a repetitive prompt and a random
  one, with drafts rejected; random models and drafters accept drafts only by chance, so accepted
  drafts (the compaction that moves rows) are asserted where they occur on every architecture (ptd,
  sd, sd_slim), and the compaction is tested directly; via_sd and spec_cascade complete; DIMR runs;
- at T=1 every method samples on every architecture.
"""

import functools

import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from decoding.engine import attention_layout
from decoding.methods.ar import AR
from decoding.engine.loop import generate
from decoding.engine.tree import TokenTree
from pipeline.zoo import (ARCHITECTURES, LOSSLESS, METHODS, build_method, mixed_prompts, random_target,
                          subset_and_full_logits, uncached_greedy)

ARCHS = sorted(ARCHITECTURES)
HYBRID = ("gemma2", "gemma3", "qwen2")  # sliding and full layers mixed
WINDOWED = (*HYBRID, "mistral")  # every model with sliding layers
NEW_TOKENS = 24
ACCEPTING = ("ptd", "sd", "sd_slim")  # accept drafts on the repetitive prompt on every (seeded) architecture


@functools.cache
def arch_target(arch: str):
    return random_target("tiny", arch=arch)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return functools.cache(lambda arch: tmp_path_factory.mktemp(f"arch_{arch}"))


def prompts():
    return mixed_prompts(2, 500)  # [repetitive (drafts accepted), random (drafts rejected)]


@functools.cache
def ar_tokens(arch: str):
    return [generate(AR(), arch_target(arch), p, max_new_tokens=NEW_TOKENS).new_tokens for p in prompts()]


def test_hybrid_architectures_really_mix_layer_types_with_a_window_the_prompts_cross():
    for arch in HYBRID:
        layout = arch_target(arch).layout
        assert set(layout.types) == {"full_attention", "sliding_attention"}, arch
        assert layout.windows["sliding_attention"] == 8 < len(prompts()[0])
    assert arch_target("mistral").layout.types == ("sliding_attention",) * 6
    assert arch_target("gemma2").readout.softcap == 30.0


@pytest.mark.parametrize("arch", ARCHS)
def test_ar_equals_the_models_own_uncached_greedy_forward(arch):
    target = arch_target(arch)
    assert ar_tokens(arch) == [uncached_greedy(target.model, p, NEW_TOKENS) for p in prompts()]


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_subset_path_over_all_layers_equals_the_models_forward(arch):
    """_run_layers (drafters, slim verifiers, VIA-SD) rebuilds the stack from the model's modules:
    per-type rotary, per-type masks and the final soft-cap must make it the model's own forward."""
    subset, full = subset_and_full_logits(arch_target(arch), prompts()[1])
    torch.testing.assert_close(subset, full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layers", [(2, 3, 5), (0, 2, 3, 5)])
@pytest.mark.parametrize("arch", WINDOWED)
def test_a_layer_subset_drafter_across_the_window_equals_its_uncached_forward(arch, layers):
    """A drafter made of some of the target's layers (its own cache): prefill, one-row passes as the
    drafter loop makes them, a cut back, then a chain; every pass equals the same layers run over the
    whole sequence without a cache."""
    from decoding.engine.target import TargetModel

    model = arch_target(arch).model
    seq = prompts()[1]
    drafter, fresh = TargetModel(model, layers=layers), TargetModel(model, layers=layers)

    def uncached(upto: int) -> torch.Tensor:  # logits of rows 0..upto-1 with no cache
        fresh.reset()
        return fresh._run_layers(torch.tensor(seq[:upto]), torch.arange(upto), None, (), False, fresh.layers).logits

    drafter.prefill(seq[:10])
    for i in range(10, 20):  # one row at a time, past the 8-token window
        out = drafter.forward([seq[i]], [0]).logits[-1]
        torch.testing.assert_close(out, uncached(i + 1)[-1], atol=1e-4, rtol=1e-4)
    drafter.truncate(14)  # drop six rows, as a rejected draft does
    out = drafter.forward(seq[14:22], list(range(8))).logits
    torch.testing.assert_close(out, uncached(22)[14:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", WINDOWED)
def test_a_slim_scratch_pass_leaves_every_cache_layer_as_it_was(arch):
    """VIA-SD's slim verifier: a pass over some layers (`active_layers`) after a prefix longer than the
    window only reads the cache: every layer, sliding ones included, keeps its keys and its count."""
    target = arch_target(arch)
    seq = prompts()[1]
    target.prefill(seq[:16])
    before = [(layer.keys.clone(), getattr(layer, "cumulative_length", None)) for layer in target.cache.layers]
    target.forward(seq[16:22], list(range(6)), active_layers=(0, 2, 3, 5))
    for (keys, count), layer in zip(before, target.cache.layers):
        assert torch.equal(keys, layer.keys) and count == getattr(layer, "cumulative_length", None)
    assert target.cache_len == 16


@pytest.mark.parametrize("arch", WINDOWED)
def test_tree_rows_equal_sequential_forwards_across_the_window(arch):
    """Deep branches (12 tokens > the 8-token window) after a prefix longer than the window: each
    node's logits equal the uncached forward of its path, so the window is applied at its position."""
    target = arch_target(arch)
    prefix = prompts()[1][:20]
    branches = [list(range(40, 52)), [40, 41, 42, *range(60, 69)], [70, 71, 72]]
    tree = TokenTree.from_sequences(prefix[-1], branches)
    target.prefill(prefix[:-1])
    out = target.forward_tree(tree)
    for node in range(len(tree)):
        path = prefix + [tree.tokens[i] for i in tree.path_to(node)[1:]]
        with torch.inference_mode():
            ref = target.model(torch.tensor([path])).logits[0, -1].float()
        torch.testing.assert_close(out.logits[node], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", WINDOWED)
def test_keeping_a_non_contiguous_path_equals_a_fresh_prefill(arch):
    """After a tree forward, keep_rows of a path that skips rows (a rejected sibling) leaves every
    layer, sliding ones included, as a prefill of the committed tokens: same keys, same count."""
    target = arch_target(arch)
    prefix = prompts()[1][:20]
    tree = TokenTree.from_sequences(prefix[-1], [[80, 81, 82, 83], [90, 91, 92, 93, 94, 95]])
    target.prefill(prefix[:-1])
    target.forward_tree(tree)
    path = tree.path_to(len(tree) - 1)  # the second branch: rows 0, 5..10
    assert path != list(range(len(path)))
    target.keep_rows(len(prefix) - 1, path)
    kept = [(layer.keys.clone(), layer.values.clone(), layer.cumulative_length if layer.is_sliding else None)
            for layer in target.cache.layers]
    target.prefill(prefix[:-1] + [tree.tokens[i] for i in path])
    for (keys, values, count), layer in zip(kept, target.cache.layers):
        torch.testing.assert_close(keys, layer.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(values, layer.values, atol=1e-5, rtol=1e-5)
        assert count == (layer.cumulative_length if layer.is_sliding else None)
    sliding = [layer for layer in target.cache.layers if layer.is_sliding]
    assert sliding and all(layer.keys.shape[-2] == 7 for layer in sliding)  # window - 1 keys kept


@pytest.mark.parametrize("name", [m for m in LOSSLESS if m != "ar"])
@pytest.mark.parametrize("arch", ARCHS)
def test_lossless_method_equals_ar_in_fp32_with_rejected_drafts(arch, name, folders, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(folders(arch)))  # CaDDTree's profiled cost model
    target = arch_target(arch)
    method = build_method(name, target, folders(arch))
    states = [generate(method, target, p, max_new_tokens=NEW_TOKENS) for p in prompts()]
    assert [s.new_tokens for s in states] == ar_tokens(arch)
    random_prompt = states[1].stats
    assert random_prompt.num_draft_tokens > random_prompt.num_accepted_tokens  # drafts were rejected
    if name in ACCEPTING:  # over a longer answer: PTD on Qwen2 accepts its first draft only at token 24, where
        # the limit cuts the step (a cut step counts only what it committed, docs/metrics.md)
        longer = generate(method, target, prompts()[0], max_new_tokens=2 * NEW_TOKENS)
        assert longer.stats.num_accepted_tokens > 0 and longer.new_tokens[:NEW_TOKENS] == ar_tokens(arch)[0]


@pytest.mark.parametrize("name", ["via_sd", "via_sd_eagle3", "spec_cascade"])
@pytest.mark.parametrize("arch", ARCHS)
def test_lossy_method_completes(arch, name, folders):
    target = arch_target(arch)
    method = build_method(name, target, folders(arch))
    for prompt in prompts():
        state = generate(method, target, prompt, max_new_tokens=NEW_TOKENS)
        assert len(state.new_tokens) == NEW_TOKENS and all(0 <= t < target.config.vocab_size for t in state.new_tokens)


@pytest.mark.parametrize("block", [None, 3])  # from scratch | as decoding runs the slim verifier
@pytest.mark.parametrize("arch", ARCHS)
def test_dimr_cost_is_zero_for_the_full_model_and_positive_for_a_slim_one(arch, block):
    from search.dimr import MaskCost

    target = arch_target(arch)
    cost = MaskCost(target, [p + t for p, t in zip(prompts(), ar_tokens(arch))], block=block,
                    starts=[len(p) - 1 for p in prompts()])
    assert cost(()) == pytest.approx(0.0, abs=1e-5)
    assert cost((1, 3)) > 1e-4


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_method_samples_at_t1(arch, name, folders, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(folders(arch)))
    target = arch_target(arch)
    method = build_method(name, target, folders(arch))
    runs = [generate(method, target, prompts()[1], max_new_tokens=NEW_TOKENS, temperature=1.0, seed=s).new_tokens
            for s in (0, 1)]
    assert all(len(r) == NEW_TOKENS for r in runs) and runs[0] != runs[1]


def test_past_max_position_embeddings_is_one_line_error():
    from decoding.engine.loop import ContextLimitError

    target = arch_target("gemma3")
    with pytest.raises(ContextLimitError, match="4096-token context") as info:
        generate(AR(), target, [5] * 4000, max_new_tokens=100)
    assert "\n" not in str(info.value)


def test_a_layer_type_the_engine_does_not_handle_is_refused_with_one_line():
    from transformers import Qwen3Config

    from decoding.engine.attention_layout import AttentionLayout, UnsupportedArchitecture
    from pipeline.cli import USER_ERRORS

    config = Qwen3Config(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"])
    with pytest.raises(UnsupportedArchitecture, match="linear_attention are not supported") as info:
        AttentionLayout.of(config)
    assert "\n" not in str(info.value) and isinstance(info.value, USER_ERRORS)


def test_the_layout_reads_the_older_transformers_kwargs(monkeypatch):
    """transformers before 5.25 (5.17: the GPU image's) returns one kwargs dict for all layers instead of
    one per layer: full-attention and hybrid models read it."""
    from transformers import Qwen3Config

    from decoding.engine.attention_layout import FULL, SLIDING, AttentionLayout

    def older(config):
        types = list(config.layer_types)
        return types, ({"sliding_window": config.sliding_window} if SLIDING in types else {})

    monkeypatch.setattr(attention_layout, "get_layer_types_and_kwargs", older)
    full = AttentionLayout.of(Qwen3Config(num_hidden_layers=2, layer_types=[FULL, FULL]))
    assert full.types == (FULL, FULL) and full.windows == {FULL: None}
    hybrid = Qwen3Config(num_hidden_layers=2, layer_types=[SLIDING, FULL], sliding_window=8, use_sliding_window=True)
    layout = AttentionLayout.of(hybrid)
    assert layout.types == (SLIDING, FULL) and layout.windows == {SLIDING: 8, FULL: None}


# ---------------------------------------------------------------- the older transformers' sliding cache
# Before 5.25 (5.17 is the GPU image's), a sliding layer that records its past (as the engine makes it, to drop
# rejected drafts) returns every key it holds from `update`, not the last `window - 1` plus the block's. After
# several forwards without a cut (a drafter's one-row passes) a row would attend past its window unless the
# engine's mask covers those keys. CI has 5.25, so these tests give its layer the older `update` (its
# behaviour in a few lines: keep everything while recording, return everything) and rerun the windowed engine
# tests; under a real 5.17 this whole file is the check (docs/architectures.md).


def update_returning_recorded_past(self, key_states, value_states, *args, **kwargs):
    """DynamicSlidingWindowLayer.update as transformers before 5.25 wrote it (behaviour, not its text)."""
    if not self.is_initialized:
        self.lazy_initialization(key_states, value_states)
    self.cumulative_length += key_states.shape[-2]
    keys = torch.cat([self.keys, key_states], dim=-2)
    values = torch.cat([self.values, value_states], dim=-2)
    if self.record_past:
        self.keys, self.values = keys, values
    else:
        self.keys, self.values = keys[:, :, -self.sliding_window + 1:], values[:, :, -self.sliding_window + 1:]
    return keys, values


@pytest.fixture
def older_cache(monkeypatch):
    """A call gives the installed sliding layer the older `update` (undone after the test)."""
    def give():
        monkeypatch.setattr(DynamicSlidingWindowLayer, "update", update_returning_recorded_past)
        attention_layout.returns_recorded_past.cache_clear()

    yield give
    attention_layout.returns_recorded_past.cache_clear()


@pytest.fixture
def older_sliding_layers(older_cache):
    older_cache()


def test_older_cache_probe_sees_the_recorded_past_returned(older_sliding_layers):
    assert attention_layout.returns_recorded_past()


def test_installed_cache_probe_answers_as_its_version_behaves():
    import transformers
    from packaging.version import Version

    attention_layout.returns_recorded_past.cache_clear()
    assert attention_layout.returns_recorded_past() == (Version(transformers.__version__) < Version("5.25"))


@pytest.mark.parametrize("layers", [(2, 3, 5)])
@pytest.mark.parametrize("arch", WINDOWED)
def test_older_cache_layer_subset_drafter_across_the_window(arch, layers, older_sliding_layers):
    """One-row passes past the window with no cut in between: the case the older cache breaks."""
    test_a_layer_subset_drafter_across_the_window_equals_its_uncached_forward(arch, layers)


@pytest.mark.parametrize("arch", WINDOWED)
def test_older_cache_full_model_rows_past_the_window_without_a_cut(arch, older_sliding_layers):
    """The full model's own path: one-row passes and a chain with more recorded keys than the window,
    each equal to the uncached forward of its sequence."""
    target = arch_target(arch)
    seq = prompts()[1]
    target.prefill(seq[:10])
    for i in range(10, 20):
        out = target.forward([seq[i]], [0]).logits[-1]
        with torch.inference_mode():
            ref = target.model(torch.tensor([seq[: i + 1]])).logits[0, -1].float()
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    target.truncate(14)
    out = target.forward(seq[14:22], list(range(8))).logits
    with torch.inference_mode():
        ref = target.model(torch.tensor([seq[:22]])).logits[0, 14:].float()
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", WINDOWED)
def test_older_cache_tree_rows_compaction_and_slim_pass(arch, older_sliding_layers):
    """These passes follow a cut, so the layers hold no more than the window: they must stay as they were."""
    test_tree_rows_equal_sequential_forwards_across_the_window(arch)
    test_keeping_a_non_contiguous_path_equals_a_fresh_prefill(arch)
    test_a_slim_scratch_pass_leaves_every_cache_layer_as_it_was(arch)


@pytest.mark.parametrize("name", ["ar", "ptd", "sd", "sd_slim", "dflash", "dominotree"])
@pytest.mark.parametrize("arch", WINDOWED)
def test_older_cache_methods_decode_as_under_the_installed_one(arch, name, older_cache, tmp_path, monkeypatch):
    """Each method does the same work under the older cache as under the installed one: the same tokens (the
    model's own uncached greedy ones) and the same drafts accepted and rejected. sd and sd_slim make several
    one-row drafter passes before a cut, past the window (asserted): a drafter reading past its window shows in
    their acceptance, not in their tokens (the target's verify keeps them lossless)."""
    from decoding.engine.target import TargetModel

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    target = arch_target(arch)

    def decode():
        method = build_method(name, target, tmp_path)
        states = [generate(method, target, p, max_new_tokens=NEW_TOKENS) for p in prompts()]
        return [(s.new_tokens, s.stats.num_draft_tokens, s.stats.num_accepted_tokens) for s in states]

    installed = decode()
    assert [tokens for tokens, _, _ in installed] == [uncached_greedy(target.model, p, NEW_TOKENS) for p in prompts()]
    older_cache()
    held, count_keys = [], TargetModel._sliding_keys

    def recording(self):
        keys = count_keys(self)
        held.append(keys or 0)
        return keys

    monkeypatch.setattr(TargetModel, "_sliding_keys", recording)
    assert decode() == installed
    if name == "sd_slim" or (name == "sd" and arch != "qwen2"):  # qwen2's early exit (layers 0-2) has no sliding layer
        assert max(held) >= target.layout.windows["sliding_attention"]
