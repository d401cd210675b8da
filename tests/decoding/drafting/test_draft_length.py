"""The draft length γ: Leviathan et al.'s optimum from (α, c), the estimates a generation's steps give, and sd /
spec_cascade with `drafter.gamma_policy=optimal` still equal to AR at T = 0 (EAGLE-3's chain with
`method.chain_policy=optimal`: tests/decoding/methods/test_eagle3.py)."""

import pytest

from decoding.drafting.draft_length import WARMUP_STEPS, DraftLength, best_gamma, expected_speedup
from decoding.drafting.drafter import DrafterConfig
from decoding.engine.loop import generate
from decoding.engine.metrics import GenerationStats
from decoding.methods.ar import AR
from decoding.methods.eagle3 import Eagle3Config
from decoding.methods.sd import SDConfig, SpeculativeDecoding
from decoding.methods.spec_cascade import SpeculativeCascade, SpecCascadeConfig
from decoding.methods.via_sd import VIASD, VIASDConfig
from pipeline.errors import ConfigError


def test_expected_speedup_is_the_papers_formula():
    # α = 0.8, c = 0: (1 - 0.8^4) / 0.2 tokens a step for γ = 3, nothing to pay for them
    assert expected_speedup(3, 0.8, 0.0) == pytest.approx((1 - 0.8 ** 4) / 0.2)
    assert expected_speedup(3, 0.8, 0.1) == pytest.approx((1 - 0.8 ** 4) / 0.2 / 1.3)


def test_best_gamma_follows_alpha_and_cost():
    # the paper's Figure 3: a better drafter or a cheaper one wants longer drafts
    assert best_gamma(0.9, 0.01, 10) > best_gamma(0.6, 0.01, 10) > best_gamma(0.3, 0.01, 10)
    assert best_gamma(0.8, 0.01, 10) > best_gamma(0.8, 0.2, 10)
    # exhaustive check against the formula on a grid, and the cap
    for alpha in (0.2, 0.5, 0.7, 0.95):
        for cost in (0.0, 0.05, 0.3):
            g = best_gamma(alpha, cost, 8)
            assert all(expected_speedup(g, alpha, cost) >= expected_speedup(k, alpha, cost) for k in range(1, 9))
    assert best_gamma(0.999, 0.0, 6) == 6  # α is capped below 1, and γ at max_gamma


def record(stats: GenerationStats, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
    stats.record_step(drafted, accepted, list(range(1, accepted + 1)))
    stats.add_time(draft=draft_s, verify=verify_s)


def test_estimates_from_the_steps():
    stats, length = GenerationStats(), DraftLength(5, "optimal", max_gamma=8)
    gammas = []
    # every step: 4 of 5 drafts accepted, then a rejection -> α = 4 / 5; a draft costs 1 ms, a verify 40 ms
    for _ in range(WARMUP_STEPS + 3):
        gammas.append(length.next(stats))
        record(stats, 5, 4, 0.005, 0.040)
    assert gammas[:WARMUP_STEPS] == [5] * WARMUP_STEPS  # drafter.gamma until the estimates mean something
    assert length.alpha == pytest.approx(0.8) and length.cost == pytest.approx(0.001 / 0.040)
    assert gammas[-1] == best_gamma(0.8, 0.025, 8)
    # a step whose drafts all pass is no rejection: α pools steps of different γ exactly
    record(stats, 2, 2, 0.002, 0.040)
    length.next(stats)
    assert length.alpha == pytest.approx((4 * (WARMUP_STEPS + 3) + 2) / (5 * (WARMUP_STEPS + 3) + 2))
    length.record(stats)
    assert stats.extra["draft_rejections"] == WARMUP_STEPS + 3
    assert stats.extra["draft_accepted"] == 4 * (WARMUP_STEPS + 3) + 2
    # the last step, which record() does not read, is left out (a stop token may have cut its drafts)
    record(stats, 5, 1, 0.005, 0.040)
    again = GenerationStats(extra={})
    length.record(again)
    assert again.extra["draft_rejections"] == WARMUP_STEPS + 3
    # a given cost is used as it is, and fixed ignores everything
    given, fresh = DraftLength(5, "optimal", max_gamma=8, draft_cost=0.5), GenerationStats()
    for _ in range(WARMUP_STEPS + 1):
        given.next(fresh)
        record(fresh, 5, 4, 0.005, 0.040)
    given.next(fresh)
    assert given.cost == 0.5
    assert DraftLength(3).next(stats) == 3


def test_config_checks():
    with pytest.raises(ConfigError, match="drafter.gamma_policy='adaptive'"):
        DrafterConfig(gamma_policy="adaptive")
    with pytest.raises(ConfigError, match="drafter.draft_cost=-1"):
        DrafterConfig(gamma_policy="optimal", draft_cost=-1.0)
    with pytest.raises(ConfigError, match="chain_policy=optimal sets the chain's length: it needs method.tree=false"):
        Eagle3Config(chain_policy="optimal")
    with pytest.raises(ConfigError, match="once per chain length"):
        Eagle3Config(tree=False, chain_policy="optimal", compile=True)
    with pytest.raises(ConfigError, match="method.draft_cost=-0.5"):
        Eagle3Config(tree=False, chain_policy="optimal", draft_cost=-0.5)


def test_sd_and_spec_cascade_with_the_optimal_gamma_equal_ar(tiny_llama):
    """fp32, T = 0: γ changes from step to step and the output is still AR's; the drafts' count shows it changed."""
    prompts = [[7, 30, 31, 30, 31, 30, 31], [5, 9, 44, 12, 3]]
    drafter = DrafterConfig(exit_layer=3, gamma=6, gamma_policy="optimal", max_gamma=4, draft_cost=0.05)
    sd = SpeculativeDecoding(SDConfig(), drafter=drafter)
    sd.setup(tiny_llama)
    cascade = SpeculativeCascade(SpecCascadeConfig(rule="chow", alpha=0.0), drafter=drafter)
    cascade.setup(tiny_llama)
    for prompt in prompts:
        ar = generate(AR(), tiny_llama, prompt, max_new_tokens=24).new_tokens
        state = generate(sd, tiny_llama, prompt, max_new_tokens=24)
        assert state.new_tokens == ar
        stats = state.stats
        assert stats.num_steps > WARMUP_STEPS
        assert stats.num_draft_tokens < 6 * stats.num_drafts  # after the warm-up, γ <= max_gamma = 4 < 6
        assert "draft_rejections" in stats.extra
        generate(cascade, tiny_llama, prompt, max_new_tokens=24)  # runs with the same policy


def test_via_sd_refuses_the_policy(tiny_llama):
    with pytest.raises(ConfigError, match="gamma_policy=optimal is for sd and spec_cascade"):
        VIASD(VIASDConfig(), drafter=DrafterConfig(exit_layer=2, gamma_policy="optimal")).setup(tiny_llama)
