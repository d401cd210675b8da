"""Per-example and run-level quality for every task.

Scores use the output of the last turn; MT-Bench and Alpaca have no automatic metric (they need a
judge model), so they score as {}. Generated code is only ever run through `sandbox.run_program`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Optional

from pipeline.tasks.answers import (
    extract_gsm8k_answer,
    extract_math_answer,
    math_equal,
    normalize_qa,
    numbers_equal,
    qa_f1,
)
from pipeline.tasks.base import TASK_NAMES, Example
from pipeline.tasks.sandbox import DEFAULT_TIMEOUT_S, run_program

QUALITY_METRIC: dict[str, Optional[str]] = {
    "mt_bench": None,
    "gsm8k": "accuracy",
    "humaneval": "pass@1",
    "mbpp": "pass@1",
    "cnn_dm": "rougeL",
    "wmt_de_en": "bleu",
    "qa": "exact_match",  # "f1" is reported too
    "alpaca": None,
    "math500": "accuracy",
    "spec_bench": None,  # Spec-Bench measures speed; its quality is judged elsewhere
}
assert set(QUALITY_METRIC) == set(TASK_NAMES)

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def extract_code(text: str) -> str:
    """The first ```python block (or, failing that, the first ``` block; an unclosed block runs to
    the end, since generation may stop at max_new_tokens), else the whole text."""
    for pattern in (r"```[ \t]*(?:python3?|py)\b[^\n]*\n(.*?)(?:```|\Z)", r"```[^\n]*\n(.*?)(?:```|\Z)"):
        match = re.search(pattern, text, re.DOTALL | re.IGNORECASE)
        if match:
            return match.group(1)
    return text


def humaneval_program(completion: str, reference: dict[str, str]) -> str:
    code = extract_code(completion)
    # The prompt always goes first: a body-only completion needs its signature, and a full-function
    # answer often omits the prompt's imports / helper functions. A prompt function whose body is
    # only its docstring is valid Python, and the model's own definition then replaces it.
    prompt = reference["prompt"]
    sep = "" if prompt.endswith("\n") else "\n"
    return f"{prompt}{sep}{code}\n\n{reference['test']}\n\ncheck({reference['entry_point']})\n"


def mbpp_program(completion: str, reference: dict[str, Any]) -> str:
    tests = "\n".join(reference["tests"])
    return f"{reference.get('setup', '')}\n\n{extract_code(completion)}\n\n{tests}\n"


CODE_TASKS = ("humaneval", "mbpp")  # tasks whose scoring executes generated code (in the sandbox)


def _pass_at_1(program: str) -> dict[str, float]:
    return {"pass@1": float(run_program(program, DEFAULT_TIMEOUT_S).passed)}


@functools.cache
def _rouge_scorer():
    from rouge_score import rouge_scorer  # lazy: pulls in nltk

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def _sentence_lines(text: str) -> str:
    # rougeLsum splits summaries on newlines; put one sentence per line when the model used none
    text = text.strip()
    return text if "\n" in text else "\n".join(re.split(r"(?<=[.!?])\s+", text))


def _rouge(pred: str, ref: str) -> dict[str, float]:
    scores = _rouge_scorer().score(_sentence_lines(ref), _sentence_lines(pred))
    return {name: scores[name].fmeasure for name in ROUGE_TYPES}


def _bleu(pred: str, ref: str) -> dict[str, float]:
    import sacrebleu

    return {"bleu": sacrebleu.sentence_bleu(pred.strip(), [ref]).score}


def _qa(pred: str, refs: list[str]) -> dict[str, float]:
    return {
        "exact_match": float(any(normalize_qa(pred) == normalize_qa(r) for r in refs)),
        "f1": max(qa_f1(pred, r) for r in refs),
    }


SCORERS: dict[str, Callable[[str, Any], dict[str, float]]] = {
    "gsm8k": lambda out, ref: {"accuracy": float(numbers_equal(extract_gsm8k_answer(out), ref))},
    "math500": lambda out, ref: {"accuracy": float(math_equal(extract_math_answer(out), ref))},
    "humaneval": lambda out, ref: _pass_at_1(humaneval_program(out, ref)),
    "mbpp": lambda out, ref: _pass_at_1(mbpp_program(out, ref)),
    "cnn_dm": _rouge,
    "wmt_de_en": _bleu,
    "qa": _qa,
}


def _check_task(task_name: str) -> None:
    if task_name not in QUALITY_METRIC:
        raise ValueError(f"unknown task '{task_name}'; expected one of {', '.join(TASK_NAMES)}")


def score_example(task_name: str, example: Example, outputs: list[str]) -> dict[str, float]:
    """Quality of one example from the outputs of its turns ({} for judge-only tasks)."""
    _check_task(task_name)
    scorer = SCORERS.get(task_name)
    if scorer is None:
        return {}
    return scorer(outputs[-1] if outputs else "", example.reference)


def aggregate_quality(
    task_name: str, examples: list[Example], outputs: list[list[str]], per_example: list[dict]
) -> dict[str, float]:
    """Run-level quality: the mean of each per-example metric, except BLEU, which is corpus BLEU."""
    _check_task(task_name)
    if QUALITY_METRIC[task_name] is None or not per_example:
        return {}
    keys = sorted({k for scores in per_example for k in scores})
    means = {k: sum(s[k] for s in per_example if k in s) / sum(k in s for s in per_example) for k in keys}
    if task_name == "wmt_de_en":
        import sacrebleu

        if len(examples) != len(outputs):
            raise ValueError(f"{len(examples)} examples but {len(outputs)} outputs")
        hyps = [(out[-1] if out else "").strip() for out in outputs]
        means["bleu"] = sacrebleu.corpus_bleu(hyps, [[ex.reference for ex in examples]]).score
    return means
