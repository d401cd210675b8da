"""`pipeline.train` on a tiny target: Hydra composition, data shards, both stages, published-layout
export, resume from the last checkpoint, one-line config errors."""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline.errors import ConfigError
from pipeline.train.config import register_train_configs
from pipeline.train.objectives import Blocks, block_mask, sample_blocks
from pathlib import Path

TRAIN_CONF = str(Path(__file__).resolve().parents[2] / "conf" / "train")


def compose_train(overrides):
    register_train_configs()
    with initialize_config_dir(config_dir=TRAIN_CONF, version_base="1.3"):
        return OmegaConf.to_object(compose("train", overrides=overrides))


def tiny_overrides(model_dir, tmp_path, kind, steps):
    return [f"drafter={kind}", "model.source=hub", f"model.path={model_dir}", "model.name=tiny",
            f"data.dir={tmp_path / 'data'}", "data.num_prompts=6", "data.batch_size=3", "data.max_new_tokens=12",
            f"drafter.out_dir={tmp_path / kind}", f"drafter.state_dir={tmp_path / 'state' / kind}",
            f"drafter.steps={steps}", "drafter.checkpoint_every=2", "drafter.val_sequences=2", "drafter.num_layers=1",
            "drafter.intermediate_size=32", "drafter.target_layer_ids=[0,2]", "drafter.mask_token_id=0",
            "drafter.seqs_per_step=2", "drafter.num_anchors=4", "drafter.block_size=4", "tracker.kind=none",
            f"drafter.init_from={tmp_path / 'dflash'}"]


def test_block_mask_sees_the_context_before_its_anchor_and_its_own_block():
    blocks = Blocks(torch.tensor([2, 5]), torch.tensor([[2, 3], [5, 6]]), torch.zeros(2, 2), torch.ones(2, 2))
    mask = block_mask(blocks, 7)
    assert mask[:2, :7].sum(1).tolist() == [2, 2] and mask[2:, :7].sum(1).tolist() == [5, 5]
    assert mask[:, 7:].tolist() == [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2


def test_block_labels_follow_shift_label():
    ids = torch.arange(10, 20)
    gen = torch.Generator().manual_seed(0)
    plain = sample_blocks(ids, 4, 3, 20, 7.0, False, gen)
    assert plain.anchors.tolist() == list(range(3, 9))  # from the last prompt token to the last but one
    a = plain.anchors[0]
    assert plain.labels[0].tolist() == [-100, int(ids[a + 1]), int(ids[a + 2])]
    assert plain.weights[0, 0] == 0 and plain.weights[0, 1] == 1.0
    shifted = sample_blocks(ids, 4, 3, 20, 7.0, True, gen)
    assert shifted.labels[0].tolist() == [int(ids[a + 1]), int(ids[a + 2]), int(ids[a + 3])]


def test_train_both_stages_export_and_resume(tiny_model_dirs, tmp_path):
    from decoding.drafting.dflash_drafter import load_drafter
    from pipeline.train.trainer import train

    for kind in ("dflash", "domino"):
        cfg = compose_train(tiny_overrides(tiny_model_dirs["llama"], tmp_path, kind, steps=2))
        summary = train(cfg, {}, show_progress=False)
        assert summary["steps"] == 2
        drafter = load_drafter(str(tmp_path / kind))
        assert drafter.spec.is_domino == (kind == "domino") and drafter.spec.target_layer_ids == [0, 2]
        assert json.loads((tmp_path / kind / "training.json").read_text())["steps"] == 2
    assert len(list((tmp_path / "data").glob("shard_*.pt"))) == 2
    # a rerun with more steps resumes from the saved state instead of starting over
    cfg = compose_train(tiny_overrides(tiny_model_dirs["llama"], tmp_path, "dflash", steps=4))
    assert train(cfg, {}, show_progress=False)["steps"] == 4
    state = torch.load(tmp_path / "state" / "dflash" / "train_state.pt", weights_only=False)
    assert state["step"] == 4


def test_bad_train_config_names_the_field():
    from pipeline.cli import chain

    with pytest.raises(Exception) as err:
        compose_train(["drafter.kind=foo"])
    assert any(isinstance(e, ConfigError) and "drafter.kind='foo' is not allowed" in str(e) for e in chain(err.value))


def test_exit_head_training_lowers_val_kl_and_loads_as_a_drafter(tiny_model_dirs, tmp_path):
    from transformers import AutoModelForCausalLM

    from decoding.drafting.drafter import DrafterConfig, build_drafter
    from decoding.engine.target import TargetModel
    from pipeline.train.trainer import train

    overrides = tiny_overrides(tiny_model_dirs["llama"], tmp_path, "exit_head", steps=40)
    overrides = [o for o in overrides if not o.startswith(("drafter.steps", "drafter.checkpoint_every"))]
    cfg = compose_train(overrides + ["drafter.steps=40", "drafter.checkpoint_every=20", "drafter.exit_layer=1",
                                     "drafter.lr=0.01", "drafter.tokens_per_step=64"])
    summary = train(cfg, {}, show_progress=False)
    assert summary["steps"] == 40 and summary["exit_layer"] == 1
    # the head starts as the plain early exit (A = b = 0); distillation must bring it closer to the target
    assert summary["val/kl"] < summary["early_exit/kl"]
    assert summary["val/accept_t1"] > summary["early_exit/accept_t1"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.float32)
    target = TargetModel(model)
    drafter = build_drafter(DrafterConfig(exit_layer=1, head=str(tmp_path / "exit_head")), target)
    assert drafter.lm.layers == (0,) and drafter.lm.exit_head is not None
    with pytest.raises(ConfigError, match="trained for exit layer 1"):
        build_drafter(DrafterConfig(exit_layer=2, head=str(tmp_path / "exit_head")), target)
