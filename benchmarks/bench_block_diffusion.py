"""Block-diffusion decoders on one model, one run: tau, decoding efficiency (DE), speedup vs AR and
match rate for DFlash, DDTree, CaDDTree, Domino, DominoTree, DominoTree scoring=marginal and
CondAdaptive on MT-Bench, GSM8K and HumanEval at T = 0, 0.5, 1.0.

AR and every method run back to back on each prompt (interleaved), so a slow patch of a shared
machine hits all of them alike; speedup = method tokens/s / AR tokens/s over the same prompts.
MT-Bench turn 2 follows each method's own turn-1 answer (identical to AR's at T = 0). At T = 0 every
mismatch with AR is diagnosed (decoding/engine/ties.py): `ties` (numeric near-ties of AR's logits) and
`diverged` (not). `--dtype` defaults to the model config's (`auto`: bf16 on a CPU with native bf16).

    python benchmarks/bench_block_diffusion.py [--prompts 2] [--max-new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from hydra.utils import get_class

from decoding.methods.ar import AR
from decoding.engine.loop import generate
from decoding.engine.metrics import GenerationStats
from decoding.engine.target import TargetModel
from pipeline.generation import GenerationSettings, diagnose_mismatches, generate_example
from pipeline.models import load_model, stop_token_ids
from pipeline.schema import register_configs
from pipeline.summary import tie_counts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import compose_run  # noqa: E402
from pipeline.tasks import build_chat, load_examples

METHODS = {  # label -> overrides of `python -m pipeline`
    "dflash": ["method=dflash"],
    "ddtree": ["method=ddtree"],
    "caddtree": ["method=caddtree"],
    "domino": ["method=domino"],
    "dominotree": ["method=dominotree"],
    "dominotree_marginal": ["method=dominotree", "method.scoring=marginal"],
    "cond_adaptive": ["method=dominotree", "method.budget=cond_adaptive"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", default="mt_bench,gsm8k,humaneval")
    parser.add_argument("--temperatures", default="0,0.5,1.0")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--drafters", default=None, help="folder with dflash/ and domino/ (default: model.drafters)")
    parser.add_argument("--out", default="outputs/bench_block_diffusion.json")
    parser.add_argument("--dtype", default=None, help="model.dtype (default: the model config's, auto = bf16 where native)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    register_configs()
    model_overrides = [f"model={args.model}"] + ([f"model.dtype={args.dtype}"] if args.dtype else [])
    base = compose_run(model_overrides)
    model, tokenizer = load_model(base.model)
    target = TargetModel(model, tokenizer)
    stops = stop_token_ids(model, tokenizer)
    template = dict(base.model.chat_template_kwargs)
    labels = args.methods.split(",")
    methods = {}
    for label in labels:
        overrides = [*model_overrides, *METHODS[label]]
        if args.drafters:
            kind = "domino" if "domino" in METHODS[label][0] else "dflash"
            overrides.append(f"method.drafter={Path(args.drafters, kind).resolve()}")
        cfg = compose_run(overrides).method
        methods[label] = get_class(cfg._target_)(cfg)
        methods[label].setup(target)
    warm = build_chat(tokenizer, base.task, [("Say hello.", None)], template)
    for method in [AR(), *methods.values()]:  # untimed: first-call overheads
        generate(method, target, warm, max_new_tokens=8, stop_ids=stops)
    print(f"model={args.model} dtype={target.dtype} threads={torch.get_num_threads()} prompts/task={args.prompts} "
          f"max_new_tokens={args.max_new_tokens}", flush=True)
    rows = []
    tasks = {}
    for task in args.tasks.split(","):
        task_cfg = compose_run([*model_overrides, f"task={task}", f"task.limit={args.prompts}"]).task
        tasks[task] = (task_cfg, load_examples(task_cfg))
    for temperature in [float(t) for t in args.temperatures.split(",")]:  # T = 0 of every task first
        settings = GenerationSettings(max_new_tokens=args.max_new_tokens, temperature=temperature, seed=0,
                                      stop_ids=stops, warmup=0, chat_template_kwargs=template)
        for task, (task_cfg, examples) in tasks.items():
            results = {name: [] for name in ["ar", *labels]}
            for example in examples:  # AR, then every method, on the same prompt
                for name, method in [("ar", AR()), *methods.items()]:
                    results[name].append(generate_example(method, target, task_cfg, example, settings))
            ar_stats = merged(results["ar"])
            for name, method_rows in results.items():
                s = merged(method_rows)
                diagnosis = diagnose_mismatches(target, task_cfg, examples, method_rows, results["ar"], settings) \
                    if temperature == 0 and name != "ar" else []
                counts = tie_counts(diagnosis)
                row = {"task": task, "T": temperature, "method": name, "tau": s.tau, "DE": s.decoding_efficiency,
                       "tokens_per_s": s.tokens_per_s,
                       "speedup": s.tokens_per_s / ar_stats.tokens_per_s if ar_stats.tokens_per_s else 0.0,
                       "match_rate": (sum(r["output_ids"] == a["output_ids"] for r, a in zip(method_rows, results["ar"]))
                                      / len(examples)) if temperature == 0 and name != "ar" else None,
                       "ties": counts["match_ties"], "diverged": counts["match_divergences"],
                       "new_tokens": s.new_tokens, "extra": s.extra, "steps": s.num_steps}
                rows.append(row)
                extra = ""
                if "tree_nodes" in s.extra:
                    extra = (f"  nodes/step {s.extra['tree_nodes'] / s.num_steps:.1f}"
                             f"  cap hits {s.extra['budget_cap_hits'] / s.num_steps:.0%}")
                match = "" if row["match_rate"] is None else \
                    f"  match {row['match_rate']:.2f} (ties {row['ties']}, diverged {row['diverged']})"
                print(f"{task:9s} T={temperature:<3} {name:20s} tau {s.tau:5.2f}  DE {s.decoding_efficiency:5.2f}  "
                      f"{s.tokens_per_s:6.2f} tok/s  speedup {row['speedup']:5.2f}{match}{extra}", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(rows, indent=2))


def merged(rows: list[dict]) -> GenerationStats:
    """One GenerationStats over result rows (pipeline.generation.generate_example's)."""
    total = GenerationStats()
    for r in rows:
        total.merge(GenerationStats(**{k: r[k] for k in GenerationStats.__dataclass_fields__}))
    return total


if __name__ == "__main__":
    main()
