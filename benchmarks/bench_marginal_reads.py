"""What CaDDTree's first read of ranks costs when its trees reach the 1024-node cap (a flat verify-cost curve,
as on the H200 of docs/gpu-bf16.md) on Qwen3's 152k vocabulary: the marginal children of 16 depths read with
`first_read` = the last tree's node count (before 2026-12-04) against the ranks the last tree looked at.

    python benchmarks/bench_marginal_reads.py

Per distribution sharpness (logits = N(0, 1) x scale, in bf16 as a drafter's): the tree's ranks read, and the
median ms of `marginal_expand` + `build_best_first` (+ CaDDTree's stop rule) over rounds 2-8 of 8, each policy
fed the same rounds. On a CPU the full-vocabulary log-softmax and top-k are part of it (on a GPU they are
device work); `to_host ms` is the host conversion of the last round's first read alone (median of 21), the
part a GPU pays on the host too.
"""

import time

import torch

from decoding.drafting.draft_tree import FIRST_READ, build_best_first, first_read_after, marginal_expand
from decoding.drafting.verify_cost import CostAwareStop, VerifyCostModel
from decoding.engine.transfer import to_host

VOCAB, DEPTHS, CAP = 151936, 16, 1024
FLAT = VerifyCostModel(node_counts=[0, CAP], context_lengths=[64], fitted=[[0.03, 0.0300001]], draft_s=0.005)


def main() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print("| scale | nodes | ranks read | policy | first read | build ms | to_host ms |")
    print("|---|---|---|---|---|---|---|")
    for scale in (3.0, 6.0, 10.0):
        rounds = [(torch.randn(DEPTHS, VOCAB, generator=gen) * scale).to(torch.bfloat16).float() for _ in range(8)]
        for policy in ("last nodes", "last ranks"):
            last, times, reads = 0, [], []
            for logits in rounds:
                # before 2026-12-04: twice the last tree's node count; now: first_read_after its ranks read
                first = max(FIRST_READ, 2 * last) if policy == "last nodes" else first_read_after(last)
                t0 = time.perf_counter()
                built = build_best_first(1, marginal_expand(logits, CAP, first_read=first), CAP, DEPTHS,
                                         admit=CostAwareStop(FLAT, 64))
                times.append(time.perf_counter() - t0)
                reads.append(min(first, CAP))
                last = built.tree.num_draft_nodes() if policy == "last nodes" else built.ranks_read
            values, ids = torch.topk(torch.log_softmax(rounds[-1], -1), reads[-1], dim=-1)
            conversions = []
            for _ in range(21):
                t0 = time.perf_counter()
                to_host(values, ids)
                conversions.append(time.perf_counter() - t0)
            convert = sorted(conversions)[10]
            median = sorted(times[1:])[len(times[1:]) // 2]
            print(f"| {scale:g} | {built.tree.num_draft_nodes()} | {built.ranks_read} | {policy} | {reads[-1]} | "
                  f"{1000 * median:.2f} | {1000 * convert:.2f} |", flush=True)


if __name__ == "__main__":
    main()
