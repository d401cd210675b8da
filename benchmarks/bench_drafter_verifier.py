"""Drafter-verifier benchmark on one model and machine, all methods in the same process: AR, sd,
spec_cascade at several α and via_sd (and its random-mask ablation) with one shared drafter
(`--drafter early_exit|exit_head|slim`; exit_head = the early exit with its trained tuned-lens head),
plus sd with each other drafter kind. Per task: tokens/s, speedup vs
AR, τ, rejection rate, full-target forwards per token, VIA-SD tier shares, quality next to AR's
(gsm8k accuracy, humaneval pass@1; mt_bench has no automatic score).

    python benchmarks/bench_drafter_verifier.py --tasks gsm8k humaneval mt_bench --prompts 5 --max-new-tokens 128
    python benchmarks/bench_drafter_verifier.py --drafter exit_head --only "sd,cascade[opt,a=0.05],via_sd"
"""

from __future__ import annotations

import argparse
import re

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from decoding.methods.ar import AR, ARConfig
from decoding.drafting.drafter import DrafterConfig
from decoding.methods.sd import SDConfig, SpeculativeDecoding
from decoding.methods.spec_cascade import SpecCascadeConfig, SpeculativeCascade
from decoding.engine.target import TargetModel
from decoding.methods.via_sd import VIASD, VIASDConfig
from pipeline.generation import GenerationSettings, generate_example
from pipeline.models import load_model, stop_token_ids
from pipeline.schema import register_configs
from pipeline.summary import totals
from pipeline.tasks import aggregate_quality, load_examples


