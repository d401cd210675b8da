"""task=spec_bench: Spec-Bench's question.jsonl layout (question_id, category, turns), from task.path, the
data cache or a download; task.categories selects; results keep the category. The real file is not shipped:
these tests write small files in its format."""

import json
import urllib.request

import pytest

from pipeline.tasks import TaskConfig, TaskDataError, load_examples
from pipeline.tasks.loaders import SPEC_BENCH_URL

CATEGORIES = ["writing", "translation", "summarization", "qa", "math_reasoning", "rag"]


def write_questions(path, per_category=2):
    rows = [{"question_id": 81 + i * per_category + j, "category": c, "turns": [f"{c} question {j}"] + (
        ["and a second turn"] if c == "writing" else [])} for i, c in enumerate(CATEGORIES) for j in range(per_category)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_spec_bench_from_a_file_with_categories_selected_before_the_limit(tmp_path):
    path = write_questions(tmp_path / "question.jsonl")
    everything = load_examples(TaskConfig(name="spec_bench", path=str(path)))
    assert len(everything) == 12 and everything[0].id == "81" and len(everything[0].turns) == 2
    assert [e.meta["category"] for e in everything[::2]] == CATEGORIES
    chosen = load_examples(TaskConfig(name="spec_bench", path=str(path), categories=["rag", "qa"], limit=3))
    assert [e.meta["category"] for e in chosen] == ["qa", "qa", "rag"]


def test_an_unknown_category_is_one_line_naming_the_known_ones(tmp_path):
    path = write_questions(tmp_path / "question.jsonl")
    with pytest.raises(TaskDataError) as err:
        load_examples(TaskConfig(name="spec_bench", path=str(path), categories=["coding", "rag"]))
    assert str(err.value).startswith("task spec_bench: no examples of category coding; task.categories can be: ")
    assert "math_reasoning" in str(err.value) and "\n" not in str(err.value)


def test_spec_bench_is_fetched_once_into_the_data_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    source = write_questions(tmp_path / "upstream.jsonl")
    fetched = []

    def fake_urlopen(url, timeout):
        fetched.append(url)
        return source.open("rb")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    assert len(load_examples(TaskConfig(name="spec_bench"))) == 12
    assert len(load_examples(TaskConfig(name="spec_bench", categories=["rag"]))) == 2
    assert fetched == [SPEC_BENCH_URL]  # the second load read the cache
    assert (tmp_path / "cache" / "data" / "spec_bench" / "question.jsonl").is_file()


def test_spec_bench_offline_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))

    def offline(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(TaskDataError) as err:
        load_examples(TaskConfig(name="spec_bench"))
    msg = str(err.value)
    assert msg.startswith("task spec_bench: could not download") and "task.path=" in msg and "\n" not in msg
    assert not list((tmp_path / "cache" / "data" / "spec_bench").iterdir())
