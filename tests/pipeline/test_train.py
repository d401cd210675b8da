"""`pipeline.train` on a tiny target: Hydra composition, data shards, both stages, published-layout
export, resume from the last checkpoint, one-line config errors."""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline.errors import ConfigError
from pipeline.train.config import register_train_configs
from pipeline.train.objectives import Blocks, block_mask, sample_blocks, top1_by_position
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
            *([f"drafter.init_from={tmp_path / 'dflash'}"] if kind == "domino" else [])]


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


@pytest.mark.parametrize("shift", [False, True])
def test_top1_by_position_counts_each_draft_whatever_the_drafts_before_it(shift):
    """The k-th draft is the k-th labelled row (row 1 without shifted labels, row 0 with them), counted over the
    blocks that label it, also where an earlier draft was wrong (block 2's second draft)."""
    labels = torch.tensor([[-100, 5, 6, 7], [-100, 8, 9, -100], [-100, 4, -100, -100]])
    pred = torch.tensor([[-1, 5, 6, 0], [-1, 0, 9, -1], [-1, 4, -1, -1]])
    if shift:  # the same blocks one row earlier (no unlabelled row 0)
        labels, pred = labels.roll(-1, dims=1), pred.roll(-1, dims=1)
    got = top1_by_position(pred, labels)
    assert got == pytest.approx({"top1_pos1": 2 / 3, "top1_pos2": 1.0, "top1_pos3": 0.0})
    assert "top1_pos2" not in top1_by_position(pred[2:], labels[2:])  # no block labels a second draft


def test_step_and_validation_metrics_are_averaged_over_the_answers_that_have_each():
    from pipeline.train.trainer import mean_per_key

    got = mean_per_key([{"loss": 1.0, "top1_pos3": 0.5}, {"loss": 3.0}, {"loss": 2.0, "top1_pos3": 1.0}])
    assert got == pytest.approx({"loss": 2.0, "top1_pos3": 0.75})  # not 1.5 / 3: the short answer lacks it
    assert mean_per_key([]) == {}


def test_train_both_stages_export_and_resume(tiny_model_dirs, tmp_path):
    from decoding.drafting.dflash_drafter import load_drafter
    from pipeline.train.trainer import train

    for kind in ("dflash", "domino"):
        cfg = compose_train(tiny_overrides(tiny_model_dirs["llama"], tmp_path, kind, steps=2))
        summary = train(cfg, {}, show_progress=False)
        assert summary["steps"] == 2
        drafter = load_drafter(str(tmp_path / kind))
        assert drafter.spec.is_domino == (kind == "domino") and drafter.spec.target_layer_ids == [0, 2]
        record = json.loads((tmp_path / kind / "training.json").read_text())
        assert record["steps"] == 2
        # Domino's record separates the backbone alone from backbone + GRU correction
        assert ("val/accept_len_base" in record) == (kind == "domino")
        assert 0 <= record["val/top1_pos1"] <= 1  # the first draft's agreement, for both kinds
    assert len(list((tmp_path / "data").glob("shard_*.pt"))) == 2
    # a rerun with more steps resumes from the saved state instead of starting over
    cfg = compose_train(tiny_overrides(tiny_model_dirs["llama"], tmp_path, "dflash", steps=4))
    assert train(cfg, {}, show_progress=False)["steps"] == 4
    state = torch.load(tmp_path / "state" / "dflash" / "train_state.pt", weights_only=False)
    assert state["step"] == 4
    # the DFlash backbone was retrained in place: a Domino rerun must not resume the state built on the old one
    cfg = compose_train(tiny_overrides(tiny_model_dirs["llama"], tmp_path, "domino", steps=3))
    with pytest.raises(ConfigError, match=r"state_dir=.*domino holds a state begun from other weights in .*dflash "
                                          r"\(retrained since\)"):
        train(cfg, {}, show_progress=False)


