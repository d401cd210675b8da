"""The early-exit drafter's trained exit head (tuned-lens translator): an untrained head is the plain
early exit, a trained one computes lm_head(norm(h + A h + b)) on layer k's residual stream, with the
drafter's own cache; checkpoints round-trip and bad ones fail with one clear error."""

import json

import pytest
import torch

from decoding.drafting.exit_head import ExitTranslator, read_exit_head, save_exit_head
from decoding.engine.target import TargetModel
from pipeline.errors import ConfigError


def test_untrained_head_is_the_plain_early_exit(tiny_target):
    ids = torch.tensor([5, 9, 14, 20, 7, 11])
    plain = TargetModel(tiny_target.model, layers=range(2))
    headed = TargetModel(tiny_target.model, layers=range(2), exit_head=ExitTranslator(tiny_target.config.hidden_size))
    for lm in (plain, headed):
        lm.reset()
    a = plain.forward(ids, torch.arange(len(ids)), None).logits
    b = headed.forward(ids, torch.arange(len(ids)), None).logits
    assert torch.allclose(a, b, atol=1e-6)


def test_head_translates_layer_k_before_the_final_norm_with_its_own_cache(tiny_target, random_exit_head):
    model, k = tiny_target.model, 2
    head = random_exit_head(tiny_target.config.hidden_size)
    ids = torch.tensor([5, 9, 14, 20, 7, 11, 30])
    with torch.no_grad():
        h = model(input_ids=ids[None], output_hidden_states=True).hidden_states[k][0]
        expected = model.lm_head(model.model.norm(head(h))).float()
    lm = TargetModel(model, layers=range(k), exit_head=head)
    lm.prefill(ids[:4].tolist())  # cached prefix, then an incremental block
    got = lm.forward(ids[4:], torch.arange(3), None).logits
    assert torch.allclose(got, expected[4:], atol=1e-4)


def test_under_a_device_map_the_head_sits_on_the_device_of_the_layer_it_follows():
    """device_map=auto spreads the layers over GPUs; the head reads the exit layer's output, which stays on that
    layer's device (a layer's hook does not bring it back), so the head must live there, not with the embedding."""
    from pipeline.zoo import random_target

    model = random_target("tiny", arch="llama", seed=3).model
    model.model.layers[1].to("meta")  # a second device: the meta device stands in for another GPU
    size = model.config.hidden_size
    assert next(TargetModel(model, layers=range(2), exit_head=ExitTranslator(size)).exit_head.parameters()).is_meta
    assert next(TargetModel(model, layers=range(1), exit_head=ExitTranslator(size)).exit_head.parameters()).device \
        == torch.device("cpu")


def test_checkpoint_round_trip_and_errors(tmp_path, random_exit_head):
    head = random_exit_head(8)
    save_exit_head(head, tmp_path / "h", exit_layer=3)
    loaded, exit_layer = read_exit_head(str(tmp_path / "h"))
    assert exit_layer == 3 and torch.equal(loaded.proj.weight, head.proj.weight)
    assert not any(p.requires_grad for p in loaded.parameters())
    with pytest.raises(ConfigError, match="no exit-head checkpoint"):
        read_exit_head(str(tmp_path / "missing"))
    (tmp_path / "h" / "config.json").write_text(json.dumps({"kind": "other"}))
    with pytest.raises(ConfigError, match="is not a tuned_lens exit head"):
        read_exit_head(str(tmp_path / "h"))
    (tmp_path / "h" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        read_exit_head(str(tmp_path / "h"))
    (tmp_path / "h" / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="is not a tuned_lens exit head"):
        read_exit_head(str(tmp_path / "h"))
    (tmp_path / "h" / "config.json").write_text(json.dumps({"kind": "tuned_lens", "exit_layer": 3, "hidden_size": 16}))
    with pytest.raises(ConfigError, match=r"do not match config.json \(size mismatch for proj") as err:
        read_exit_head(str(tmp_path / "h"))
    assert "\n" not in str(err.value)
    (tmp_path / "h" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="unreadable exit-head checkpoint") as err:
        read_exit_head(str(tmp_path / "h"))
    assert "\n" not in str(err.value)


def test_head_is_only_for_early_exit_drafters():
    from decoding.drafting.drafter import DrafterConfig

    with pytest.raises(ConfigError, match="drafter.head is for drafter.kind=early_exit"):
        DrafterConfig(kind="slim", mask="m", head="h")