def methods(args):
    """sd, the cascades and via_sd share one drafter (--drafter); the other kinds run as sd[...]."""
    head = args.exit_head or f"drafters/{args.model}/exit_head_k{args.exit_layer}"
    kinds = {"early_exit": DrafterConfig(exit_layer=args.exit_layer, gamma=args.gamma),
             "exit_head": DrafterConfig(name="exit_head", exit_layer=args.exit_layer, head=head, gamma=args.gamma),
             "slim": DrafterConfig(name="slim", kind="slim", mask=args.drafter_mask or args.mask, gamma=args.gamma)}
    if args.drafter != "exit_head" and not args.exit_head:  # the head row only when asked for
        del kinds["exit_head"]
    drafter = kinds.pop(args.drafter)
    out = [("ar", AR(ARConfig())), ("sd", SpeculativeDecoding(SDConfig(), drafter=drafter))]
    out += [(f"sd[{name}]", SpeculativeDecoding(SDConfig(), drafter=other)) for name, other in kinds.items()]
    for alpha in args.alphas:
        out.append((f"cascade[{args.rule},a={alpha:g}]",
                    SpeculativeCascade(SpecCascadeConfig(rule=args.rule, alpha=alpha), drafter=drafter)))
    via = dict(mask=args.mask, agree_threshold=args.agree, slim_threshold=args.slim)
    out.append(("via_sd", VIASD(VIASDConfig(**via), drafter=drafter)))
    if args.ablation:
        out.append(("via_sd[random]", VIASD(VIASDConfig(middle="random", **via), drafter=drafter)))
    for mask in args.compare_masks:  # via_sd with other slim verifiers, same drafter and thresholds
        out.append((f"via_sd[{mask}]", VIASD(VIASDConfig(**{**via, "mask": mask}), drafter=drafter)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", nargs="+", default=["gsm8k", "humaneval", "mt_bench"])
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--exit-layer", type=int, default=6)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--drafter", choices=["early_exit", "exit_head", "slim"], default="early_exit",
                    help="the drafter of sd, the cascades and via_sd")
    ap.add_argument("--exit-head", default=None, help="exit_head's checkpoint (default: "
                    "drafters/<model>/exit_head_k<exit-layer>, written by python -m pipeline.train drafter=exit_head)")
    ap.add_argument("--mask", default="smollm2-135m-dimr", help="via_sd's routing mask (its slim verifier)")
    ap.add_argument("--drafter-mask", default=None, help="the slim drafter's mask (default: --mask)")
    ap.add_argument("--rule", default="opt")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.2, 0.5])
    ap.add_argument("--agree", type=float, default=0.7)
    ap.add_argument("--slim", type=float, default=0.5)
    ap.add_argument("--ablation", action="store_true", help="also run via_sd with a random mask")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--dtype", default=None, help="model.dtype (default: the model config's, auto = bf16 where native)")
    ap.add_argument("--compare-masks", nargs="*", default=[], help="extra via_sd rows with these routing masks")
    ap.add_argument("--only", default="", help="comma-separated rows to run (e.g. ar,sd,via_sd; ar, --ablation and "
                    "--compare-masks rows always run); default: all")
    args = ap.parse_args()

    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        rc = OmegaConf.to_object(compose("config", overrides=[f"model={args.model}"] +
                                          ([f"model.dtype={args.dtype}"] if args.dtype else [])))
    model, tokenizer = load_model(rc.model)
    target = TargetModel(model, tokenizer)
    runs = methods(args)
    if args.only:
        keep = set(re.split(r",(?![^\[]*\])", args.only))  # commas inside cascade[opt,a=0.05] stay
        runs = [(name, m) for name, m in runs if name in keep or name == "ar" or name.startswith("via_sd[")]
    for _, m in runs:
        m.setup(target)
    print(f"model={args.model} threads={torch.get_num_threads()} prompts/task={args.prompts} "
          f"max_new_tokens={args.max_new_tokens} T={args.temperature} drafter={args.drafter} "
          f"(early exit k={args.exit_layer}, slim mask {args.drafter_mask or args.mask}) gamma={args.gamma} "
          f"via_sd mask={args.mask}")
    for task_name in args.tasks:
        with initialize_config_module(config_module="conf", version_base="1.3"):
            task = OmegaConf.to_object(compose("config", overrides=[f"task={task_name}",
                                                                    f"task.limit={args.prompts}"])).task
        examples = load_examples(task)
        settings = GenerationSettings(args.max_new_tokens, args.temperature, 0, stop_token_ids(model, tokenizer),
                                      chat_template_kwargs=dict(rc.model.chat_template_kwargs))
        rows = {name: [] for name, _ in runs}
        for ex in examples:  # methods interleaved per prompt, so machine load hits all of them alike
            for name, method in runs:
                rows[name].append(generate_example(method, target, task, ex, settings))
        ar_tps = totals(rows["ar"])["tokens_per_s"]
        print(f"\n[{task_name}] {len(examples)} prompts")
        # full/tok: full-target forwards per token; cost/tok: every target pass cost-weighted (a slim pass over k
        # of L layers counts k/L), plus a self-speculative drafter's own layers in the same units
        print(f"{'method':24s} {'tok/s':>6s} {'speedup':>7s} {'tau':>5s} {'reject':>6s} {'full/tok':>8s} {'cost/tok':>8s} "
              f"{'direct/slim/full':>17s} quality")
        for name, _ in runs:
            t = totals(rows[name])
            q = aggregate_quality(task_name, examples, [r["outputs"] for r in rows[name]], [r["quality"] for r in rows[name]])
            e, n = t["extra"], max(t["new_tokens"], 1)
            tiers = (f"{e.get('settled_direct', 0) / n:.2f}/{e.get('settled_slim', 0) / n:.2f}/"
                     f"{e.get('settled_full', 0) / n:.2f}") if "slim_forwards" in e or "middle_forwards" in e else "-"
            rej = "-" if t["rejection_rate"] is None else f"{t['rejection_rate']:.2f}"
            qual = {k: round(v, 3) for k, v in q.items() if isinstance(v, (int, float))} if q else {}
            full = t["target_forwards"] - e.get("slim_forwards", 0)
            cost = t["target_forward_cost"] + e.get("drafter_forward_cost", 0)
            print(f"{name:24s} {t['tokens_per_s']:6.2f} {t['tokens_per_s'] / ar_tps:7.2f} {t['tau']:5.2f} {rej:>6s} "
                  f"{full / n:8.2f} {cost / n:8.2f} {tiers:>17s} {qual}")


if __name__ == "__main__":
    main()
