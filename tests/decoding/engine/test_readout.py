"""decoding/engine/readout.py: the layer-subset path repeats what a model's forward does around its decoder
stack (Granite's embedding multiplier and logit divisor, Cohere's logit scale, Gemma 2's soft-cap), and a
family doing something it does not know is refused with one line instead of decoding with another model."""

import functools
from types import SimpleNamespace

import pytest
import torch

from decoding.engine.attention_layout import UnsupportedArchitecture
from decoding.engine.readout import Readout
from decoding.engine.target import TargetModel
from pipeline.zoo import mixed_prompts, random_config, random_target, subset_and_full_logits

SCALED = ("granite", "cohere", "gemma2")  # the families whose forward scales or caps around the stack


@functools.cache
def target(arch: str):
    return random_target("tiny", arch=arch)


def test_the_readout_is_read_from_the_config():
    assert Readout.of(random_config("tiny", "granite")) == Readout(embedding_multiplier=2.0, logits_divisor=2.0)
    assert Readout.of(random_config("tiny", "cohere")) == Readout(logits_multiplier=0.5)
    assert Readout.of(random_config("tiny", "gemma2")) == Readout(softcap=30.0)
    assert Readout.of(random_config("tiny", "qwen3")) == Readout()
    hyperclovax = random_config("tiny", "granite")  # the same fields, the other direction
    hyperclovax.model_type = "hyperclovax"
    assert Readout.of(hyperclovax) == Readout(embedding_multiplier=2.0, logits_multiplier=2.0)
    # not a number (MPT's logit_scale may be "inv_sqrt_d_model"): not read, left to the check
    assert Readout.of(SimpleNamespace(model_type="mpt", logit_scale="inv_sqrt_d_model")) == Readout()
    assert Readout(logits_divisor=4.0, logits_multiplier=0.5, softcap=30.0).linear_factor == 0.125


def test_minicpm3_divides_its_hidden_states_before_the_head_and_passes_the_check_in_bf16():
    """MiniCPM3's logits_scaling divides the final hidden states, not the logits: in bf16 the two differ by a
    rounding, which the check's tolerance (roundings of the model's dtype) must not take for another model."""
    from transformers import AutoModelForCausalLM, MiniCPM3Config

    config = MiniCPM3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=4, dim_model_base=6, initializer_range=1.0,
                            qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=16)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    readout = Readout.of(model.config)
    assert readout == Readout(hidden_divisor=64 / 6)
    readout.check(model)
    Readout(logits_divisor=64 / 6).check(model)  # the same within the model's roundings (one bf16 step apart)
    with pytest.raises(UnsupportedArchitecture):
        Readout().check(model)


@pytest.mark.parametrize("arch", SCALED)
def test_the_layer_subset_path_over_every_layer_is_the_models_forward(arch):
    """Before the readout, Granite's and Cohere's subset logits differed from the model's by ~5 (no multiplier, no
    scale): an early-exit or slim drafter, VIA-SD's slim verifier and DIMR read another model than the target."""
    subset, full = subset_and_full_logits(target(arch), mixed_prompts(2, 500)[1])
    torch.testing.assert_close(subset, full, atol=1e-5, rtol=1e-5)


def test_a_family_doing_more_than_the_readout_knows_is_refused_with_one_line():
    granite = target("granite")
    with pytest.raises(UnsupportedArchitecture, match="granite: its forward does something around its decoder stack"):
        Readout().check(granite.model)  # the plain readout: Granite's multiplier and divisor missing
    for arch in SCALED:
        target(arch).readout.check(target(arch).model)  # its own readout passes


def test_the_check_runs_at_the_first_layer_subset_pass(monkeypatch):
    """A wrapper made of a subset of a model's layers checks its readout at its first pass, so no method that runs
    a subset of the layers decodes with an unchecked readout; once per model (its other wrappers share it), and
    the full model's own forward needs none."""
    granite = random_target("tiny", arch="granite")  # a model no test has checked yet
    checks = []
    monkeypatch.setattr(Readout, "check", lambda self, model, **kwargs: checks.append(model))
    prompt = mixed_prompts(1, 500)[0]
    full = TargetModel(granite.model)
    full.prefill(prompt)
    full.forward(prompt[-2:], [0, 1])
    assert checks == []
    for layers in (range(3), (0, 2, 4)):
        drafter = TargetModel(granite.model, layers=layers)
        drafter.prefill(prompt)
        drafter.forward(prompt[-2:], [0, 1])
    assert checks == [granite.model]
