"""Standard speculative decoding: greedy equals AR token for token with every drafter kind, and
sampling keeps the target's distribution."""

import collections
import random

import pytest
import torch

from decoding.methods.ar import AR
from decoding.drafting.drafter import DrafterConfig
from decoding.engine.loop import generate
from decoding.drafting.exit_head import save_exit_head
from decoding.drafting.routing import save_mask
from decoding.methods.sd import SDConfig, SpeculativeDecoding
from pipeline.models import ModelConfig


def make_sd(target, drafter: DrafterConfig) -> SpeculativeDecoding:
    method = SpeculativeDecoding(SDConfig(), drafter=drafter)
    method.setup(target)
    return method


def drafter_configs(tmp_path, tiny_model_dirs, exit_head):
    mask = tmp_path / "mask.json"
    save_mask(mask, [1, 2], num_layers=4)
    save_exit_head(exit_head, tmp_path / "head", exit_layer=2)
    return [
        DrafterConfig(kind="early_exit", exit_layer=2, gamma=4),
        DrafterConfig(kind="early_exit", exit_layer=2, gamma=4, head=str(tmp_path / "head")),
        DrafterConfig(kind="slim", mask=str(mask), gamma=3),
        DrafterConfig(kind="model", gamma=5, model=ModelConfig(name="tiny-qwen3", path=str(tiny_model_dirs["qwen3"]))),
    ]


def test_greedy_equals_ar_over_random_prompts(tiny_target, tmp_path, tiny_model_dirs, random_exit_head):
    rng = random.Random(0)
    prompts = [[rng.randrange(6, 90) for _ in range(rng.randrange(2, 12))] for _ in range(4)]
    for cfg in drafter_configs(tmp_path, tiny_model_dirs, random_exit_head(tiny_target.config.hidden_size)):
        sd = make_sd(tiny_target, cfg)
        for prompt in prompts:
            ar = generate(AR(), tiny_target, prompt, max_new_tokens=20).new_tokens
            state = generate(sd, tiny_target, prompt, max_new_tokens=20)
            assert state.new_tokens == ar, (cfg.kind, prompt)
        assert state.stats.num_draft_tokens > 0


def test_stop_tokens_and_length_limit_match_ar(tiny_llama):
    sd = make_sd(tiny_llama, DrafterConfig(exit_layer=3, gamma=6))
    prompt = [7, 30, 31, 32]
    ar = generate(AR(), tiny_llama, prompt, max_new_tokens=13).new_tokens
    assert generate(sd, tiny_llama, prompt, max_new_tokens=13).new_tokens == ar
    stop = {ar[5]}
    ar_stop = generate(AR(), tiny_llama, prompt, max_new_tokens=13, stop_ids=stop).new_tokens
    assert generate(sd, tiny_llama, prompt, max_new_tokens=13, stop_ids=stop).new_tokens == ar_stop


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(tiny_llama):
    """T=1: the first generated token (the first draft's accept / residual-resample decision) is
    distributed as the target's softmax: chi-square goodness of fit, fixed seeds."""
    sd = make_sd(tiny_llama, DrafterConfig(exit_layer=2, gamma=3))
    prompt = [7, 30, 31, 30, 31, 30]
    n = 300
    counts = collections.Counter(
        generate(sd, tiny_llama, prompt, max_new_tokens=1, temperature=1.0, seed=s).new_tokens[0] for s in range(n))
    assert_matches_target(tiny_llama, prompt, counts, n)


def assert_matches_target(target, prompt, counts, n):
    import torch
    from scipy.stats import chisquare

    target.prefill(prompt[:-1])
    probs = torch.softmax(target.forward(torch.tensor(prompt[-1:]), torch.arange(1), None).logits[0], -1)
    top = probs.argsort(descending=True)[:5].tolist()
    expected = [float(probs[t]) * n for t in top] + [n * (1 - float(probs[top].sum()))]
    observed = [counts[t] for t in top] + [n - sum(counts[t] for t in top)]
    expected = [e * n / sum(expected) for e in expected]  # float sums must match the counts exactly
    assert chisquare(observed, expected).pvalue > 1e-3


def test_a_drafter_with_fewer_output_rows_than_the_target_drafts_with_padded_logits(tiny_model_dirs, tmp_path):
    """Same tokenizer, padded embeddings (Qwen2.5-0.5B: 151936 rows, 7B: 152064): the drafter's q gets the
    target's extra rows at zero probability, so q and p align (it crashed at p - q); a drafter with more
    rows than the target is refused."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from decoding.engine.target import TargetModel
    from pipeline.errors import ConfigError

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["qwen3"])
    rows = len(tokenizer)
    config = AutoConfig.from_pretrained(tiny_model_dirs["qwen3"])
    config.vocab_size = rows + 8
    torch.manual_seed(1)
    wide = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        wide.lm_head.weight[rows:] = 0  # padding rows, as trained models never pick them
    wide.save_pretrained(tmp_path / "wide")
    tokenizer.save_pretrained(tmp_path / "wide")
    target = TargetModel(AutoModelForCausalLM.from_pretrained(tmp_path / "wide", dtype=torch.float32).eval(), tokenizer)
    narrow = DrafterConfig(kind="model", gamma=4,
                           model=ModelConfig(name="tiny-qwen3", path=str(tiny_model_dirs["qwen3"])))
    prompt = [7, 30, 31, 32, 30, 31]
    ar = generate(AR(), target, prompt, max_new_tokens=16).new_tokens
    assert max(ar) < rows
    assert generate(make_sd(target, narrow), target, prompt, max_new_tokens=16).new_tokens == ar
    state = generate(make_sd(target, narrow), target, prompt, max_new_tokens=16, temperature=1.0, seed=3)
    assert len(state.new_tokens) == 16 and state.stats.num_draft_tokens > 0
    small = TargetModel(AutoModelForCausalLM.from_pretrained(tiny_model_dirs["qwen3"], dtype=torch.float32).eval(),
                        tokenizer)
    backwards = DrafterConfig(kind="model", model=ModelConfig(name="wide", path=str(tmp_path / "wide")))
    with pytest.raises(ConfigError, match=rf"has {rows + 8} output rows, more than the target's {rows}"):
        make_sd(small, backwards)
