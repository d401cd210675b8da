"""Prompt token ids for one generation step of a (possibly multi-turn) conversation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from pipeline.tasks.base import TaskConfig


def _messages(system: Optional[str], turns_so_far: Sequence[tuple[str, Optional[str]]]) -> list[dict[str, str]]:
    if not turns_so_far or turns_so_far[-1][1] is not None:
        raise ValueError("build_chat needs a last user turn that has no assistant answer yet")
    msgs = [{"role": "system", "content": system}] if system else []
    for user, assistant in turns_so_far:
        msgs.append({"role": "user", "content": user})
        if assistant is not None:
            msgs.append({"role": "assistant", "content": assistant})
    return msgs


def _as_ids(encoded: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding by default; older versions / return_dict=False a list
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(t) for t in ids]


def _plain_prompt(msgs: list[dict[str, str]]) -> str:
    """Fallback for tokenizers without a chat template (base models)."""
    names = {"user": "User", "assistant": "Assistant"}
    parts = [m["content"] + "\n" if m["role"] == "system" else f"{names[m['role']]}: {m['content']}" for m in msgs]
    return "\n".join(parts) + "\nAssistant:"


def build_chat(tokenizer: Any, cfg: TaskConfig, turns_so_far: Sequence[tuple[str, Optional[str]]],
               template_kwargs: Optional[Mapping[str, Any]] = None) -> list[int]:
    """Token ids of [system?, user, assistant, ..., user] plus the generation prompt.

    `turns_so_far` is [(user, assistant answer or None)], with None exactly for the last turn.
    `template_kwargs` go to the chat template (the model's `chat_template_kwargs`, e.g. Qwen3's
    `enable_thinking: false`).
    """
    msgs = _messages(cfg.system_prompt, turns_so_far)
    if getattr(tokenizer, "chat_template", None) is None:
        return _as_ids(tokenizer(_plain_prompt(msgs))["input_ids"])
    extra = dict(template_kwargs or {})
    try:
        return _as_ids(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **extra))
    except Exception:
        if msgs[0]["role"] != "system":
            raise
    # some templates (e.g. Gemma's) reject a system role: fold it into the first user message
    merged = [{"role": "user", "content": f"{msgs[0]['content']}\n\n{msgs[1]['content']}"}, *msgs[2:]]
    return _as_ids(tokenizer.apply_chat_template(merged, add_generation_prompt=True, tokenize=True, **extra))
