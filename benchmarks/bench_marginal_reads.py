"""What a CaDDTree round costs the host when its trees reach the 1024-node cap (a flat verify-cost curve, as on
the H200 of docs/gpu-bf16.md) on Qwen3's 152k vocabulary: the node-by-node heap (`build_best_first` over
`marginal_expand`, as CaDDTree built its trees until 2026-12-05) against the depth-by-depth build
(`build_marginal_tree`, now), each reading first the ranks (and, depth by depth, building first the nodes)
the last round needed. `same scores`: rounds whose trees score the same at every rank of the best-first
order as the heap's (bf16 logits tie often, and the two break ties differently).

    python benchmarks/bench_marginal_reads.py [--vocab 151936] [--cap 1024]
    python benchmarks/bench_marginal_reads.py --small      # where the heap is cheaper: HEAP_NODES

Per distribution sharpness (logits = N(0, 1) x scale, in bf16 as a drafter's): the tree's size and ranks read,
and the median ms per round over rounds 2-8 of 8, each builder fed the same rounds. On a CPU the
full-vocabulary log-softmax and top-k are part of it (`vocab ms`: that part alone; on a GPU it is device work).

`--small`: fixed budgets of 16-1024 nodes on a 512-token vocabulary over 15 depths (DDTree's shape on the tiny
model), median ms of the heap and of the depth-by-depth build (forced), and of the tree's ancestor mask row by
row and level by level (`decoding/engine/tree.py`).
"""

import argparse
import time

import torch

from decoding.drafting import marginal_tree
from decoding.engine.tree import ancestors_by_levels, ancestors_by_rows

from decoding.drafting.draft_tree import build_best_first, first_read_after, marginal_expand
from decoding.drafting.marginal_tree import build_marginal_tree
from decoding.drafting.verify_cost import CostAwareStop, VerifyCostModel

DEPTHS = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    if args.small:
        return small_trees()
    cap = args.cap
    flat = VerifyCostModel(node_counts=[0, cap], context_lengths=[64], fitted=[[0.03, 0.0300001]], draft_s=0.005)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print("| scale | nodes | ranks read | builder | build ms | vocab ms | same scores |")
    print("|---|---|---|---|---|---|---|")
    for scale in (3.0, 6.0, 10.0):
        rounds = [(torch.randn(DEPTHS, args.vocab, generator=gen) * scale).to(torch.bfloat16).float()
                  for _ in range(8)]
        trees = {}
        for builder in ("heap", "depth by depth"):
            ranks = nodes = 0
            times, trees[builder] = [], []
            for logits in rounds:
                t0 = time.perf_counter()
                if builder == "heap":
                    built = build_best_first(1, marginal_expand(logits, cap, first_read=first_read_after(ranks)),
                                             cap, DEPTHS, admit=CostAwareStop(flat, 64))
                else:
                    built = build_marginal_tree(1, logits, cap, cap, CostAwareStop(flat, 64),
                                                first_read=first_read_after(ranks), first_nodes=first_read_after(nodes))
                times.append(time.perf_counter() - t0)
                ranks, nodes = built.ranks_read, built.tree.num_draft_nodes()
                trees[builder].append(built.scores)
            vocab = []
            for _ in range(7):
                t0 = time.perf_counter()
                torch.topk(torch.log_softmax(rounds[-1], -1), min(cap, first_read_after(ranks)), dim=-1)
                vocab.append(time.perf_counter() - t0)
            median = sorted(times[1:])[len(times[1:]) // 2]
            # bf16 logits tie often: the builders may then pick different nodes of equal score, so the check is
            # that every rank of the best-first order scores the same
            same = sum(len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 1e-6
                       for a, b in zip(trees[builder], trees["heap"]))
            print(f"| {scale:g} | {nodes} | {ranks} | {builder} | {1000 * median:.2f} | "
                  f"{1000 * sorted(vocab)[3]:.2f} | {same}/{len(rounds)} |", flush=True)


def median_ms(fn, repeats: int = 41) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[repeats // 2]


def small_trees() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print("| scale | budget | tree depth | heap ms | depth by depth ms | mask by rows ms | mask by levels ms |")
    print("|---|---|---|---|---|---|---|")
    for scale in (1.0, 5.0):
        logits = torch.randn(15, 512, generator=gen) * scale
        for budget in (16, 32, 64, 128, 1024):
            heap = median_ms(lambda: build_best_first(1, marginal_expand(logits, budget, budget), budget, 15))
            saved, marginal_tree.HEAP_NODES = marginal_tree.HEAP_NODES, 0  # force the depth-by-depth build
            try:
                arrays = median_ms(lambda: build_marginal_tree(1, logits, budget, budget, first_read=budget))
            finally:
                marginal_tree.HEAP_NODES = saved
            tree = build_marginal_tree(1, logits, budget, budget, first_read=budget).tree
            rows = median_ms(lambda: ancestors_by_rows(tree.parents))
            levels = median_ms(lambda: ancestors_by_levels(tree.parents))
            print(f"| {scale:g} | {budget} | {max(tree.depths)} | {heap:.3f} | {arrays:.3f} | {rows:.3f} | "
                  f"{levels:.3f} |", flush=True)


if __name__ == "__main__":
    main()
