"""The engine's shared KV buffer (decoding/engine/kv_cache.py) against transformers' plain DynamicCache:
the same methods on the same model and prompts, decoding with one cache and then the other, the order
alternating per prompt and repeat, so that a shared machine's drift hits both alike. Prints, per method,
the time of each (the process's CPU time on a CPU, wall time on a GPU), their ratio and whether the
outputs are equal (they must be: the buffer holds the same keys and values).

    python benchmarks/bench_kv_cache.py [--model tiny --layers 36 | --model smollm2-135m] [--methods ar,ddtree]
        [--prompts 4] [--max-new-tokens 64] [--repeats 3]

`--model tiny`: a random Qwen3 (hidden 64, vocab 512; `--layers` deep), fp32: the host's share shows.
Any other name: that model config as `python -m pipeline model=<name>` loads it (its dtype: bf16 on a
CPU with native bf16), with MT-Bench prompts. Drafters are random (pipeline/zoo.py): the tree methods
draft what a real drafter would cost, not what it would accept.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from decoding.engine.loop import generate
from decoding.engine.target import TargetModel
from decoding.engine.transfer import synchronize
from pipeline.zoo import build_method, mixed_prompts, random_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--methods", default="ar,ddtree")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = tempfile.mkdtemp(prefix="kv_cache_")
    os.environ.setdefault("SPECDEC_CACHE", folder)
    if args.model == "tiny":
        model, tokenizer = random_target("tiny", num_layers=args.layers).model, None
        prompts = mixed_prompts(args.prompts, 500)
        label = f"tiny random Qwen3, {args.layers} layers, fp32"
    else:
        from bench_engine import load  # this folder is on the path when a script here runs

        model, tokenizer, prompts = load(args.model, "mt_bench", args.prompts)
        label = f"{args.model}, {next(model.parameters()).dtype}, MT-Bench first turns"
    targets = {"dynamic": TargetModel(model, tokenizer, kv_buffer=False), "buffer": TargetModel(model, tokenizer)}
    device = targets["buffer"].device
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    print(f"{label}, {device}, threads={torch.get_num_threads()}, {len(prompts)} prompts x {args.max_new_tokens} "
          f"tokens x {args.repeats} repeats")
    print(f"{'method':10s} {'dynamic s':>10s} {'buffer s':>10s} {'buffer/dynamic':>15s} {'same tokens':>12s}")
    for name in args.methods.split(","):
        methods = {kind: build_method(name, target, folder) for kind, target in targets.items()}
        for kind, method in methods.items():  # warm-up
            generate(method, targets[kind], prompts[0], max_new_tokens=8)
        seconds, outputs = {"dynamic": 0.0, "buffer": 0.0}, {}
        for repeat in range(args.repeats):
            for i, prompt in enumerate(prompts):
                order = ("dynamic", "buffer") if (repeat + i) % 2 == 0 else ("buffer", "dynamic")
                for kind in order:
                    synchronize(device)
                    t0 = clock()
                    state = generate(methods[kind], targets[kind], prompt, max_new_tokens=args.max_new_tokens)
                    synchronize(device)
                    seconds[kind] += clock() - t0
                    outputs.setdefault((kind, i), state.new_tokens)
        same = all(outputs[("dynamic", i)] == outputs[("buffer", i)] for i in range(len(prompts)))
        print(f"{name:10s} {seconds['dynamic']:10.3f} {seconds['buffer']:10.3f} "
              f"{seconds['buffer'] / seconds['dynamic']:15.3f} {str(same):>12s}", flush=True)


if __name__ == "__main__":
    main()
