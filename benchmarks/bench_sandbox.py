"""What isolation costs per generated program: the same program run unisolated (`unsafe`, the limits
only), under bubblewrap and under the unshare tier (those that start here), interleaved (unsafe, bwrap,
unshare, unsafe, ...) so the machine's drift hits all; prints the median wall time of each and, last,
each tier's difference to unsafe per program.

    python benchmarks/bench_sandbox.py --runs 40
"""

from __future__ import annotations

import argparse
import statistics
import time

from pipeline.tasks import sandbox

# a small HumanEval-like program: a function and its checks
PROGRAM = """
def running_max(xs):
    out, best = [], None
    for x in xs:
        best = x if best is None or x > best else best
        out.append(best)
    return out

def check(f):
    assert f([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]
    assert f([]) == []

check(running_max)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="programs per isolation")
    args = ap.parse_args()
    times: dict[str, list[float]] = {"unsafe": []}
    for tier in ("bwrap", "unshare"):
        try:
            sandbox.configure(tier)
            times[tier] = []
        except sandbox.SandboxUnavailable as err:
            print(f"{tier}: skipped ({err})")
    for _ in range(args.runs):
        for isolation in times:
            sandbox.configure(isolation)
            t0 = time.perf_counter()
            result = sandbox.run_program(PROGRAM)
            times[isolation].append(time.perf_counter() - t0)
            assert result.passed, (isolation, result)
    sandbox.configure("auto")
    median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for isolation, ms in median.items():
        print(f"{isolation:7s} median {ms:7.1f} ms/program over {args.runs} programs")
    overheads = ", ".join(f"{k} {median[k] - median['unsafe']:+.1f}" for k in median if k != "unsafe")
    print(f"isolation overhead: {overheads} ms/program (minus unsafe, medians)")


if __name__ == "__main__":
    main()
