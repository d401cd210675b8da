"""benchmarks/widen_eagle3.py: a wider EAGLE-3 MLP that computes the same function, and trains its new units."""

import importlib.util
from pathlib import Path

import torch

from decoding.drafting.eagle3_drafter import Eagle3Drafter, Eagle3Spec

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "widen_eagle3.py"


def load_script():
    spec = importlib.util.spec_from_file_location("widen_eagle3", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_widened_drafter_computes_the_same_steps_and_its_new_units_learn():
    torch.manual_seed(0)
    spec = Eagle3Spec(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=64, draft_vocab_size=16, target_hidden_size=32, head_dim=8)
    model = Eagle3Drafter(spec)
    for p in model.parameters():  # a trained drafter's weights are not the init's (zero or one) tensors
        torch.nn.init.normal_(p, std=0.2)
    wide = load_script().widened(model, 80)
    assert wide.spec.intermediate_size == 80 and wide.midlayer.mlp.down_proj.weight.shape == (32, 80)
    embeds, hidden, positions = torch.randn(5, 32), torch.randn(5, 32), torch.arange(5)
    empty = model.new_cache()
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    before = model.step(embeds, hidden, positions, empty.keys, empty.values, mask)[0]
    after = wide.step(embeds, hidden, positions, empty.keys, empty.values, mask)[0]
    torch.testing.assert_close(after, before)
    # the new units' output columns start at zero, yet receive a gradient, so training can use them
    wide.logits(wide.step(embeds, hidden, positions, empty.keys, empty.values, mask)[0]).sum().backward()
    assert wide.midlayer.mlp.down_proj.weight.grad[:, 48:].abs().sum() > 0


def test_the_script_writes_a_checkpoint_the_loader_reads_with_its_training_record(tmp_path, monkeypatch):
    import json
    import sys

    from decoding.drafting.eagle3_drafter import load_eagle3, save_eagle3

    spec = Eagle3Spec(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=64, draft_vocab_size=16, target_hidden_size=32, head_dim=8)
    source, out = tmp_path / "eagle3", tmp_path / "wide"
    save_eagle3(Eagle3Drafter(spec, with_embeddings=True), source)
    (source / "training.json").write_text(json.dumps({"kind": "eagle3", "steps": 7}))
    monkeypatch.setattr(sys, "argv", ["widen_eagle3.py", "--drafter", str(source), "--intermediate", "64",
                                      "--out", str(out)])
    load_script().main()
    wide = load_eagle3(str(out))
    assert wide.spec.intermediate_size == 64 and wide.embed_tokens is not None
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 7 and record["widened_from"]["intermediate_size"] == 48
