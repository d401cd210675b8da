"""VIA-SD: a token settled without the full model is distributed as q' (zones=note; zones=gated's untested
tier is not); forcing every token to the full verifier (zones=gated) reproduces sd exactly; zones A-B alone
never run the full model; the full model's KV after slim-settled tokens equals a fresh prefill."""

from types import SimpleNamespace

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
    via = make(VIASD, VIASDConfig(mask=mask_file, zones="gated", agree_threshold=2.0, slim_threshold=2.0), tiny_target)
    for seed, prompt in enumerate(PROMPTS[:2]):
        a = generate(sd, tiny_target, prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        b = generate(via, tiny_target, prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        assert a.new_tokens == b.new_tokens
        assert b.stats.extra.get("settled_direct", 0) == b.stats.extra.get("settled_slim", 0) == 0
        assert b.stats.num_accepted_tokens == a.stats.num_accepted_tokens


@pytest.mark.parametrize("zones", ["note", "gated"])
def test_zones_a_and_b_alone_never_run_the_full_model(tiny_target, mask_file, zones):
    untested = {"agree_threshold": 0.0} if zones == "gated" else {}
    via = make(VIASD, VIASDConfig(mask=mask_file, zones=zones, slim_threshold=0.0, **untested), tiny_target)
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


@pytest.mark.parametrize("zones", ["note", "gated"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_full_kv_after_slim_settled_tokens_equals_a_fresh_prefill(tiny_target, mask_file, temperature, zones):
    untested = {"agree_threshold": 0.05} if zones == "gated" else {}
    via = make(VIASD, VIASDConfig(mask=mask_file, zones=zones, slim_threshold=0.1, **untested), tiny_target)
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
                      slim_threshold=0.06)
    state = generate(make(VIASD, cfg, tiny_llama), tiny_llama, PROMPTS[2], max_new_tokens=16, seed=0)
    assert len(state.new_tokens) == 16


def test_bad_config_values_are_one_line_errors(tiny_llama):
    with pytest.raises(ConfigError, match="method.agreement"):
        VIASDConfig(agreement="js")
    with pytest.raises(ConfigError, match="method.zones"):
        VIASDConfig(zones="paper")
    with pytest.raises(ConfigError, match="zones=gated"):  # a threshold that would have no effect
        VIASDConfig(agree_threshold=0.5)
    with pytest.raises(ConfigError, match="not found"):
        make(VIASD, VIASDConfig(mask="no-such-mask"), tiny_llama)


def emitted_at_one_position(zones: str, p_row, s_row, n: int = 40000, seed: int = 0) -> torch.Tensor:
    """The token a block's position emits when zone C is closed (max q' >= τ_slim = 0), as the fraction
    of n independent positions: x ~ p, then the plan keeps x or q' regenerates. One `plan` call with
    n positions of the same p and q' rows, each decided independently."""
    from decoding.engine.sampling import Sampler

    via = VIASD(VIASDConfig(zones=zones, slim_threshold=0.0))
    p = torch.tensor(p_row, dtype=torch.float64).expand(n, -1)
    s = torch.tensor(s_row, dtype=torch.float64).expand(n + 1, -1)
    drafts = torch.multinomial(p, 1, replacement=True, generator=torch.Generator().manual_seed(seed))[:, 0].tolist()
    state = SimpleNamespace(sampler=Sampler(seed + 1, "cpu"), greedy=False)
    plan = via.plan(state, drafts, p, s)
    assert all(keep or regen for keep, regen in zip(plan["keep"], plan["regenerate"]))
    emitted = [x if keep else r for x, keep, r in zip(drafts, plan["keep"], plan["regen"])]
    return torch.bincount(torch.tensor(emitted), minlength=len(p_row)).double() / n


# q' and p agree on token 0 with high confidence, p more so than q' (the case where they differ)
Q_SLIM, P_DRAFT = [0.75, 0.2, 0.05], [0.95, 0.03, 0.02]


def test_zones_a_and_b_emit_the_slim_verifiers_distribution():
    """zones=note: every kept draft passed the test against q', so with the residual draw the position
    is a speculative-sampling step against q': the emitted token is distributed as q'."""
    freq = emitted_at_one_position("note", P_DRAFT, Q_SLIM)
    torch.testing.assert_close(freq, torch.tensor(Q_SLIM, dtype=torch.float64), atol=0.01, rtol=0)


def test_the_gated_reconstructions_untested_tier_emits_the_drafters_token_instead():
    """zones=gated keeps x = argmax q' untested when min(p(x), q'(x)) >= τ_agree (0.7): here it emits
    token 0 with p's probability 0.95, not q''s 0.75 (the departure its docstring states)."""
    freq = emitted_at_one_position("gated", P_DRAFT, Q_SLIM)
    assert abs(freq[0].item() - 0.95) < 0.01 and abs(freq[0].item() - 0.75) > 0.1


def test_greedy_zone_a_keeps_the_drafts_q_prime_picks_and_zone_c_takes_the_rest(tiny_target, mask_file):
    """zones=note at T = 0 with zone B closed (τ_slim > 1): a block keeps its drafts while each is
    q''s argmax, and the full verifier settles the rest; no token comes from q' itself."""
    via = make(VIASD, VIASDConfig(mask=mask_file, slim_threshold=2.0), tiny_target)
    state = generate(via, tiny_target, PROMPTS[1], max_new_tokens=24, seed=0)
    extra = state.stats.extra
    assert len(state.new_tokens) == 24 and extra.get("settled_slim", 0) == 0
    assert extra["escalations"] == state.stats.num_steps
    assert extra.get("settled_direct", 0) + extra["settled_full"] == 24
