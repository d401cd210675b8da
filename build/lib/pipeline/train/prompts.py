"""Training prompts for drafters, disjoint from every evaluation prompt.

Three offline sources, mixed so the drafter sees math, code and chat-style answers:
- GSM8K test questions *outside* the evaluation subsets. The gsm8k task evaluates a seeded
  shuffled subset (`task.limit` <= RESERVED_GSM8K with `task.subset_seed=0`; Python's
  `random.sample` draws those subsets as prefixes of one sequence), so the first RESERVED_GSM8K
  indices of that sequence are reserved for evaluation and never used here.
- Coding requests written from the standard library's own function signatures and docstrings
  (HumanEval is evaluation-only and is not used).
- Open-ended requests from fixed templates and topic lists (MT-Bench is evaluation-only).
"""

from __future__ import annotations

import importlib
import inspect
import random

from pipeline.tasks.base import TaskConfig
from pipeline.tasks.loaders import _builtin_rows, subset_indices

RESERVED_GSM8K = 300  # gsm8k eval subsets with subset_seed=0 and limit <= this never overlap training
STDLIB_MODULES = ("string", "textwrap", "itertools", "functools", "statistics", "math", "bisect", "heapq",
                  "os.path", "shutil", "json", "csv", "re", "random", "collections", "fractions", "html",
                  "urllib.parse", "difflib", "calendar", "datetime", "operator", "base64", "zlib", "copy")
CHAT_TEMPLATES = (
    "Explain {t} to a beginner in a few paragraphs.",
    "Give me five practical tips about {t}.",
    "Write a short blog post about {t}.",
    "What are the pros and cons of {t}?",
    "Write a short story in which {t} plays an important role.",
    "Summarize the history of {t} in a few sentences.",
    "Compose a friendly email to a colleague about {t}.",
    "Create a study plan for learning about {t} in two weeks.",
)
CHAT_TOPICS = (
    "gardening", "climate change", "the stock market", "machine learning", "healthy breakfasts", "time management",
    "public speaking", "renewable energy", "the Roman Empire", "photosynthesis", "remote work", "chess openings",
    "budget travel", "sleep hygiene", "electric cars", "the water cycle", "learning a new language", "volcanoes",
    "job interviews", "urban cycling", "home cooking", "the solar system", "meditation", "recycling",
    "team leadership", "coffee brewing", "bird watching", "personal finance", "marathon training", "jazz music",
    "cloud computing", "honey bees", "writing poetry", "the printing press", "board games", "first aid",
)


def gsm8k_training_questions() -> list[str]:
    rows = _builtin_rows(TaskConfig(name="gsm8k"))
    if rows is None:
        return []
    reserved = set(subset_indices(len(rows), TaskConfig(name="gsm8k", limit=RESERVED_GSM8K, shuffle=True,
                                                        subset_seed=0)))
    return [rows.rows[i]["question"] for i in range(len(rows)) if i not in reserved]


def stdlib_coding_requests() -> list[str]:
    requests = []
    for module_name in STDLIB_MODULES:
        module = importlib.import_module(module_name)
        for name, fn in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isfunction(fn) or inspect.isbuiltin(fn)):
                continue
            doc = (inspect.getdoc(fn) or "").strip().split("\n\n")[0].replace("\n", " ")
            if len(doc) < 20:
                continue
            requests.append(f"Write a Python function `{name}` that behaves like this description, "
                            f"without importing {module_name}: {doc}")
    return requests


def chat_requests() -> list[str]:
    return [template.format(t=topic) for template in CHAT_TEMPLATES for topic in CHAT_TOPICS]


def training_prompts(num_prompts: int, seed: int, chunk: int = 32) -> list[tuple[str, str]]:
    """(source, user message) pairs: the three sources in turn, `chunk` prompts at a time, so that
    every prefix is an even mix and every chunk (one generate batch) has answers of similar length.
    A longer list extends a shorter one, so data shards stay valid when num_prompts grows."""
    rng = random.Random(seed)
    pools = {"gsm8k": gsm8k_training_questions(), "code": stdlib_coding_requests(), "chat": chat_requests()}
    pools = [(k, rng.sample(v, len(v))) for k, v in pools.items() if v]
    picked: list[tuple[str, str]] = []
    for first in range(0, max(len(v) for _, v in pools), chunk):
        for source, items in pools:
            picked.extend((source, text) for text in items[first:first + chunk])
    return picked[:num_prompts]
