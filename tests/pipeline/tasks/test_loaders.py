"""Task loading from the offline sources, local jsonl files, error reporting, and build_chat."""

import json
from pathlib import Path

import datasets
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import pipeline
from pipeline.tasks import TaskConfig, TaskDataError, build_chat, load_examples
from pipeline.resources import SHIPPED_DATA


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_offline_data_ships_inside_the_package_with_its_licences():
    assert SHIPPED_DATA.is_relative_to(Path(pipeline.__file__).parent)
    for data, licence, names in (("gsm8k_test.jsonl", "gsm8k_LICENSE", "MIT License"),
                                 ("mt_bench_question.jsonl", "mt_bench_LICENSE", "Apache License")):
        assert (SHIPPED_DATA / data).is_file() and names in (SHIPPED_DATA / licence).read_text()
        assert data in (SHIPPED_DATA / "README.md").read_text()  # with a note of its origin


def test_offline_tasks_never_read_a_shared_folder(monkeypatch):
    """GSM8K and MT-Bench come from the package even where no ../shared exists: every file opened
    while loading them lies under pipeline/assets."""
    opened = []
    real_open = Path.open

    def spy(self, *args, **kwargs):
        opened.append(self.resolve())
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spy)
    assert len(load_examples(TaskConfig(name="gsm8k"))) == 1319 and len(load_examples(TaskConfig(name="mt_bench"))) == 80
    assert opened and all(p.is_relative_to(SHIPPED_DATA) for p in opened)


def test_humaneval_offline():
    all_ = load_examples(TaskConfig(name="humaneval"))
    assert len(all_) == 164
    first = load_examples(TaskConfig(name="humaneval", limit=5))
    assert [e.id for e in first] == [f"HumanEval/{i}" for i in range(5)]
    ex = first[0]
    assert ex.reference["entry_point"] == "has_close_elements"
    assert len(ex.turns) == 1 and ex.reference["prompt"] in ex.turns[0] and "```python" in ex.turns[0]


def test_gsm8k_seeded_subset():
    cfg = TaskConfig(name="gsm8k", limit=10, shuffle=True, subset_seed=0)
    a, b = load_examples(cfg), load_examples(cfg)
    other = load_examples(TaskConfig(name="gsm8k", limit=10, shuffle=True, subset_seed=1))
    ids = [e.id for e in a]
    assert ids == [e.id for e in b]
    assert ids != [e.id for e in other]
    assert [int(i) for i in ids] == sorted(int(i) for i in ids)  # kept in dataset order
    head = load_examples(TaskConfig(name="gsm8k", limit=2))
    assert [e.id for e in head] == ["0", "1"]
    assert head[0].reference == "18" and "Janet" in head[0].turns[0]


def test_mt_bench_two_turns():
    exs = load_examples(TaskConfig(name="mt_bench"))
    assert len(exs) == 80
    assert all(len(e.turns) == 2 for e in exs)
    assert exs[0].id == "81" and exs[0].meta["category"] == "writing"


def test_prompt_template_keeps_braces():
    cfg = TaskConfig(name="gsm8k", limit=1, prompt_template="Q: {input}\nPut the answer in \\boxed{}.")
    (ex,) = load_examples(cfg)
    assert ex.turns[0].startswith("Q: Janet") and ex.turns[0].endswith("\\boxed{}.")


def test_local_jsonl_per_task(tmp_path):
    cnn = write_jsonl(tmp_path / "cnn.jsonl", [{"id": "a1", "article": "word " * 3000, "highlights": "Sum.\nUp."}])
    (ex,) = load_examples(TaskConfig(name="cnn_dm", path=cnn))
    assert ex.id == "a1" and ex.reference == "Sum.\nUp."
    assert ex.turns[0].startswith("Summarize the following news article in 3 sentences:")
    assert ex.turns[0].count("word") == 2000  # long articles are truncated

    pairs = [{"translation": {"de": "Hallo Welt", "en": "Hello world"}}, {"de": "Ja", "en": "Yes"}]
    wmt = write_jsonl(tmp_path / "wmt.jsonl", pairs)
    exs = load_examples(TaskConfig(name="wmt_de_en", path=wmt))
    assert [e.reference for e in exs] == ["Hello world", "Yes"] and "Hallo Welt" in exs[0].turns[0]

    qa = write_jsonl(tmp_path / "qa.jsonl", [{"question": "capital of france", "answer": ["Paris"]}])
    (ex,) = load_examples(TaskConfig(name="qa", path=qa))
    assert ex.reference == ["Paris"] and "capital of france" in ex.turns[0]

    row = {
        "task_id": 11,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b): return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        "test_setup_code": "",
    }
    mbpp = write_jsonl(tmp_path / "mbpp.jsonl", [row])
    (ex,) = load_examples(TaskConfig(name="mbpp", path=mbpp))
    assert ex.id == "11" and ex.reference["tests"][1] == "assert add(0, 0) == 0"
    assert "assert add(1, 2) == 3" in ex.turns[0] and "add(0, 0)" not in ex.turns[0]


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n\n{"question": oops}\n')
    with pytest.raises(TaskDataError) as err:
        load_examples(TaskConfig(name="gsm8k", path=str(path)))
    msg = str(err.value)
    assert f"{path}:3:" in msg and "invalid JSON" in msg and "\n" not in msg


