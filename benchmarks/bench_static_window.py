"""The static forward (`model.cuda_graph`, decoding/engine/static_forward.py) against the eager one on a model with
sliding-window layers, after a long prefill: what a replayed block costs where the static KV buffer holds far more
keys than a sliding layer's window. On a CPU the replay is emulated (the same padded rows, masks, slot writes and
key reads, run eagerly), so the times are the forwards' arithmetic and memory traffic, not a GPU's launches.

    python benchmarks/bench_static_window.py [--model gemma3-270m] [--context 8192] [--rows 1,16] [--repeats 5]
    python benchmarks/bench_static_window.py --model tiny --device cuda --dtype bfloat16   # real graphs on a GPU

Per block size: ms per forward, eager and static (CPU time of the process on a CPU, wall time on a GPU), their
ratio, and the largest logit difference. Forwards alternate eager / static, `--repeats` times each, every one
from the same prefix (the block's rows are cut off again after each). To compare two versions of the engine, run
this file with `PYTHONPATH` set to each checkout.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

import decoding
from decoding.engine.cuda_graph import GraphReplayer
from decoding.engine.target import TargetModel
from decoding.engine.transfer import synchronize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m", help="a model config name, or `tiny` (a random Gemma 3)")
    ap.add_argument("--context", type=int, default=8192, help="prefilled tokens before the timed blocks")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", help="the model's dtype (a named model: its model.dtype)")
    ap.add_argument("--device", default="cpu", help="the tiny model's device (a named model: its config's)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("SPECDEC_CACHE", tempfile.mkdtemp(prefix="static_window_"))
    if args.model == "tiny":
        from pipeline.zoo import random_target

        model = random_target("tiny", getattr(torch, args.dtype), args.device, arch="gemma3").model
    else:
        from bench_engine import load  # this folder is on the path when a script here runs

        model, _, _ = load(args.model, "mt_bench", 1, (f"model.dtype={args.dtype}",))
    eager = TargetModel(model)
    on_gpu = eager.device.type == "cuda"
    static = TargetModel(model, graphs=GraphReplayer(True, "model.cuda_graph", emulate=not on_gpu))
    clock = time.perf_counter if on_gpu else time.process_time
    window = getattr(model.config, "sliding_window", None)
    vocab = model.config.vocab_size
    prompt = torch.randint(100, vocab - 100, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    for target in (eager, static):
        target.prefill(prompt, rows_expected=args.context + 64)
    prefix = static.cache_len
    print(f"{args.model} ({type(model).__name__}, {eager.dtype}, sliding window {window}), {eager.device}, "
          f"threads={torch.get_num_threads()}, context {args.context}, static buffer capacity "
          f"{static._static_buffer.capacity} rows, {args.repeats} forwards each; engine: "
          f"{os.path.dirname(os.path.dirname(decoding.__file__))}")
    print(f"{'rows':>5s} {'eager ms':>10s} {'static ms':>10s} {'static/eager':>13s} {'max |logit diff|':>17s}")
    for rows in (int(r) for r in args.rows.split(",")):
        tokens, depths = prompt[-rows:], list(range(rows))
        seconds = {"eager": 0.0, "static": 0.0}
        outputs = {}
        for repeat in range(args.repeats + 1):  # the first round warms up (and captures the graph)
            for name, target in (("eager", eager), ("static", static)):
                synchronize(target.device)
                start = clock()
                outputs[name] = target.forward(tokens, depths, None).logits
                synchronize(target.device)
                if repeat:
                    seconds[name] += clock() - start
                target.truncate(prefix)
        gap = float((outputs["static"] - outputs["eager"]).abs().max())
        eager_ms, static_ms = (1000 * seconds[k] / args.repeats for k in ("eager", "static"))
        print(f"{rows:5d} {eager_ms:10.1f} {static_ms:10.1f} {static_ms / eager_ms:13.2f} {gap:17.2e}")
    print(f"graphs replayed: {', '.join(sorted(static.graphs.graphs))}")  # none: the static forwards ran eagerly


if __name__ == "__main__":
    main()
