"""Run one method over a task's examples, one results.jsonl row per example, flushed as soon as the
example finishes: rerunning into the same file skips finished examples, so a killed run loses at
most the example in flight."""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from decoding.engine.loop import Method, generate
from decoding.engine.metrics import GenerationStats
from decoding.engine.target import TargetModel
from pipeline.tasks import Example, build_chat, score_example


@dataclass
class GenerationSettings:
    max_new_tokens: int
    temperature: float
    seed: int
    stop_ids: set[int]
    warmup: int = 1
    chat_template_kwargs: dict = field(default_factory=dict)  # the model's (ModelConfig.chat_template_kwargs)


def read_results(path: Path, repair: bool = False) -> dict[str, dict]:
    """Finished rows by example id. A torn line (a kill mid-write) is ignored; with `repair` it is
    also cut from the file so that appended rows start on a clean line."""
    rows: dict[str, dict] = {}
    if not path.exists():
        return rows
    good_lines, torn = [], False
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            torn = True
            continue
        rows[row["id"]] = row
        good_lines.append(line)
    if repair and torn:
        path.write_text("".join(line + "\n" for line in good_lines))
    return rows


def append_result(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def example_seed(seed: int, example_id: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(example_id.encode())) % (2**31)


def generate_example(method: Method, target: TargetModel, task_cfg, example: Example,
                     settings: GenerationSettings, on_step: Callable | None = None) -> dict:
    """All turns of one example (turn k sees the model's own answers to turns < k)."""
    tokenizer = target.tokenizer
    history: list[tuple[str, str | None]] = []
    texts, output_ids = [], []
    stats = GenerationStats()
    for turn_index, user_text in enumerate(example.turns):
        history.append((user_text, None))
        prompt_ids = build_chat(tokenizer, task_cfg, history, settings.chat_template_kwargs)
        state = generate(method, target, prompt_ids, max_new_tokens=settings.max_new_tokens,
                         temperature=settings.temperature, stop_ids=settings.stop_ids,
                         seed=example_seed(settings.seed + turn_index, example.id), on_step=on_step)
        text = tokenizer.decode(state.new_tokens, skip_special_tokens=True)
        history[-1] = (user_text, text)
        texts.append(text)
        output_ids.append(state.new_tokens)
        stats.merge(state.stats)
    row = {"id": example.id, **stats.to_dict(), "outputs": texts, "output_ids": output_ids}
    if example.meta.get("category") is not None:  # MT-Bench / Spec-Bench: results break down by it
        row["category"] = example.meta["category"]
    row["quality"] = score_example(task_cfg.name, example, texts)
    return row


def warm_up(method: Method, target: TargetModel, task_cfg, example: Example, settings: GenerationSettings) -> None:
    """Untimed short generations so first-call costs (allocator, kernels) are not measured."""
    for _ in range(settings.warmup):
        prompt_ids = build_chat(target.tokenizer, task_cfg, [(example.turns[0], None)], settings.chat_template_kwargs)
        generate(method, target, prompt_ids, max_new_tokens=min(16, settings.max_new_tokens),
                 temperature=settings.temperature, stop_ids=settings.stop_ids, seed=settings.seed)


def run_examples(method: Method, target: TargetModel, task_cfg, examples: list[Example],
                 settings: GenerationSettings, results_path: Path,
                 on_row: Callable[[dict], None] | None = None, progress=None) -> list[dict]:
    """Generate every unfinished example, appending rows to results_path; returns all rows in
    example order (finished ones read back from the file)."""
    done = read_results(results_path, repair=True)
    todo = [ex for ex in examples if ex.id not in done]
    if todo and settings.warmup:
        warm_up(method, target, task_cfg, todo[0], settings)
    for example in todo:
        on_step = progress.step_callback() if progress is not None else None
        row = generate_example(method, target, task_cfg, example, settings, on_step)
        append_result(results_path, row)
        done[example.id] = row
        if progress is not None:
            progress.finish_example(row)
        if on_row is not None:
            on_row(row)
    return [done[ex.id] for ex in examples if ex.id in done]


def diagnose_mismatches(target: TargetModel, task_cfg, examples: list[Example], rows: list[dict],
                        reference: list[dict], settings: GenerationSettings) -> list[dict]:
    """For every example whose greedy output differs from the AR reference: the first turn and
    position that differ and whether AR's logit margin there is a numeric near-tie
    (decoding/engine/ties.py). Earlier turns are equal, so the differing turn's prompt is rebuilt from
    AR's own answers."""
    from decoding.engine.ties import diagnose

    by_id = {ex.id: ex for ex in examples}
    ref = {r["id"]: r for r in reference}
    out = []
    for row in rows:
        other = ref.get(row["id"])
        if other is None or row["output_ids"] == other["output_ids"]:
            continue
        example = by_id[row["id"]]
        history: list[tuple[str, str | None]] = []
        for turn, (ar_ids, ids) in enumerate(zip(other["output_ids"], row["output_ids"])):
            history.append((example.turns[turn], None))
            if ar_ids != ids:
                prompt = build_chat(target.tokenizer, task_cfg, history, settings.chat_template_kwargs)
                found = diagnose(target, prompt, ar_ids, ids)
                out.append({"id": row["id"], "turn": turn, **found.to_dict()})
                break
            history[-1] = (example.turns[turn], other["outputs"][turn])
    return out
