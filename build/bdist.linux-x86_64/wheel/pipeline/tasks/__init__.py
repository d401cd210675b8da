"""Task layer: load benchmark examples, build chat prompts, and score model outputs.

Importing this package is cheap: `datasets`, `rouge_score` and `sacrebleu` load only when used.
"""

from pipeline.tasks.base import TASK_NAMES, Example, TaskConfig, TaskDataError
from pipeline.tasks.chat import build_chat
from pipeline.tasks.loaders import load_examples
from pipeline.tasks.sandbox import SandboxResult, run_program
from pipeline.tasks.scoring import QUALITY_METRIC, aggregate_quality, score_example

__all__ = [
    "QUALITY_METRIC",
    "TASK_NAMES",
    "Example",
    "SandboxResult",
    "TaskConfig",
    "TaskDataError",
    "aggregate_quality",
    "build_chat",
    "load_examples",
    "run_program",
    "score_example",
]
