"""The self-distillation corpus (pipeline/train/corpus.py): prompts disjoint from the evaluation sets,
resumable shards, a compressed bundle that training reads back."""

import io
import json

import numpy as np
import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.train.corpus import (CorpusConfig, build_corpus, drop_contaminated, evaluation_prompts, interleave,
                                   load_corpus, ngrams, offline_prompts)


def test_the_offline_prompts_share_no_13_word_run_with_any_evaluation_prompt():
    evaluation = evaluation_prompts()
    assert len(evaluation) >= 80 + 164 + 300 - 10  # MT-Bench turns (80 x 2), HumanEval, reserved GSM8K
    pools = offline_prompts(0)
    assert {k: len(v) > 400 for k, v in pools.items()} == {"chat": True, "code": True, "gsm8k": True}
    prompts = interleave(pools, 100_000)
    kept, dropped = drop_contaminated(prompts, evaluation)
    banned = set().union(*(ngrams(p) for p in evaluation))
    assert all(not (ngrams(p) & banned) for _, p in kept) and dropped < 10
    planted = ("chat", "Please answer: " + evaluation[0])  # an evaluation prompt inside a template is dropped
    assert drop_contaminated([planted], evaluation) == ([], 1)


def test_interleave_mixes_the_sources_evenly_and_is_prefix_stable():
    pools = {"a": ["a1", "a2", "a3"], "b": ["b1"], "c": ["c1", "c2"]}
    assert interleave(pools, 10) == [("a", "a1"), ("b", "b1"), ("c", "c1"), ("a", "a2"), ("c", "c2"), ("a", "a3")]
    assert interleave(pools, 4) == interleave(pools, 10)[:4]


