"""Training-free endogenous drafting on one model: AR, Lookahead, Self-Draft, PTD (and any other
method option, e.g. ptd_tuned) on MT-Bench, GSM8K and HumanEval, interleaved per example.

For every example the methods run one after the other (AR first), so slow drifts of the machine's
load hit all of them alike; speedup = method tokens/s over AR tokens/s on the same examples.
Rows are appended to <out>/<task>.jsonl as each generation finishes: rerunning the same command
resumes. Prints, per task and method: tau, decoding efficiency (DE), rows per forward, redundancy
of the drafted branches (share of duplicated bigrams), tokens/s, speedup vs AR, match rate vs AR
(greedy) with the tie diagnosis of every mismatch (ties: the first difference is a numeric near-tie
of AR's logits, decoding/engine/ties.py; diverged: it is not) and task quality. `--dtype` defaults to the
model config's (`auto`: bf16 on a CPU with native bf16).

    python benchmarks/bench_endogenous.py --tasks gsm8k --limit 10 --max-new-tokens 64     # smoke
    nice -n 10 python benchmarks/bench_endogenous.py --out outputs/bench_endogenous/full \\
        --tasks mt_bench,gsm8k,humaneval --limits mt_bench=80,gsm8k=100,humaneval=164
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from hydra.utils import get_class

from decoding.engine.target import TargetModel
from pipeline.generation import GenerationSettings, append_result, generate_example, read_results, warm_up
from pipeline.models import load_model, stop_token_ids
from pipeline.schema import register_configs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import compose_run  # noqa: E402
from pipeline.summary import tie_counts, totals
from pipeline.tasks import aggregate_quality, load_examples


def summarize(task_cfg, examples, rows_by_method: dict[str, dict[str, dict]], target=None, settings=None) -> list[dict]:
    from pipeline.generation import diagnose_mismatches

    ar = rows_by_method.get("ar", {})
    out = []
    for name, rows in rows_by_method.items():
        ids = [ex.id for ex in examples if ex.id in rows and ex.id in ar]
        if not ids:
            continue
        mine, ref = totals([rows[i] for i in ids]), totals([ar[i] for i in ids])
        extra = mine["extra"]
        done = [ex for ex in examples if ex.id in ids]
        quality = aggregate_quality(task_cfg.name, done, [rows[i]["outputs"] for i in ids],
                                    [rows[i]["quality"] for i in ids])
        diagnosis = [] if name == "ar" or target is None else diagnose_mismatches(
            target, task_cfg, done, [rows[i] for i in ids], [ar[i] for i in ids], settings)
        counts = tie_counts(diagnosis)
        out.append({
            "ties": counts["match_ties"], "diverged": counts["match_divergences"], "divergent_ids": counts["divergent_ids"],
            "task": task_cfg.name, "method": name, "prompts": len(ids), "tau": mine["tau"],
            "decoding_efficiency": mine["decoding_efficiency"],
            "rows_per_forward": extra.get("forward_rows", mine["num_steps"]) / max(1, mine["num_steps"]),
            "redundancy": mine["draft_redundancy"],
            "tokens_per_s": mine["tokens_per_s"], "speedup": mine["tokens_per_s"] / ref["tokens_per_s"],
            "match_rate": sum(rows[i]["output_ids"] == ar[i]["output_ids"] for i in ids) / len(ids),
            "quality": quality,
        })
    return out


def print_table(summary: list[dict]) -> None:
    print("| task | method | prompts | tau | DE | rows/forward | redundancy | tok/s | speedup | match | ties | diverged |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        red = "-" if s["redundancy"] is None else f"{s['redundancy']:.3f}"
        print(f"| {s['task']} | {s['method']} | {s['prompts']} | {s['tau']:.3f} | {s['decoding_efficiency']:.3f} | "
              f"{s['rows_per_forward']:.1f} | {red} | {s['tokens_per_s']:.2f} | {s['speedup']:.3f} | "
              f"{s['match_rate']:.2f} | {s['ties']} | {s['diverged']} |")


def print_mean_speedup(summary: list[dict]) -> None:
    """Speedup averaged over the tasks (each task's ratio counts once), per method."""
    by_method: dict[str, list[float]] = {}
    for s in summary:
        by_method.setdefault(s["method"], []).append(s["speedup"])
    print("mean speedup over tasks: " + ", ".join(f"{m} {sum(v) / len(v):.3f}x" for m, v in by_method.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default="mt_bench,gsm8k,humaneval")
    ap.add_argument("--methods", default="ar,lookahead,self_draft,ptd", help="conf/method options; ar first")
    ap.add_argument("--limit", type=int, default=None, help="examples per task (default: the task config's)")
    ap.add_argument("--limits", default="", help="per task, e.g. mt_bench=80,gsm8k=100,humaneval=164")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the task config's")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="outputs/bench_endogenous/default")
    ap.add_argument("--dtype", default=None, help="model.dtype (default: the model config's, auto = bf16 where native)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    register_configs()
    methods = [m for m in args.methods.split(",") if m]
    if methods[0] != "ar":
        raise SystemExit("error: --methods must start with ar (the reference)")
    limits = dict(item.split("=") for item in args.limits.split(",") if item)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_overrides = [f"model={args.model}"] + ([f"model.dtype={args.dtype}"] if args.dtype else [])
    rc = compose_run(model_overrides)
    model, tokenizer = load_model(rc.model)
    target = TargetModel(model, tokenizer)
    stops = stop_token_ids(model, tokenizer)
    method_objs = {}
    for name in methods:
        cfg = compose_run([*model_overrides, f"method={name}"]).method
        method_objs[name] = get_class(cfg._target_)(cfg)
        method_objs[name].setup(target)
    print(f"model={args.model} dtype={target.dtype} threads={torch.get_num_threads()} methods={methods} out={out}",
          flush=True)
    all_summary = []
    for task in [t for t in args.tasks.split(",") if t]:
        overrides = [*model_overrides, f"task={task}"]
        limit = limits.get(task, args.limit)
        if limit is not None:
            overrides.append(f"task.limit={limit}")
        task_cfg = compose_run(overrides).task
        examples = load_examples(task_cfg)
        settings = GenerationSettings(max_new_tokens=args.max_new_tokens or task_cfg.max_new_tokens, temperature=0.0,
                                      seed=0, stop_ids=stops, warmup=1,
                                      chat_template_kwargs=dict(rc.model.chat_template_kwargs))
        path = out / f"{task}.jsonl"
        done = {}
        for row in read_results_multi(path):
            done.setdefault(row["method"], {})[row["id"]] = row
        for name, method in method_objs.items():
            warm_up(method, target, task_cfg, examples[0], settings)
        t0 = time.perf_counter()
        for k, example in enumerate(examples):
            for name, method in method_objs.items():
                if example.id in done.get(name, {}):
                    continue
                row = {"method": name, **generate_example(method, target, task_cfg, example, settings)}
                append_result(path, row)
                done.setdefault(name, {})[example.id] = row
            print(f"{task}: {k + 1}/{len(examples)} examples ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
        summary = summarize(task_cfg, examples, done, target, settings)
        all_summary += summary
        print_table(summary)
    (out / "summary.json").write_text(json.dumps(all_summary, indent=2))
    print(f"\nall tasks (written to {out / 'summary.json'}):")
    print_table(all_summary)
    print_mean_speedup(all_summary)


def read_results_multi(path: Path) -> list[dict]:
    """Rows of every method (read_results keys by example id alone, so it is read per method)."""
    if not path.exists():
        return []
    read_results(path, repair=True)  # cut a torn last line left by a kill
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
