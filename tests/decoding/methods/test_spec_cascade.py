"""Speculative cascades: deferral rules against hand-computed cases, speculative sampling against π,
and the two limits (π = q_l reproduces sd exactly; π = q_s accepts every draft)."""

import collections

import pytest
import torch
from scipy.stats import chisquare

from decoding.engine.acceptance import accept_against
from decoding.engine.sampling import Sampler
from decoding.drafting.drafter import DrafterConfig
from decoding.engine.loop import generate
from decoding.methods.sd import SDConfig, SpeculativeDecoding
from decoding.methods.spec_cascade import SpecCascadeConfig, SpeculativeCascade, cascade_target
from decoding.engine.tree import TokenTree
from pipeline.errors import ConfigError

QS = torch.tensor([0.6, 0.3, 0.1])
QL = torch.tensor([0.2, 0.7, 0.1])  # TV(QS, QL) = 0.4


@pytest.mark.parametrize("rule, alpha, expected, small_mass", [
    ("chow", 0.5, QS.tolist(), 1.0),  # 0.6 >= 1 - 0.5: keep q_s
    ("chow", 0.3, QL.tolist(), 0.0),  # 0.6 <  0.7: defer
    ("diff", 0.2, QS.tolist(), 1.0),  # 0.6 >= 0.7 - 0.2
    ("diff", 0.05, QL.tolist(), 0.0),  # 0.6 <  0.65
    ("opt", 0.5, QS.tolist(), 1.0),  # 0.6 >= 0.7 - 0.5 * 0.4 = 0.5
    ("opt", 0.2, QL.tolist(), 0.0),  # 0.6 <  0.7 - 0.2 * 0.4 = 0.62
    ("v1", 0.2, [0.68, 0.28, 0.04], 0.6),  # passes: q_s(v) >= 0.5 -> {0}; π = [.6,0,0] + 0.4 q_l
    ("v2", 0.55, [0.62, 0.37, 0.01], 0.9),  # passes: q_l(v) >= 0.15 -> {0,1}; π = [.6,.3,0] + 0.1 q_l
    ("v3", 0.5, [0.14, 0.79, 0.07], 0.3),  # passes: q_l(v) >= 0.35 -> {1}; π = [0,.3,0] + 0.7 q_l
])
def test_deferral_rules_match_hand_computed_targets(rule, alpha, expected, small_mass):
    pi, mass = cascade_target(rule, alpha, QS, QL)
    torch.testing.assert_close(pi, torch.tensor(expected), atol=1e-6, rtol=0)
    assert abs(float(pi.sum()) - 1) < 1e-6
    assert float(mass) == pytest.approx(small_mass)


def test_rules_apply_per_position_in_a_batch():
    batch, mass = cascade_target("chow", 0.5, torch.stack([QS, QL]), torch.stack([QL, QS]))
    torch.testing.assert_close(batch, torch.stack([QS, QL]))  # row 2: its q_s (= QL) has max 0.7 >= 0.5
    assert mass.tolist() == [1.0, 1.0]


def test_unknown_rule_is_one_line_error():
    with pytest.raises(ConfigError, match="method.rule"):
        SpecCascadeConfig(rule="bild")


def test_speculative_sampling_against_pi_emits_pi():
    """One drafted token x ~ q_s, accepted with min(1, π(x)/q_s(x)), else residual norm(max(0, π - q_s))."""
    pi, _ = cascade_target("v1", 0.2, QS, QL)
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler(1)
    n = 4000
    counts = collections.Counter()
    for _ in range(n):
        x = int(torch.multinomial(QS, 1, generator=gen))
        verdict = accept_against(TokenTree.chain(9, [x], [QS]), torch.stack([pi, QL]), sampler)
        counts[x if verdict.num_accepted else verdict.bonus] += 1
    probs = [float(p) for p in pi]
    assert chisquare([counts[v] for v in range(3)], [n * p / sum(probs) for p in probs]).pvalue > 1e-3


def make(cls, config, target, gamma=4):
    method = cls(config, drafter=DrafterConfig(exit_layer=2, gamma=gamma))
    method.setup(target)
    return method


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_pi_equal_to_large_model_reproduces_sd(tiny_llama, temperature):
    """chow with α = 0 never keeps q_s (max q_s < 1), so π = q_l: same tokens as sd, same seed."""
    sd = make(SpeculativeDecoding, SDConfig(), tiny_llama)
    cascade = make(SpeculativeCascade, SpecCascadeConfig(rule="chow", alpha=0.0), tiny_llama)
    for seed, prompt in enumerate([[7, 30, 31, 32], [40, 41, 42, 43, 44, 45]]):
        a = generate(sd, tiny_llama, prompt, max_new_tokens=16, temperature=temperature, seed=seed).new_tokens
        b = generate(cascade, tiny_llama, prompt, max_new_tokens=16, temperature=temperature, seed=seed).new_tokens
        assert a == b
    assert generate(cascade, tiny_llama, [7, 30, 31, 32], max_new_tokens=8).stats.extra["small_mass_kept"] == 0


def test_pi_equal_to_small_model_accepts_every_draft(tiny_llama):
    cascade = make(SpeculativeCascade, SpecCascadeConfig(rule="chow", alpha=1.0), tiny_llama)
    state = generate(cascade, tiny_llama, [7, 30, 31, 32], max_new_tokens=20, temperature=1.0, seed=3)
    assert state.stats.num_draft_tokens > 0
    assert state.stats.num_accepted_tokens == state.stats.num_draft_tokens
    assert state.stats.extra["small_mass_kept"] == state.stats.extra["positions_scored"]
