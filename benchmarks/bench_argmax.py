"""`x.argmax(-1)` against `row_argmax(x)` (decoding/engine/argmax.py) on a CPU: the greedy check of a
verification block (rows x vocabulary) and of one AR row, fp32 and bf16, median of `--repeats` timings of
`--calls` calls each; both give the same indices (checked on every shape).

    python benchmarks/bench_argmax.py [--threads 1] [--vocab 49152,151936] [--rows 1,16,40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from decoding.engine.argmax import row_argmax


def per_call_us(fn, calls: int, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return 1e6 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", default="49152,151936")
    ap.add_argument("--rows", default="1,16,40")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={torch.get_num_threads()}, median of {args.repeats} x {args.calls} calls, microseconds per call")
    print(f"{'dtype':9s} {'rows':>5s} {'vocab':>7s} {'argmax':>9s} {'row_argmax':>10s} {'ratio':>6s}")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for vocab in (int(v) for v in args.vocab.split(",")):
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, vocab, generator=gen).to(dtype)
                if not torch.equal(row_argmax(x), x.argmax(-1)):
                    raise SystemExit(f"row_argmax differs from argmax on {rows} x {vocab} {dtype}")
                plain = per_call_us(lambda: x.argmax(-1), args.calls, args.repeats)
                blocked = per_call_us(lambda: row_argmax(x), args.calls, args.repeats)
                print(f"{str(dtype).split('.')[-1]:9s} {rows:5d} {vocab:7d} {plain:9.1f} {blocked:10.1f} "
                      f"{plain / blocked:6.2f}", flush=True)


if __name__ == "__main__":
    main()