def test_block_drafters_feature_scale_trains_fc_in_scaled_coordinates_and_exports_the_plain_format(tiny_model_dirs,
                                                                                                    tmp_path,
                                                                                                    monkeypatch):
    """drafter.feature_scale=rms for DFlash and Domino (pipeline/train/feature_scale.py): every loss, training
    and validation, reads the features divided by the saved scale; the export is the trained state with the
    scale folded back into fc; a fresh DFlash keeps its random fc as drawn (no column scaling), Domino's fc
    starts as its backbone's multiplied by the scale (same function); a resume reads the saved scale."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import pipeline.train.trainer as trainer
    from decoding.drafting.dflash_drafter import load_drafter

    seen = []  # (ids, hidden, step) of every loss computed
    compute_loss = trainer.compute_loss

    def recording(model, embed, lm_head, sample, blocks, cfg, step):
        seen.append((tuple(sample["ids"].tolist()), sample["hidden"].clone(), step))
        return compute_loss(model, embed, lm_head, sample, blocks, cfg, step)

    monkeypatch.setattr(trainer, "compute_loss", recording)
    overrides = {kind: tiny_overrides(tiny_model_dirs["llama"], tmp_path, kind, steps=2) + ["drafter.feature_scale=rms"]
                 for kind in ("dflash", "domino")}
    cfg = compose_train(overrides["dflash"])
    summary = trainer.train(cfg, {}, show_progress=False)
    assert summary["feature_scale"] == "rms"
    saved = torch.load(tmp_path / "state" / "dflash" / "feature_scale.pt")
    target = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.float32).eval()
    raw = {tuple(s["ids"].tolist()): s["hidden"] for s in
           trainer.training_samples(cfg, target, AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]))}
    assert {step < 2 for _, _, step in seen} == {True, False}  # training steps and the validation
    for ids, hidden, _ in seen:
        torch.testing.assert_close(hidden, (raw[ids].float().reshape(len(hidden), -1) / saved).view(hidden.shape))
    state = torch.load(tmp_path / "state" / "dflash" / "train_state.pt", weights_only=False)["model"]
    exported = load_drafter(str(tmp_path / "dflash"), dtype=torch.float32)
    assert saved.shape == (2 * exported.spec.hidden_size,) and not torch.allclose(saved, torch.ones(1))  # 2 taps
    assert torch.equal(exported.fc.weight, (state["fc.weight"] / saved).to(torch.bfloat16).float())

    # the starts, read off runs that do not move the weights (lr 0)
    still = ["drafter.lr=0", "drafter.steps=1"]
    drawn = trainer.new_drafter(cfg, target.config).fc.weight
    for mode, kind in (("rms", "fresh_rms"), ("none", "fresh_none")):
        trainer.train(compose_train(tiny_overrides(tiny_model_dirs["llama"], tmp_path / kind, "dflash", steps=1)
                                    + still + [f"drafter.feature_scale={mode}"]), {}, show_progress=False)
        start = torch.load(tmp_path / kind / "state" / "dflash" / "train_state.pt", weights_only=False)["model"]
        assert torch.equal(start["fc.weight"], drawn) == (mode == "rms")  # none: columns scaled by median(std)/std
    trainer.train(compose_train(overrides["domino"] + still), {}, show_progress=False)
    domino_scale = torch.load(tmp_path / "state" / "domino" / "feature_scale.pt")
    start = torch.load(tmp_path / "state" / "domino" / "train_state.pt", weights_only=False)["model"]
    assert torch.equal(start["fc.weight"], exported.fc.weight * domino_scale)

    # a resume reads the saved scale (doubled here, so a re-measured one would show), never rewrites it
    torch.save(saved * 2, tmp_path / "state" / "dflash" / "feature_scale.pt")
    more = [o if o != "drafter.steps=2" else "drafter.steps=3" for o in overrides["dflash"]]
    assert trainer.train(compose_train(more), {}, show_progress=False)["steps"] == 3
    assert torch.equal(torch.load(tmp_path / "state" / "dflash" / "feature_scale.pt"), saved * 2)
    state = torch.load(tmp_path / "state" / "dflash" / "train_state.pt", weights_only=False)["model"]
    exported = load_drafter(str(tmp_path / "dflash"), dtype=torch.float32)
    assert torch.equal(exported.fc.weight, (state["fc.weight"] / (saved * 2)).to(torch.bfloat16).float())
    # a state dir trained one way refuses the other; the exit head has no fc to scale
    with pytest.raises(ConfigError, match="feature_scale=rms"):
        trainer.train(compose_train(tiny_overrides(tiny_model_dirs["llama"], tmp_path, "dflash", steps=4)), {},
                      show_progress=False)
    with pytest.raises(ConfigError, match="exit head reads no tapped features"):
        compose_train(["drafter=exit_head", "drafter.feature_scale=rms"])


def test_dflash_init_from_continues_a_trained_checkpoint_as_a_new_leg(tiny_model_dirs, tmp_path, monkeypatch, caplog):
    """drafter=dflash drafter.init_from=<checkpoint>: the checkpoint's weights and architecture (its taps and
    mask token, not the run's), a fresh optimizer and schedule; training.json counts steps and minutes in total; a
    rerun of the leg resumes it. Refused: a Domino checkpoint, exporting over the checkpoint it continues, and
    another run's state dir (either way)."""
    import logging

    from safetensors.torch import load_file

    from decoding.drafting.dflash_drafter import load_drafter
    from pipeline.train import trainer

    path = tiny_model_dirs["llama"]
    scratch = tiny_overrides(path, tmp_path, "dflash", steps=2)
    trainer.train(compose_train(scratch), {}, show_progress=False)
    record = tmp_path / "dflash" / "training.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "train_minutes": 7.0}))
    leg = [o for o in tiny_overrides(path, tmp_path, "leg", steps=1)
           if not o.startswith(("drafter=", "drafter.target_layer_ids", "drafter.mask_token_id"))]
    # lr 0: the weights are kept bit for bit; the run's own taps and mask token differ from the checkpoint's
    leg += ["drafter=dflash", "drafter.lr=0", "drafter.target_layer_ids=[0,1]", "drafter.mask_token_id=5",
            f"drafter.init_from={tmp_path / 'dflash'}"]
    masks = []
    real_loss = trainer.dflash_loss
    monkeypatch.setattr(trainer, "dflash_loss", lambda *a: masks.append(a[-1]) or real_loss(*a))
    continued = trainer.train(compose_train(leg), {}, show_progress=False)
    assert masks and set(masks) == {0}  # the checkpoint's mask token (tiny_overrides: 0) in every loss
    saved = json.loads((tmp_path / "leg" / "training.json").read_text())
    for summary in (continued, saved):
        assert (summary["steps"], summary["init_steps"], summary["leg_steps"]) == (3, 2, 1)
        assert summary["train_minutes"] >= 7.0
        recipe = summary["recipe"]  # the leg's own, recorded
        assert (recipe["lr"], recipe["loss_decay_gamma"], recipe["num_anchors"]) == (0, 7.0, 4)  # tiny_overrides
        assert recipe["seqs_per_step"] >= 1 and "lambda_start" not in recipe  # Domino's curriculum only
    state = torch.load(tmp_path / "state" / "leg" / "train_state.pt", weights_only=False)
    assert state["step"] == 1 and {int(s["step"]) for s in state["optimizer"]["state"].values()} == {1}  # fresh AdamW
    before, after = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("dflash", "leg"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    exported = load_drafter(str(tmp_path / "leg")).spec
    assert (exported.target_layer_ids, exported.mask_token_id) == ([0, 2], 0)
    # a rerun with more steps resumes the leg, not the checkpoint
    with caplog.at_level(logging.INFO, logger="pipeline.train.trainer"):
        more = trainer.train(compose_train([o for o in leg if o != "drafter.steps=1"] + ["drafter.steps=2"]), {},
                             show_progress=False)
    assert "resumed at step 1" in caplog.text and (more["steps"], more["leg_steps"]) == (4, 2)
    with pytest.raises(ConfigError, match="export the new leg elsewhere"):
        trainer.train(compose_train([o for o in leg if not o.startswith("drafter.out_dir")]
                                    + [f"drafter.out_dir={tmp_path / 'dflash'}"]), {}, show_progress=False)
    with pytest.raises(ConfigError, match="holds the state of a run from scratch; this run begins from"):
        trainer.train(compose_train([o for o in leg if not o.startswith("drafter.state_dir")]
                                    + [f"drafter.state_dir={tmp_path / 'state' / 'dflash'}"]), {}, show_progress=False)
    with pytest.raises(ConfigError, match="holds the state of a run begun from .*this run starts from scratch"):
        trainer.train(compose_train([o for o in scratch if not o.startswith("drafter.state_dir")]
                                    + [f"drafter.state_dir={tmp_path / 'state' / 'leg'}"]), {}, show_progress=False)
    trainer.train(compose_train(tiny_overrides(path, tmp_path, "domino", steps=1)), {}, show_progress=False)
    with pytest.raises(ConfigError, match="is a Domino checkpoint"):
        trainer.train(compose_train([o for o in leg if not o.startswith(("drafter.init_from", "drafter.state_dir"))]
                                    + [f"drafter.init_from={tmp_path / 'domino'}", f"drafter.state_dir={tmp_path / 's2'}"]),
                      {}, show_progress=False)


def test_block_drafters_train_on_a_corpus_with_recomputed_taps(tiny_model_dirs, tmp_path):
    """A self-distillation corpus stores token ids only: the DFlash/Domino trainers recompute the tapped
    layers by one teacher-forced forward, the same features the answer shards store from `generate`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.drafting.dflash_drafter import load_drafter
    from pipeline.train.corpus import CorpusConfig, build_corpus
    from pipeline.train.data import build_dataset, load_samples
    from pipeline.train.trainer import train, with_taps

    path = tiny_model_dirs["llama"]
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    stored = load_samples(build_dataset(target, tokenizer, [("chat", "Tell me a story.")], [0, 2], tmp_path / "shards",
                                        1, 8, {2}))[0]
    again = with_taps({k: v for k, v in stored.items() if k != "hidden"}, target, [0, 2])
    torch.testing.assert_close(again["hidden"].float(), stored["hidden"].float(), atol=2e-3, rtol=2e-3)
    build_corpus(target, tokenizer, CorpusConfig(out_dir=str(tmp_path / "corpus"), num_prompts=8, max_new_tokens=10,
                                                 batch_size=4, self_questions=0), {2}, show_progress=False)
    for kind in ("dflash", "domino"):
        overrides = tiny_overrides(path, tmp_path, kind, steps=2) + [f"data.corpus={tmp_path / 'corpus'}"]
        summary = train(compose_train(overrides), {}, show_progress=False)
        assert summary["steps"] == 2 and summary["sequences"] == 6 and "val/loss" in summary
        assert load_drafter(str(tmp_path / kind)).spec.is_domino == (kind == "domino")
    assert not (tmp_path / "data").exists()  # no answer shards were generated


def test_corpus_validation_answers_are_never_trained_on_while_the_corpus_grows(tmp_path):
    from pipeline.train import trainer
    from pipeline.train.corpus import bundle

    samples = [{"ids": torch.tensor([1, 2 + i, 3]), "prompt_len": 2, "source": "chat"} for i in range(60)]
    splits = []
    for n in (20, 40, 60):  # a training run resumed after more shards were built
        bundle(tmp_path, samples[:n], 100)
        cfg = compose_train(["drafter=eagle3", f"data.corpus={tmp_path}", "drafter.val_sequences=3"])
        got = trainer.training_samples(cfg, None, None)
        assert len(got) == n
        splits.append(({int(s["ids"][1]) for s in got[:3]}, {int(s["ids"][1]) for s in got[3:]}))
    for (val_now, _), (_, trained_before) in zip(splits[1:], splits[:-1]):
        assert not val_now & trained_before  # a validation answer of a later run was never a training one


def test_bad_train_config_names_the_field():
    from pipeline.cli import chain

    with pytest.raises(Exception) as err:
        compose_train(["drafter.kind=foo"])
    assert any(isinstance(e, ConfigError) and "drafter.kind='foo' is not allowed" in str(e) for e in chain(err.value))


def test_a_target_on_gpus_is_refused_in_one_line_before_anything_loads():
    """The trainers keep the drafter, the target's features and the optimizer on the CPU: a model config's decoding
    `device_map: auto` is dropped, and one asked for on the command line is refused."""
    from pipeline.cli import chain

    assert compose_train(["drafter=dflash", "model=qwen3-0.6b"]).model.device_map is None  # its decoding `auto` dropped
    with pytest.raises(Exception) as err:
        compose_train(["drafter=dflash", "model.device_map=auto"])
    assert any(isinstance(e, ConfigError) and str(e).startswith("model.device_map=auto: pipeline.train runs on the CPU")
               for e in chain(err.value))


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


def test_the_training_time_test_computes_what_decoding_computes():
    """Step j of the training-time test at row t is the depth-j tree node after the committed rows 0..t
    (decoding's own extend + tree step), so training and decoding see the same inputs, masks, positions."""
    from decoding.drafting.eagle3_drafter import Eagle3Drafter, Eagle3Spec
    from pipeline.train.eagle3 import ttt_hidden

    spec = Eagle3Spec(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=50, draft_vocab_size=50, target_hidden_size=24, head_dim=8)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(spec).eval()
    for p in drafter.parameters():
        torch.nn.init.normal_(p, std=0.3) if p.dim() == 2 else torch.nn.init.uniform_(p, 0.5, 1.5)
    embed = torch.nn.Embedding(50, 32)
    feats, ids = torch.randn(12, 72), torch.randint(0, 50, (12,))
    with torch.no_grad():
        trained = list(ttt_hidden(drafter, embed, feats, ids, ttt_length=4))
        for t in (0, 3, 7):
            cache = drafter.new_cache()
            h = drafter.extend(cache, feats[:t + 1], embed(ids[1:t + 2]))[-1:]
            past_k, past_v = cache.keys, cache.values
            for j in range(4):
                if j:  # the node whose path is ids[t+2 : t+2+j]: fed its last token and its parent's h
                    h, past_k, past_v = drafter.step(embed(ids[t + 1 + j].view(1)), h, torch.tensor([t + j]),
                                                     past_k, past_v)
                if t + 1 + j < len(ids):
                    assert torch.allclose(trained[j][t], h[0], atol=1e-5), (t, j)


def test_eagle3_training_raises_chain_acceptance_and_decodes_as_method_eagle3(tiny_model_dirs, tmp_path, caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.engine.loop import generate
    from decoding.engine.target import TargetModel
    from decoding.methods.ar import AR
    from decoding.methods.eagle3 import Eagle3, Eagle3Config
    from pipeline.train.eagle3 import new_eagle3, token_counts, validate
    from pipeline.train.exit_head import Readout
    from pipeline.train.trainer import train, training_samples

    overrides = [o for o in tiny_overrides(tiny_model_dirs["llama"], tmp_path, "eagle3", steps=30)
                 if not o.startswith(("drafter.checkpoint_every", "drafter.seqs_per_step", "drafter.init_from"))]
    overrides += ["drafter.checkpoint_every=15", "drafter.lr=0.005", "drafter.ttt_length=3", "drafter.seqs_per_step=2",
                  "drafter.eagle_layer_ids=[0,1,2]", "drafter.draft_vocab_size=40", "data.max_new_tokens=24"]
    cfg = compose_train(overrides)
    summary = train(cfg, {}, show_progress=False)
    assert summary["steps"] == 30 and summary["layer_ids"] == [0, 1, 2] and summary["draft_vocab_size"] == 40
    target = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.float32).eval()
    samples = training_samples(cfg, target, AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]))
    untrained = new_eagle3(target.config, [0, 1, 2], 40, token_counts(samples[2:], target.config.vocab_size), 0).eval()
    before = validate(untrained, target.get_input_embeddings(), Readout(target), target, samples[:2], cfg.drafter)
    assert summary["val/accept_len_chain"] > before["val/accept_len_chain"]
    assert summary["val/top1_step0"] > before["val/top1_step0"]
    assert set(json.loads((tmp_path / "eagle3" / "training.json").read_text())) >= {"val/top1_step2", "tokens"}
    # the export loads as the method's drafter and decodes exactly as AR
    wrapped = TargetModel(target, AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]))
    method = Eagle3(Eagle3Config(drafter=str(tmp_path / "eagle3"), total_tokens=10, depth=3, top_k=3))
    method.setup(wrapped)
    prompt = samples[0]["ids"][:samples[0]["prompt_len"]].tolist()
    eagle = generate(method, wrapped, prompt, max_new_tokens=20)
    assert eagle.new_tokens == generate(AR(), wrapped, prompt, max_new_tokens=20).new_tokens
    # a rerun with more steps resumes
    more_overrides = [o if not o.startswith("drafter.steps") else "drafter.steps=32" for o in overrides]
    more = compose_train(more_overrides)
    assert train(more, {}, show_progress=False)["steps"] == 32
    # drafter.init_from continues the exported drafter with a fresh optimizer (lr 0: it is kept bit for bit)
    leg = [o for o in overrides if not o.startswith(("drafter.steps", "drafter.lr",
                                                     "drafter.out_dir", "drafter.state_dir"))]
    leg += ["drafter.steps=1", "drafter.lr=0", f"drafter.init_from={tmp_path / 'eagle3'}",
            f"drafter.out_dir={tmp_path / 'leg2'}", f"drafter.state_dir={tmp_path / 'state' / 'leg2'}"]
    continued = train(compose_train(leg), {}, show_progress=False)
    assert (continued["steps"], continued["init_steps"], continued["leg_steps"]) == (33, 32, 1)
    from safetensors.torch import load_file
    first, second = (load_file(str(tmp_path / leg_dir / "model.safetensors")) for leg_dir in ("eagle3", "leg2"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    with pytest.raises(ConfigError, match="init_from"):
        train(compose_train([o if o != "drafter.eagle_layer_ids=[0,1,2]" else "drafter.eagle_layer_ids=[0,1,1]"
                             for o in leg]), {}, show_progress=False)
    # the first leg's state dir is not resumed by a continued leg (nor its checkpoint overwritten), nor the reverse
    first_state = [o for o in leg if not o.startswith("drafter.state_dir")] + \
        [f"drafter.state_dir={tmp_path / 'state' / 'eagle3'}"]
    with pytest.raises(ConfigError, match="holds the state of a run from scratch"):
        train(compose_train(first_state), {}, show_progress=False)
    with pytest.raises(ConfigError, match="export the new leg elsewhere"):
        train(compose_train([o if not o.startswith("drafter.out_dir") else f"drafter.out_dir={tmp_path / 'eagle3'}"
                             for o in leg]), {}, show_progress=False)
    plain_in_leg_state = [o for o in more_overrides if not o.startswith("drafter.state_dir")] + \
        [f"drafter.state_dir={tmp_path / 'state' / 'leg2'}"]
    with pytest.raises(ConfigError, match="holds the state of a run begun from"):
        train(compose_train(plain_in_leg_state), {}, show_progress=False)
    # rerun of the same leg resumes it (its saved step, not a fresh start), also when init_from is spelt absolute
    import logging

    rerun = [o if not o.startswith("drafter.init_from") else f"drafter.init_from={(tmp_path / 'eagle3').resolve()}"
             for o in leg]
    with caplog.at_level(logging.INFO, logger="pipeline.train.trainer"):
        assert train(compose_train(rerun), {}, show_progress=False)["leg_steps"] == 1
    assert "resumed at step 1" in caplog.text


def test_eagle3_feature_scale_trains_in_scaled_coordinates_and_exports_the_plain_format(tiny_model_dirs, tmp_path):
    """drafter.feature_scale=rms: the scaled fc computes the function it had; the export folds the scale back
    (it reads raw features as the trained fc read scaled ones), a resume keeps the scale, a state dir trained
    one way refuses the other (both ways), and a new drafter keeps its random start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.drafting.eagle3_drafter import load_eagle3
    from pipeline.train.eagle3 import FeatureScale, feature_scale, new_eagle3, teacher_pass, token_counts, validate
    from pipeline.train.exit_head import Readout
    from pipeline.train.trainer import train, training_samples

    overrides = [o for o in tiny_overrides(tiny_model_dirs["llama"], tmp_path, "eagle3", steps=4)
                 if not o.startswith("drafter.checkpoint_every")]
    overrides += ["drafter.checkpoint_every=2", "drafter.ttt_length=3", "drafter.eagle_layer_ids=[0,1,2]",
                  "drafter.draft_vocab_size=40", "drafter.feature_scale=rms"]
    cfg = compose_train(overrides)
    target = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.float32).eval()
    samples = training_samples(cfg, target, AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]))
    model = new_eagle3(target.config, [0, 1, 2], 40, token_counts(samples, target.config.vocab_size), 0)
    plain = model.fc.weight.detach().clone()
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "feature_scale.pt").write_bytes(b"left by a run stopped before its first checkpoint")
    scale = feature_scale("rms", tmp_path / "probe", model, target, samples, [0, 1, 2], fresh=False)
    assert scale.scale.shape == (3 * target.config.hidden_size,) and not torch.allclose(scale.scale, torch.ones(1))
    feats, _ = teacher_pass(target, samples[0]["ids"], [0, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(model.fc(scale.features(feats)), feats @ plain.t(), rtol=1e-4, atol=1e-5)
        trained = model.fc.weight.detach().clone()
        with scale.folded(model):
            torch.testing.assert_close(model.fc.weight, plain)
        assert torch.equal(model.fc.weight, trained)  # restored bit for bit

    summary = train(cfg, {}, show_progress=False)
    assert summary["feature_scale"] == "rms"
    # the export (bf16, as published) is the trained state with the scale folded back into fc
    saved = torch.load(tmp_path / "state" / "eagle3" / "feature_scale.pt")
    state = torch.load(tmp_path / "state" / "eagle3" / "train_state.pt", weights_only=False)["model"]
    exported = load_eagle3(str(tmp_path / "eagle3"), dtype=torch.float32).eval()
    assert torch.equal(exported.fc.weight, (state["fc.weight"] / saved).to(torch.bfloat16).float())
    assert torch.equal(exported.lm_head.weight, state["lm_head.weight"].to(torch.bfloat16).float())
    with torch.no_grad():  # the export reads raw features as the trained fc read scaled ones (bf16 rounding apart)
        torch.testing.assert_close(exported.fc(feats), FeatureScale(saved).features(feats) @ state["fc.weight"].t(),
                                   rtol=2e-2, atol=2e-2)
    again = validate(exported, target.get_input_embeddings(), Readout(target), target, samples[:2], cfg.drafter)
    assert abs(again["val/accept_len_chain"] - summary["val/accept_len_chain"]) < 0.2
    # a resume reads the saved scale (doubled here, so a re-measured one would show), never rewrites it
    torch.save(saved * 2, tmp_path / "state" / "eagle3" / "feature_scale.pt")
    assert train(compose_train([o if o != "drafter.steps=4" else "drafter.steps=6" for o in overrides]), {},
                 show_progress=False)["steps"] == 6
    assert torch.equal(torch.load(tmp_path / "state" / "eagle3" / "feature_scale.pt"), saved * 2)
    state = torch.load(tmp_path / "state" / "eagle3" / "train_state.pt", weights_only=False)["model"]
    exported = load_eagle3(str(tmp_path / "eagle3"), dtype=torch.float32)
    assert torch.equal(exported.fc.weight, (state["fc.weight"] / (saved * 2)).to(torch.bfloat16).float())
    with pytest.raises(ConfigError, match="feature_scale=rms"):
        train(compose_train([o for o in overrides if o != "drafter.feature_scale=rms"] + ["drafter.steps=8"]), {},
              show_progress=False)
    plain_run = [o for o in overrides if o != "drafter.feature_scale=rms" and not o.startswith("drafter.state_dir")]
    train(compose_train(plain_run + [f"drafter.state_dir={tmp_path / 'plain'}"]), {}, show_progress=False)
    with pytest.raises(ConfigError, match="feature_scale=none"):
        train(compose_train(plain_run + [f"drafter.state_dir={tmp_path / 'plain'}", "drafter.feature_scale=rms",
                                         "drafter.steps=6"]), {}, show_progress=False)
    # a new drafter keeps its random start (drawn in the scaled coordinates)
    fresh = new_eagle3(target.config, [0, 1, 2], 40, token_counts(samples, target.config.vocab_size), 0)
    start = fresh.fc.weight.detach().clone()
    (tmp_path / "fresh").mkdir()
    feature_scale("rms", tmp_path / "fresh", fresh, target, samples, [0, 1, 2], fresh=True)
    assert torch.equal(fresh.fc.weight, start)
    with pytest.raises(ConfigError, match="feature_scale"):
        compose_train(["drafter=eagle3", "drafter.feature_scale=zscore"])


def test_exit_head_keeps_a_seeded_subset_of_answers_within_its_position_limit():
    from types import SimpleNamespace

    from pipeline.train.exit_head import exit_features, within_positions

    answers = [{"ids": torch.arange(prompt + n), "prompt_len": prompt, "n": n}
               for prompt, n in [(3, 40), (5, 25), (2, 70), (4, 10), (6, 55)]]
    assert sorted(a["n"] for a in within_positions(answers, 10_000, seed=0)) == [10, 25, 40, 55, 70]
    subsets = set()
    for seed in range(6):
        picked = within_positions(answers, 100, seed=seed)
        total = sum(a["n"] for a in picked)
        assert 0 < total <= 100
        # maximal: no answer left out would still fit
        assert all(a["n"] > 100 - total for a in answers if not any(a is b for b in picked))
        subsets.add(tuple(sorted(a["n"] for a in picked)))
    assert len(subsets) > 1  # the seed chooses the subset

    # the positions counted are the rows exit_features keeps (last prompt token .. last-but-one answer token)
    def decoder(input_ids, output_hidden_states):
        h = input_ids[0].float()[:, None].expand(-1, 4)[None]
        return SimpleNamespace(hidden_states=[h, h + 1, h + 2])

    model = SimpleNamespace(model=decoder, device=torch.device("cpu"))
    picked = within_positions(answers, 100, seed=0)
    inputs, finals = exit_features(model, picked, exit_layer=1, device="cpu")
    assert len(inputs) == len(finals) == sum(a["n"] for a in picked)
    assert inputs[0, 0] == picked[0]["prompt_len"] - 1 + 1  # layer 1's row of the last prompt token


def test_eagle3_head_from_the_target_reads_out_as_the_targets_own_head(tiny_model_dirs):
    """drafter.head_init=target: the draft head is the target's final norm and lm_head restricted to the
    draft vocabulary, so a drafter state equal to the target's last residual gives the target's logits."""
    from transformers import AutoModelForCausalLM

    from pipeline.train.eagle3 import head_from_target, new_eagle3

    target = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.float32).eval()
    vocab = target.config.vocab_size
    model = new_eagle3(target.config, [0, 1, 2], 40, torch.arange(vocab).flip(0).float(), 0).eval()
    h = torch.randn(3, target.config.hidden_size)
    with torch.no_grad():
        assert not torch.allclose(model.logits(h), (target.lm_head(target.model.norm(h)))[:, :40])
        head_from_target(model, target)
        want = target.lm_head(target.model.norm(h))[:, model.to_target_ids(torch.arange(40))]
        torch.testing.assert_close(model.logits(h), want)
    with pytest.raises(ConfigError, match="head_init"):
        compose_train(["drafter=eagle3", "drafter.head_init=zeros"])

    class OnePlusWeightNorm(torch.nn.Module):  # Gemma's: x / rms(x) * (1 + weight)
        def __init__(self, weight):
            super().__init__()
            self.weight = torch.nn.Parameter(weight.clone())

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)

    # Gemma's norm: the drafter's plain RMSNorm starts at its gain 1 + weight, so it still reads out the target
    target.model.norm = OnePlusWeightNorm(torch.randn(target.config.hidden_size) * 0.1)
    with torch.no_grad():
        head_from_target(model, target)
        want = target.lm_head(target.model.norm(h))[:, model.to_target_ids(torch.arange(40))]
        torch.testing.assert_close(model.logits(h), want)
    target.model.norm = torch.nn.LayerNorm(target.config.hidden_size)  # with a bias: no gain reproduces it
    torch.nn.init.normal_(target.model.norm.bias)
    with pytest.raises(ConfigError, match="not an RMSNorm"):
        head_from_target(model, target)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_a_drafters_norm_starts_at_the_gain_the_targets_final_norm_applies(arch):
    """Read off the norm's output: a plain RMSNorm's gain is its weight, Gemma's is 1 + weight (DFlash's
    data-dependent start and EAGLE-3's head_init=target both start from it)."""
    from pipeline.train.trainer import target_final_norm_gain
    from pipeline.zoo import random_target

    model = random_target("tiny", arch=arch).model
    norm = model.model.norm
    with torch.no_grad():
        norm.weight.copy_(torch.randn_like(norm.weight) * 0.1)
    gain = target_final_norm_gain(model, norm.weight.numel())
    torch.testing.assert_close(gain, norm.weight.detach() + (1.0 if arch == "gemma3" else 0.0))
    assert target_final_norm_gain(model, norm.weight.numel() + 1) is None


@pytest.mark.parametrize("setting, native, want", [(None, True, True), (None, False, False), (True, False, True),
                                                    (False, True, False)])
def test_bf16_autocast_defaults_to_where_bf16_is_native(setting, native, want, monkeypatch):
    """drafter.bf16_autocast=null (the default) autocasts only on a CPU with native bf16: emulated bf16 (an AVX2-only
    CPU) made a training step ~10x slower than fp32; true/false force it."""
    from types import SimpleNamespace

    import pipeline.train.trainer as trainer

    monkeypatch.setattr(trainer, "cpu_has_native_bf16", lambda: native)
    cfg = SimpleNamespace(drafter=SimpleNamespace(bf16_autocast=setting))
    with trainer.autocast(cfg, "cpu"):
        assert torch.is_autocast_enabled("cpu") == want
    assert compose_train(["drafter=eagle3"]).drafter.bf16_autocast is None
    assert compose_train(["drafter=eagle3", "drafter.bf16_autocast=false"]).drafter.bf16_autocast is False


def test_the_eagle3_teacher_is_the_targets_own_distribution_soft_cap_included():
    """The training-time test's soft labels come from the target's readout as decoding sees it: on a
    Gemma 2 target that includes the final logit soft cap (it was a plain matmul: a sharper teacher)."""
    from pipeline.train.eagle3 import new_eagle3, teacher_pass, ttt_steps
    from pipeline.train.exit_head import Readout
    from pipeline.zoo import mixed_prompts, random_target

    target = random_target("tiny", arch="gemma2").model
    assert target.config.final_logit_softcapping
    ids = torch.tensor(mixed_prompts(1, 40)[0])
    feats, finals = teacher_pass(target, ids, [0, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(Readout(target).teacher(finals), target(ids[None]).logits[0].float())

    class Recorded(Readout):
        calls = 0

        def teacher(self, finals):
            Recorded.calls += 1
            return super().teacher(finals)

    drafter = new_eagle3(target.config, [0, 1, 2], 40, torch.arange(target.config.vocab_size).flip(0).float(), 0)
    steps = ttt_steps(drafter, target.get_input_embeddings(), feats, finals, Recorded(target), ids, 10, 2)
    assert Recorded.calls == 1 and len(steps) == 2 and torch.isfinite(steps[0][0])


@pytest.mark.parametrize("arch", ["granite", "cohere"])
def test_the_trainers_teacher_is_the_targets_own_logits_where_the_forward_scales_them(arch):
    """The exit-head and EAGLE-3 trainers' soft labels (`Readout.teacher`) are the target's logits as its forward
    returns them: Granite divides them by logits_scaling, Cohere multiplies them by logit_scale (before 2026-12-06,
    night, a plain matmul: a teacher at another temperature)."""
    from pipeline.train.eagle3 import teacher_pass
    from pipeline.train.exit_head import Readout
    from pipeline.zoo import mixed_prompts, random_target

    target = random_target("tiny", arch=arch).model
    ids = torch.tensor(mixed_prompts(1, 40)[0])
    _, finals = teacher_pass(target, ids, [0, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(Readout(target).teacher(finals), target(ids[None]).logits[0].float())


def test_eagle3_head_from_a_granite_target_reads_out_its_scaled_logits():
    """head_init=target on a target whose forward divides its logits (Granite): the copied rows carry the
    divisor, so the drafter starts at the logits the teacher (the model's own) gives."""
    from pipeline.train.eagle3 import head_from_target, new_eagle3
    from pipeline.zoo import random_target

    target = random_target("tiny", arch="granite").model
    model = new_eagle3(target.config, [0, 1, 2], 40, torch.arange(target.config.vocab_size).flip(0).float(), 0).eval()
    h = torch.randn(3, target.config.hidden_size)
    with torch.no_grad():
        head_from_target(model, target)
        scaled = target.lm_head(target.model.norm(h)) / target.config.logits_scaling  # GraniteForCausalLM's readout
        torch.testing.assert_close(model.logits(h), scaled[:, model.to_target_ids(torch.arange(40))])
