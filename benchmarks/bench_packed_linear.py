"""What packing the linear layers for oneDNN (`model.prepack_linear`, decoding/engine/packed_linear.py) does
on this CPU, in two parts:

1. every linear shape of the model: microseconds per call of `F.linear` and of the packed call at 1, 4 and 16
   rows, and whether their outputs are equal bit for bit;
2. decoding, with a packed and an unpacked copy of the model in one process, interleaved per prompt (each
   method runs unpacked then packed, or the other way round, alternating): tokens/s both ways, each method's
   speedup over AR with the same packing, and whether the packed run's tokens equal the unpacked run's.

    python benchmarks/bench_packed_linear.py --tasks gsm8k mt_bench --prompts 2 \\
        --methods ar "eagle3 total_tokens=16 depth=4 top_k=4" "eagle3 tree=false"
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from torch import nn


def time_call(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e6 * (time.perf_counter() - start) / repeats


def linear_table(model: nn.Module, repeats: int) -> None:
    from decoding.engine.packed_linear import PackedLinear

    shapes = {}
    for module in model.modules():
        if type(module) is nn.Linear:
            shapes.setdefault((module.out_features, module.in_features, module.weight.dtype), module)
    print(f"{'weight (out x in)':>20}  rows  F.linear us  packed us  ratio  equal")
    for (out_f, in_f, dtype), linear in shapes.items():
        packed = PackedLinear(linear)
        for rows in (1, 4, 16):
            x = torch.randn(rows, in_f, dtype=dtype)
            with torch.inference_mode():
                plain_us = time_call(lambda: F.linear(x, linear.weight, linear.bias), repeats)
                packed_us = time_call(lambda: packed(x), repeats)
                equal = torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))
            print(f"{f'{out_f} x {in_f}':>20}  {rows:>4}  {plain_us:>11.0f}  {packed_us:>9.0f}  "
                  f"{plain_us / packed_us:>5.2f}  {equal}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tasks", nargs="+", default=["gsm8k", "mt_bench"])
    ap.add_argument("--prompts", type=int, default=2, help="per task")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", nargs="+", default=["ar", "eagle3 total_tokens=16 depth=4 top_k=4",
                                                       "eagle3 tree=false"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200, help="calls per timing in part 1")
    ap.add_argument("--skip-decoding", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from hydra import compose, initialize_config_module

    from decoding.engine.loop import generate
    from decoding.engine.packed_linear import packing_available
    from pipeline.models import load_model, pack_for_decoding, stop_token_ids, target_model
    from pipeline.runner import build_method, compose_methods, to_run_config
    from pipeline.schema import register_configs
    from pipeline.tasks import build_chat
    from pipeline.tasks.loaders import load_task

    register_configs()
    overrides = [f"model={args.model}", f"model.dtype={args.dtype}", "model.prepack_linear=false"]
    with initialize_config_module(config_module="conf", version_base="1.3"):
        job = compose("config", overrides=overrides)
    rc = to_run_config(job)
    dtype = getattr(torch, args.dtype)
    if not packing_available(dtype):
        ap.error(f"this PyTorch build cannot pack {args.dtype} linear weights on this CPU")
    model, tokenizer = load_model(rc.model)
    print(f"{args.model}, {args.dtype}, cpu, threads={args.threads}; part 1: the model's linear shapes")
    linear_table(model, args.repeats)
    if args.skip_decoding:
        return

    plain = target_model(model, tokenizer, rc.model)
    packed = target_model(copy.deepcopy(model), tokenizer, rc.model)
    packed.packed_linears = pack_for_decoding(packed.model, True)
    method_cfgs, labels, drafter_cfgs = compose_methods(args.methods, job)
    built = {}
    for cfg, label, drafter in zip(method_cfgs, labels, drafter_cfgs):
        built[label] = {"plain": build_method(cfg, plain, drafter or rc.drafter),
                        "packed": build_method(cfg, packed, drafter or rc.drafter)}
    stops = stop_token_ids(model, tokenizer)
    prompts = []
    for task in args.tasks:
        with initialize_config_module(config_module="conf", version_base="1.3"):
            task_cfg = to_run_config(compose("config", overrides=[*overrides, f"task={task}",
                                                                  f"task.limit={args.prompts}"])).task
        examples, _ = load_task(task_cfg)
        prompts += [(task, build_chat(tokenizer, task_cfg, [(ex.turns[0], None)], rc.model.chat_template_kwargs))
                    for ex in examples]
    print(f"part 2: decoding, {len(prompts)} prompts ({', '.join(args.tasks)}), {args.max_new_tokens} new tokens, "
          f"T=0, unpacked / packed interleaved per prompt")
    for methods in built.values():  # warm-up
        for which in ("plain", "packed"):
            generate(methods[which], plain if which == "plain" else packed, prompts[0][1], max_new_tokens=8)
    wall = {(label, which): 0.0 for label in built for which in ("plain", "packed")}
    tokens = dict.fromkeys(wall, 0)
    same = dict.fromkeys(built, 0)
    for index, (task, prompt) in enumerate(prompts):
        for label, methods in built.items():
            outputs = {}
            for which in (("plain", "packed") if index % 2 == 0 else ("packed", "plain")):
                start = time.perf_counter()
                state = generate(methods[which], plain if which == "plain" else packed, prompt,
                                 max_new_tokens=args.max_new_tokens, stop_ids=stops)
                wall[label, which] += time.perf_counter() - start
                tokens[label, which] += len(state.new_tokens)
                outputs[which] = list(state.new_tokens)
            same[label] += outputs["plain"] == outputs["packed"]
        print(f"  prompt {index + 1}/{len(prompts)} ({task}) done", flush=True)
    ar = labels[0]  # compose_methods puts AR first
    print(f"{'method':<45} {'tok/s unpacked':>14} {'tok/s packed':>12} {'packed / unpacked':>17} "
          f"{'speedup unpacked':>16} {'speedup packed':>14} {'same tokens':>11}")
    for label in built:
        rate = {w: tokens[label, w] / wall[label, w] for w in ("plain", "packed")}
        ar_rate = {w: tokens[ar, w] / wall[ar, w] for w in ("plain", "packed")}
        print(f"{label:<45} {rate['plain']:>14.1f} {rate['packed']:>12.1f} {rate['packed'] / rate['plain']:>16.2f}x "
              f"{rate['plain'] / ar_rate['plain']:>15.2f}x {rate['packed'] / ar_rate['packed']:>13.2f}x "
              f"{same[label]:>6}/{len(prompts)}")


if __name__ == "__main__":
    main()
