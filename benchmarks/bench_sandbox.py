"""What isolation costs per generated program: the same programs run unisolated (`unsafe`, the limits
only) and under bubblewrap, interleaved (unsafe, bwrap, unsafe, ...) so the machine's drift hits both;
prints the median wall time of each and the difference per program.

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
    times: dict[str, list[float]] = {"unsafe": [], "bwrap": []}
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
    print(f"isolation overhead: {median['bwrap'] - median['unsafe']:.1f} ms/program (bwrap - unsafe, medians)")


if __name__ == "__main__":
    main()
