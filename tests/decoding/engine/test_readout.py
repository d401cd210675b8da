"""decoding/engine/readout.py: the layer-subset path repeats what a model's forward does around its decoder
stack (Granite's embedding multiplier and logit divisor, Cohere's logit scale, Gemma 2's soft-cap), and a
family doing something it does not know is refused with one line instead of decoding with another model."""

import functools

import pytest
import torch

from decoding.engine.attention_layout import UnsupportedArchitecture
from decoding.engine.loop import generate
from decoding.engine.readout import Readout
from decoding.engine.target import TargetModel
from decoding.methods.ar import AR
from pipeline.zoo import build_method, mixed_prompts, random_config, random_target

SCALED = ("granite", "cohere", "gemma2")  # the families whose forward scales or caps around the stack


@functools.cache
def target(arch: str):
    return random_target("tiny", arch=arch)


def test_the_readout_is_read_from_the_config():
    assert Readout.of(random_config("tiny", "granite")) == Readout(embedding_multiplier=2.0, logits_divisor=2.0)
    assert Readout.of(random_config("tiny", "cohere")) == Readout(logits_multiplier=0.5)
    assert Readout.of(random_config("tiny", "gemma2")) == Readout(softcap=30.0)
    assert Readout.of(random_config("tiny", "qwen3")).plain
    hyperclovax = random_config("tiny", "granite")  # the same fields, the other direction
    hyperclovax.model_type = "hyperclovax"
    assert Readout.of(hyperclovax) == Readout(embedding_multiplier=2.0, logits_multiplier=2.0)


@pytest.mark.parametrize("arch", SCALED)
def test_the_layer_subset_path_over_every_layer_is_the_models_forward(arch):
    """Before the readout, Granite's and Cohere's subset logits differed from the model's by ~5 (no multiplier, no
    scale): an early-exit or slim drafter, VIA-SD's slim verifier and DIMR read another model than the target."""
    t = target(arch)
    seq = mixed_prompts(2, 500)[1]
    t.prefill(seq[:10])
    subset = t._run_layers(torch.tensor(seq[10:]), torch.arange(10, len(seq)), None, (), False, t.layers).logits
    t.prefill(seq[:10])
    full = t.forward(seq[10:], list(range(len(seq) - 10))).logits
    torch.testing.assert_close(subset, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ("granite", "cohere"))
def test_slim_and_early_exit_methods_decode_on_scaled_families(arch, tmp_path):
    """sd (early exit) and sd_slim stay AR's tokens (fp32), and VIA-SD decodes through its slim verifier."""
    t = target(arch)
    prompt = mixed_prompts(1, 500)[0]
    ar = generate(AR(), t, prompt, max_new_tokens=16).new_tokens
    for name in ("sd", "sd_slim"):
        assert generate(build_method(name, t, tmp_path), t, prompt, max_new_tokens=16).new_tokens == ar, name
    state = generate(build_method("via_sd", t, tmp_path), t, prompt, max_new_tokens=16)
    assert len(state.new_tokens) == 16 and state.stats.extra["slim_forwards"] > 0


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
    monkeypatch.setattr(Readout, "check", lambda self, model: checks.append(model))
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
