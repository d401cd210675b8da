"""VIA-SD: forcing every token to the full verifier reproduces sd exactly; tiers 1-2 alone never run
the full model; the full model's KV after slim-settled tokens equals a fresh prefill."""

import pytest
import torch

from decoding.drafting.drafter import DrafterConfig
from decoding.engine.loop import generate
from decoding.drafting.routing import save_mask
from decoding.methods.sd import SDConfig, SpeculativeDecoding
from decoding.methods.via_sd import VIASD, VIASDConfig
from pipeline.errors import ConfigError

PROMPTS = [[7, 30, 31, 32], [40, 41, 42, 43, 44, 45], [60, 61, 7, 8]]


@pytest.fixture
def mask_file(tmp_path):
    path = tmp_path / "tiny_mask.json"
    save_mask(path, [2], num_layers=4, model="tiny")
    return str(path)


def make(cls, config, target):
    method = cls(config, drafter=DrafterConfig(exit_layer=2, gamma=4))
    method.setup(target)
    return method


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_thresholds_forcing_the_full_verifier_reproduce_sd(tiny_target, mask_file, temperature):
    sd = make(SpeculativeDecoding, SDConfig(), tiny_target)
    via = make(VIASD, VIASDConfig(mask=mask_file, agree_threshold=2.0, slim_threshold=2.0), tiny_target)
    for seed, prompt in enumerate(PROMPTS[:2]):
        a = generate(sd, tiny_target, prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        b = generate(via, tiny_target, prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        assert a.new_tokens == b.new_tokens
        assert b.stats.extra.get("settled_direct", 0) == b.stats.extra.get("settled_slim", 0) == 0
        assert b.stats.num_accepted_tokens == a.stats.num_accepted_tokens


def test_tiers_one_and_two_alone_never_run_the_full_model(tiny_target, mask_file):
    via = make(VIASD, VIASDConfig(mask=mask_file, agree_threshold=0.0, slim_threshold=0.0), tiny_target)
    state = generate(via, tiny_target, PROMPTS[0], max_new_tokens=20, temperature=1.0, seed=1)
    assert len(state.new_tokens) == 20
    # every target pass was a slim one (3 of 4 layers): counted, at 3/4 of a full forward each
    slim = state.stats.extra["slim_forwards"]
    assert state.stats.target_forwards == slim
    assert state.stats.target_forward_cost == pytest.approx(0.75 * slim)
    assert state.stats.decoding_efficiency == pytest.approx(20 / (0.75 * slim))
    # the early-exit drafter (2 of 4 layers) reports its own cost in the same units
    assert state.stats.extra["drafter_forward_cost"] == pytest.approx(0.5 * state.stats.extra["drafter_forwards"])
    assert state.stats.extra["settled_direct"] + state.stats.extra["settled_slim"] == 20


def cache_tensors(target, length):
    return [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in target.cache.layers]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_full_kv_after_slim_settled_tokens_equals_a_fresh_prefill(tiny_target, mask_file, temperature):
    via = make(VIASD, VIASDConfig(mask=mask_file, agree_threshold=0.05, slim_threshold=0.1), tiny_target)
    slim_settled: set[int] = set()

    def watch(state):  # positions committed while the target's cache lagged behind
        slim_settled.update(range(state.target.cache_len, len(state.sequence) - 1))

    state = generate(via, tiny_target, PROMPTS[1], max_new_tokens=40, temperature=temperature, seed=0, on_step=watch)
    target = tiny_target
    length = target.cache_len
    assert state.stats.extra.get("escalations", 0) > 0
    assert any(pos < length for pos in slim_settled), "no slim-settled token was filled by a later full pass"
    got = cache_tensors(target, length)
    target.prefill(state.sequence[:length])
    for (k, v), (k0, v0) in zip(got, cache_tensors(target, length)):
        torch.testing.assert_close(k, k0, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v, v0, atol=1e-5, rtol=1e-4)


def test_random_mask_ablation_keeps_the_skip_count(tiny_llama, mask_file):
    via = make(VIASD, VIASDConfig(mask=mask_file, middle="random", random_seed=3), tiny_llama)
    assert len(via.slim_layers) == 3 and via.slim_layers[0] == 0 and via.slim_layers[-1] == 3


def test_independent_middle_model_ablation_runs(tiny_llama, tiny_model_dirs):
    from pipeline.models import ModelConfig

    cfg = VIASDConfig(middle="model", middle_model=ModelConfig(name="tiny-qwen3", path=str(tiny_model_dirs["qwen3"])),
                      agree_threshold=0.05, slim_threshold=0.06)
    state = generate(make(VIASD, cfg, tiny_llama), tiny_llama, PROMPTS[2], max_new_tokens=16, seed=0)
    assert len(state.new_tokens) == 16


def test_bad_config_values_are_one_line_errors(tiny_llama):
    with pytest.raises(ConfigError, match="method.agreement"):
        VIASDConfig(agreement="js")
    with pytest.raises(ConfigError, match="not found"):
        make(VIASD, VIASDConfig(mask="no-such-mask"), tiny_llama)