def test_missing_field_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "q", "answer": ["a"]}, {"question": "no answer"}])
    with pytest.raises(TaskDataError, match=rf"{path}:2: missing required field 'answer'"):
        load_examples(TaskConfig(name="qa", path=path))


def test_missing_file(tmp_path):
    with pytest.raises(TaskDataError, match="nope.jsonl: file not found"):
        load_examples(TaskConfig(name="mbpp", path=str(tmp_path / "nope.jsonl")))


def test_mt_bench_from_the_hub_copy(monkeypatch):
    """task.hf_dataset loads HuggingFaceH4/mt_bench_prompts' layout (prompt / prompt_id) instead of the shipped file."""
    seen = {}

    def fake(dataset, config, split):
        seen.update(dataset=dataset, config=config, split=split)
        return [{"prompt": ["Write a poem.", "Shorter."], "prompt_id": 81, "category": "writing", "reference": []}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    (ex,) = load_examples(TaskConfig(name="mt_bench", hf_dataset="HuggingFaceH4/mt_bench_prompts"))
    assert seen == {"dataset": "HuggingFaceH4/mt_bench_prompts", "config": None, "split": "train"}
    assert ex.id == "81" and ex.turns == ["Write a poem.", "Shorter."] and ex.meta["category"] == "writing"
    assert ex.reference is None


def test_mt_bench_hub_copy_offline_is_one_line(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/mt_bench_prompts' on the Hub\nmore lines")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TaskDataError) as err:
        load_examples(TaskConfig(name="mt_bench", hf_dataset="HuggingFaceH4/mt_bench_prompts"))
    msg = str(err.value)
    assert msg.startswith("task mt_bench:") and "task.path=" in msg and "\n" not in msg


def test_hf_only_task_offline(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nq_open' on the Hub\nmore lines")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TaskDataError) as err:
        load_examples(TaskConfig(name="qa"))
    msg = str(err.value)
    assert "nq_open" in msg and "task.path=" in msg and "validation" in msg and "\n" not in msg


def test_hf_source_uses_task_defaults(monkeypatch):
    seen = {}

    def fake(dataset, config, split):
        seen.update(dataset=dataset, config=config, split=split)
        return [{"problem": "1+1?", "answer": "2", "unique_id": "test/x.json"}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    (ex,) = load_examples(TaskConfig(name="math500"))
    assert seen == {"dataset": "HuggingFaceH4/MATH-500", "config": None, "split": "test"}
    assert ex.id == "test/x.json" and ex.reference == "2" and "\\boxed{}" in ex.turns[0]
    missing = r"tatsu-lab/alpaca_eval\[eval\] row 0: missing required field 'instruction'"
    with pytest.raises(TaskDataError, match=missing):
        load_examples(TaskConfig(name="alpaca"))  # default split "eval" replaces the unset "test"


def chat_tokenizer(template):
    words = "system user assistant be brief hi there what next ok User Assistant : END GEN"
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # splits "User:" into "User" ":"
    tok.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    hf.chat_template = template
    return hf


TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} END {% endfor %}"
    "{% if add_generation_prompt %}assistant : GEN{% endif %}"
)


def test_build_chat_with_template():
    tok = chat_tokenizer(TEMPLATE)
    cfg = TaskConfig(system_prompt="be brief")
    ids = build_chat(tok, cfg, [("hi", "there"), ("what next", None)])
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    text = tok.decode(ids)
    assert text == "system : be brief END user : hi END assistant : there END user : what next END assistant : GEN"


def test_build_chat_without_template_or_system():
    tok = chat_tokenizer(None)
    text = tok.decode(build_chat(tok, TaskConfig(), [("hi", "ok"), ("what next", None)]))
    assert text == "User : hi Assistant : ok User : what next Assistant :"
    text = tok.decode(build_chat(tok, TaskConfig(system_prompt="be brief"), [("hi", None)]))
    assert text == "be brief User : hi Assistant :"
    with pytest.raises(ValueError):
        build_chat(tok, TaskConfig(), [("hi", "ok")])


def test_build_chat_folds_system_into_user_when_template_rejects_it():
    template = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}" + TEMPLATE
    tok = chat_tokenizer(template)
    text = tok.decode(build_chat(tok, TaskConfig(system_prompt="be brief"), [("hi", None)]))
    assert text == "user : be brief hi END assistant : GEN"


def test_qwen3_configs_switch_thinking_off_in_the_chat_template():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from pipeline.schema import register_configs

    register_configs()
    for model in ("qwen3-0.6b", "qwen3-4b", "qwen3-8b"):
        with initialize_config_module(config_module="conf", version_base="1.3"):
            cfg = OmegaConf.to_object(compose("config", overrides=[f"model={model}"]))
        assert cfg.model.chat_template_kwargs == {"enable_thinking": False}, model
