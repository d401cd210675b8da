"""Task configuration and the data model every task loader produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

TASK_NAMES = ("mt_bench", "gsm8k", "humaneval", "mbpp", "cnn_dm", "wmt_de_en", "qa", "alpaca", "math500", "spec_bench")


@dataclass
class TaskConfig:
    name: str = "humaneval"  # one of TASK_NAMES
    path: Optional[str] = None  # local .jsonl file; overrides the built-in source
    hf_dataset: Optional[str] = None  # HF datasets id used on networked machines
    hf_config: Optional[str] = None
    split: str = "test"
    limit: Optional[int] = None  # number of examples (after seeded subsetting)
    subset_seed: int = 0  # fixed seed for subsets (GSM-100 / MBPP-100 style)
    shuffle: bool = False  # if True take a seeded random subset of size `limit`, else the first `limit`
    # keep only examples of these categories (MT-Bench, Spec-Bench), before `limit`; empty: all
    categories: list[str] = field(default_factory=list)
    max_new_tokens: int = 256
    system_prompt: Optional[str] = None
    prompt_template: str = "{input}"  # how the user message is built from the example's main text
    # isolation of generated code (HumanEval, MBPP): auto (bwrap where it starts, else refuse) | bwrap |
    # unshare (namespaces + chroot, as root) | unsafe (no OS isolation: disposable machines only);
    # pipeline/tasks/sandbox.py
    sandbox: str = "auto"

    def __post_init__(self) -> None:
        from pipeline.errors import check_choice, check_range

        check_choice("task.name", self.name, TASK_NAMES)
        check_choice("task.sandbox", self.sandbox, ("auto", "bwrap", "unshare", "unsafe"))
        check_range("task.max_new_tokens", self.max_new_tokens, 1)
        if self.limit is not None:
            check_range("task.limit", self.limit, 1)


@dataclass
class Example:
    id: str
    turns: list[str]  # user messages (already formatted with prompt_template); 2 for mt_bench, else 1
    reference: Any = None  # gold answer / test code / reference summary / translation / list of answers
    meta: dict = field(default_factory=dict)


class TaskDataError(Exception):
    """Missing or malformed task data. The message is one line naming the file (or dataset), the
    line when known, and what is wrong, so the CLI can print it without a traceback."""
