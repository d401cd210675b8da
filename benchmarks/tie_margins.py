"""The margins behind the near-tie diagnosis of a finished bench_endogenous run: for every prompt where a
method's greedy output differs from AR's, AR's logit margin at the first difference (decoding/engine/ties.py),
summarised over all methods and tasks: min / median / max, the tolerance range, and how often the
recomputed AR logits prefer the method's token.

    python benchmarks/tie_margins.py --dir outputs/bench_endogenous/bf16 --limits mt_bench=4,gsm8k=8,humaneval=8
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

import torch

from decoding.engine.target import TargetModel
from pipeline.generation import GenerationSettings, diagnose_mismatches
from pipeline.models import load_model
from pipeline.tasks import load_examples

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import compose_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a bench_endogenous --out folder (<task>.jsonl files)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default=None, help="the run's model.dtype (default: the model config's)")
    ap.add_argument("--limits", required=True, help="the run's --limits, e.g. mt_bench=4,gsm8k=8")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_overrides = [f"model={args.model}"] + ([f"model.dtype={args.dtype}"] if args.dtype else [])
    rc = compose_run(model_overrides)
    model, tokenizer = load_model(rc.model)
    target = TargetModel(model, tokenizer)
    settings = GenerationSettings(0, 0.0, 0, set(), 0, dict(rc.model.chat_template_kwargs))
    found = []
    for item in args.limits.split(","):
        task, limit = item.split("=")
        task_cfg = compose_run([*model_overrides, f"task={task}", f"task.limit={limit}"]).task
        examples = load_examples(task_cfg)
        by_method: dict[str, dict[str, dict]] = {}
        for line in (Path(args.dir) / f"{task}.jsonl").read_text().splitlines():
            row = json.loads(line)
            by_method.setdefault(row["method"], {})[row["id"]] = row
        ar = by_method.pop("ar")
        for rows in by_method.values():
            ids = [ex.id for ex in examples if ex.id in rows and ex.id in ar]
            found += diagnose_mismatches(target, task_cfg, examples, [rows[i] for i in ids], [ar[i] for i in ids],
                                         settings)
    margins = [d["margin"] for d in found]
    tolerances = [d["tolerance"] for d in found]
    print(f"model={args.model} dtype={target.dtype} mismatches={len(found)} "
          f"kinds={dict(collections.Counter(d['kind'] for d in found))}")
    if found:
        print(f"margin: min {min(margins):.3f}, median {statistics.median(margins):.3f}, max {max(margins):.3f}; "
              f"tolerance {min(tolerances):.3f}-{max(tolerances):.3f}")
        prefer = sum(d["ar_top"] == d["method_token"] for d in found)
        print(f"recomputed AR logits prefer the method's token in {prefer} of {len(found)}")


if __name__ == "__main__":
    main()
