"""The Domino correction chain alone, eager against `method.compile=true` (torch.compile) and, on CUDA, against
its CUDA-graph replay (`method.cuda_graph`), on the host-overhead benchmark's tiny random model (pipeline/zoo.py)
or the Qwen3-1.7B shape: ms per chain (`decoding.methods.domino.chain_picks` over one round's corrected
positions), best of `--repeats` batches, at T = 0 and T = 1, and whether each picks the eager chain's tokens.

    python benchmarks/bench_domino_chain.py [--shape tiny] [--device cpu] [--calls 300] [--repeats 5]

Last line: `domino chain: eager <ms> ms, compiled <ms> ms (T=1)`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from decoding.engine.transfer import synchronize


def best_ms(fn, args, calls: int, repeats: int, device) -> float:
    fn(*args)
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        synchronize(device)
        times.append((time.perf_counter() - t0) / calls * 1000)
    return min(times)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from decoding.engine.compiled import maybe_compiled
    from decoding.engine.sampling import Sampler
    from decoding.engine.cuda_graph import GraphReplayer
    from decoding.methods.domino import chain_picks, graphed_chain
    from pipeline.zoo import build_method, random_target

    folder = tempfile.mkdtemp(prefix="domino_chain_")
    os.environ.setdefault("SPECDEC_CACHE", folder)
    target = random_target(args.shape, dtype=getattr(torch, args.dtype), device=args.device)
    method = build_method("domino", target, folder, args.shape)
    head, device, spec = method.head, torch.device(args.device), method.drafter.spec
    vocab, prefix = target.config.vocab_size, spec.pure_draft_prefix_len
    corrected = spec.block_size - prefix  # as Domino: with shift_label every block row is a draft position
    # as Domino.propose: a pool only when it is narrower than the vocabulary
    pool_size = method.config.candidate_pool if 0 < method.config.candidate_pool < vocab else vocab
    gen = torch.Generator(device=device).manual_seed(0)
    pool = torch.randperm(vocab, generator=gen, device=device)[:pool_size] if pool_size < vocab else None
    z_proj = torch.randn(corrected, head.w2.shape[1], generator=gen, device=device)
    base_rows = torch.randn(corrected, pool_size, generator=gen, device=device)
    first = torch.randint(3, vocab, (prefix + 1,), generator=gen, device=device)  # root + uncorrected prefix
    table, w2 = head.input_table(method.embed), head.w2  # the pool's rows are gathered inside the chain
    compiled = maybe_compiled(chain_picks, True, "method.compile")
    print(f"{args.shape} random model, {args.device}, {args.dtype} drafter, head in fp32, threads={torch.get_num_threads()}: "
          f"{corrected} corrected positions over {'a ' + str(pool_size) + '-token pool' if pool is not None else 'the ' + str(vocab) + '-token vocabulary'}, "
          f"GRU {head.w_hh_t.shape[0]}")
    for temperature in (0.0, 1.0):
        noise = temperature * Sampler(0, device).gumbel((corrected, pool_size)) if temperature > 0 else None
        inputs = (table, head.w_next_t, w2, z_proj, base_rows, noise, first, pool)
        t0 = time.perf_counter()
        same = torch.equal(compiled(*inputs)[0], chain_picks(*inputs)[0])
        compile_s = time.perf_counter() - t0
        eager = best_ms(chain_picks, inputs, args.calls, args.repeats, device)
        fast = best_ms(compiled, inputs, args.calls, args.repeats, device)
        graph = ""
        if device.type == "cuda":  # the replay includes copying the round's inputs into the graph's buffers
            graphed = graphed_chain(GraphReplayer(True, "method.cuda_graph"))
            graph_same = torch.equal(graphed(*inputs)[0], chain_picks(*inputs)[0])
            graph = f", graph {best_ms(graphed, inputs, args.calls, args.repeats, device):.3f} ms (same tokens: {graph_same})"
        print(f"T={temperature:g}: eager {eager:.3f} ms, compiled {fast:.3f} ms ({eager / fast:.1f}x), "
              f"same tokens: {same}, first call with compilation {compile_s:.1f} s{graph}")
    print(f"domino chain: eager {eager:.3f} ms, compiled {fast:.3f} ms (T=1)")


if __name__ == "__main__":
    main()
