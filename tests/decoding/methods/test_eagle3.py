"""EAGLE-3 end to end on the tiny targets: a (random) drafter in the published format, drafting the
dynamic tree or the chain, reproduces AR exactly at T=0 and AR's distribution at T=1."""

import collections
import json

import pytest
import torch

from decoding.engine.loop import generate
from decoding.methods.ar import AR
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


@pytest.mark.parametrize("config", [dict(), dict(total_tokens=12, depth=3, top_k=3), dict(tree=False, chain_length=4)],
                         ids=["paper-defaults", "small-tree", "chain"])
def test_greedy_equals_ar(tiny_target, tmp_path, config):
    method = Eagle3(Eagle3Config(drafter=tiny_eagle3(tiny_target, tmp_path / "eagle3"), **config))
    method.setup(tiny_target)
    ar = generate(AR(), tiny_target, PROMPT, max_new_tokens=40).new_tokens
    state = generate(method, tiny_target, PROMPT, max_new_tokens=40)
    assert state.new_tokens == ar
    assert state.stats.num_draft_tokens > 0 and state.stats.extra["drafter_forwards"] > 0
    one = generate(method, tiny_target, PROMPT[:1], max_new_tokens=8)  # a one-token prompt: no row to draft from yet
    assert one.new_tokens == generate(AR(), tiny_target, PROMPT[:1], max_new_tokens=8).new_tokens


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
    with pytest.raises(ConfigError, match=r"does not fit this target .*layers \[1, 7, 9\] of 4"):
        Eagle3(Eagle3Config(drafter=folder)).setup(tiny_llama)
    with pytest.raises(ConfigError, match="no EAGLE-3 drafter is known for this model"):
        Eagle3(Eagle3Config()).setup(tiny_llama)


def test_eagle3_drafts_for_sd_and_spec_cascade(tiny_target, tmp_path):
    from decoding.drafting.drafter import DrafterConfig
    from decoding.methods.sd import SDConfig, SpeculativeDecoding
    from decoding.methods.spec_cascade import SpecCascadeConfig, SpeculativeCascade
    from decoding.methods.via_sd import VIASD, VIASDConfig

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
    with pytest.raises(ConfigError, match="via_sd does not take drafter=eagle3 yet"):
        VIASD(VIASDConfig(), drafter=drafter).setup(tiny_target)
    with pytest.raises(ConfigError, match="no EAGLE-3 checkpoint is known"):
        DrafterConfig(kind="eagle3")
