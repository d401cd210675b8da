"""The margins behind the near-tie diagnosis of finished runs: every mismatch the runs' summaries
diagnosed (summary.json `mismatch_diagnosis`: AR's logit margin at the first difference,
decoding/engine/ties.py), summarised over all methods and tasks: min / median / max, the tolerance
range, and how often the recomputed AR logits prefer the method's token.

    python -m pipeline -m +experiment=bench_endogenous && python benchmarks/tie_margins.py outputs/multirun/<date>/<time>
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="run or sweep dirs (every summary.json under them)")
    args = ap.parse_args()
    found, dtypes = [], set()
    for folder in args.dirs:
        for path in sorted(folder.rglob("summary.json")):
            summary = json.loads(path.read_text())
            dtypes.add(summary.get("dtype"))
            found += summary.get("mismatch_diagnosis") or []
    margins = [d["margin"] for d in found]
    tolerances = [d["tolerance"] for d in found]
    print(f"dtype={','.join(sorted(map(str, dtypes)))} mismatches={len(found)} "
          f"kinds={dict(collections.Counter(d['kind'] for d in found))}")
    if found:
        print(f"margin: min {min(margins):.3f}, median {statistics.median(margins):.3f}, max {max(margins):.3f}; "
              f"tolerance {min(tolerances):.3f}-{max(tolerances):.3f}")
        prefer = sum(d["ar_top"] == d["method_token"] for d in found)
        print(f"recomputed AR logits prefer the method's token in {prefer} of {len(found)}")


if __name__ == "__main__":
    main()