def test_the_corpus_is_built_in_resumable_shards_and_read_back_by_training(tiny_model_dirs, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import pipeline.train.corpus as corpus

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    cfg = CorpusConfig(out_dir=str(tmp_path / "corpus"), num_prompts=7, max_new_tokens=6, batch_size=3,
                       self_questions=2)
    stats = build_corpus(model, tokenizer, cfg, {2}, show_progress=False)
    assert stats["prompts"] == 7 and 0 < stats["answer_tokens"] <= 7 * 6
    questions = json.loads((tmp_path / "corpus" / "questions.json").read_text())
    assert len(questions) <= 2 and all(q.endswith("?") for q in questions)
    # whether a random-init model writes a valid question is luck (it differs across CPUs): the filter is
    # tested deterministically below, here only that a written question becomes a "self" prompt
    assert set(stats["by_source"]) == {"chat", "code", "gsm8k"} | ({"self"} if questions else set())
    samples = load_corpus(str(tmp_path / "corpus"))
    assert [s["source"] for s in samples][:3] == ["chat", "code", "gsm8k"]
    first = samples[0]  # the answer is the model's own greedy continuation of the prompt
    out = model.generate(input_ids=first["ids"][None, :first["prompt_len"]], max_new_tokens=6, do_sample=False,
                         eos_token_id=[2], pad_token_id=2)
    assert out[0, first["prompt_len"]:].tolist()[:len(first["ids"]) - first["prompt_len"]] == \
        first["ids"][first["prompt_len"]:].tolist()
    class Regenerated(Exception):
        pass

    def regenerate(*args, **kwargs):
        raise Regenerated

    # a rerun generates nothing: every shard is there
    monkeypatch.setattr(corpus, "generate_batch", regenerate)
    assert build_corpus(model, tokenizer, cfg, {2}, show_progress=False)["prompts"] == 7
    (tmp_path / "corpus" / "shard_00000.npz").unlink()
    (tmp_path / "corpus" / "corpus.npz").unlink()
    with pytest.raises(Regenerated):
        build_corpus(model, tokenizer, cfg, {2}, show_progress=False)  # only the missing shard is regenerated
    with pytest.raises(ConfigError, match="built with other settings"):
        build_corpus(model, tokenizer, CorpusConfig(out_dir=cfg.out_dir, max_new_tokens=9), {2}, show_progress=False)
    # a second builder going down from the last shard (another core) writes the same shards
    reference = {p.name: p.read_bytes() for p in (tmp_path / "corpus").glob("shard_*.npz") if p.name != "shard_00000.npz"}
    for p in (tmp_path / "corpus").glob("shard_*.npz"):
        p.unlink()
    monkeypatch.undo()
    made = []
    real_write = corpus.write_shard
    monkeypatch.setattr(corpus, "write_shard", lambda path, *a: made.append(path.name) or real_write(path, *a))
    down = CorpusConfig(**{**cfg.__dict__, "descending": True})
    assert build_corpus(model, tokenizer, down, {2}, show_progress=False)["prompts"] == 7
    assert made == ["shard_00002.npz", "shard_00001.npz", "shard_00000.npz"]
    for name, data in reference.items():
        a, b = np.load(tmp_path / "corpus" / name), np.load(io.BytesIO(data))
        assert (a["ids"] == b["ids"]).all() and (a["lengths"] == b["lengths"]).all()
    with pytest.raises(ConfigError, match="no corpus.npz and no shard"):
        load_corpus(str(tmp_path / "nothing"))


def test_a_second_builder_needs_the_first_ones_questions_and_temp_files_are_not_shards(tmp_path):
    from pipeline.train.corpus import write_shard

    with pytest.raises(ConfigError, match="start the first builder"):
        build_corpus(None, None, CorpusConfig(out_dir=str(tmp_path / "c"), descending=True), {2}, show_progress=False)
    folder = tmp_path / "shards"
    folder.mkdir()
    write_shard(folder / "shard_00000.npz", [([1, 2], [3, 4])], ["chat"])
    (folder / "shard_00001.npz.999.tmp").write_bytes(b"half written")  # another builder's write in progress
    (folder / "shard_00002.tmp.npz").write_bytes(b"left by an older builder")
    assert [s["ids"].tolist() for s in load_corpus(str(folder))] == [[1, 2, 3, 4]]


def test_bundle_only_snapshots_the_shards_written_so_far_as_a_partial_corpus(tmp_path):
    from pipeline.train.corpus import bundle_written, write_shard

    with pytest.raises(ConfigError, match="holds no shard"):
        bundle_written(tmp_path)
    write_shard(tmp_path / "shard_00000.npz", [([1, 2], [3, 4, 5]), ([6], [7])], ["chat", "code"])
    write_shard(tmp_path / "shard_00003.npz", [([8, 9], [10])], ["self"])
    stats = bundle_written(tmp_path)
    assert stats["complete"] is False and stats["shards"] == 2 and stats["shard_ids"] == "0,3"
    assert stats["prompts"] == 3 and stats["answer_tokens"] == 5
    assert stats["by_source"] == {"chat": 1, "code": 1, "self": 1}
    assert json.loads((tmp_path / "stats.json").read_text()) == stats
    bundled = load_corpus(str(tmp_path))  # the bundle is what a folder with corpus.npz is read as
    assert (tmp_path / "corpus.npz").is_file()
    assert [s["ids"].tolist() for s in bundled] == [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    assert [s["prompt_len"] for s in bundled] == [2, 1, 2]


def test_self_questions_keep_only_distinct_one_line_questions_and_are_written_once(tmp_path, monkeypatch):
    import pipeline.train.corpus as corpus

    replies = iter(["What is a prime number?\nIt is...", "no question here", "Why?",  # "Why?" is too short
                    "What is a prime number?", "How do tides follow the moon?", "Is it?" * 80 + "?"])

    def fake_generate(model, tokenizer, prompts, max_new_tokens, stop_ids, template_kwargs, temperature):
        return [(p, next(replies)) for p in prompts]

    class Decoder:
        def decode(self, text, skip_special_tokens):
            return text

    monkeypatch.setattr(corpus, "generate_batch", fake_generate)
    cfg = CorpusConfig(out_dir=str(tmp_path), self_questions=2, batch_size=3)
    questions = corpus.self_questions(None, Decoder(), cfg, tmp_path, {2}, {})
    assert sorted(questions) == ["How do tides follow the moon?", "What is a prime number?"]
    monkeypatch.setattr(corpus, "generate_batch", None)  # the second call reads questions.json
    assert corpus.self_questions(None, Decoder(), cfg, tmp_path, {2}, {}) == questions
