"""Host ms per decoding step, split into its parts: `propose` and `verify` + `observe`, each outside the
networks' passes, on the zoo's tiny random model (as bench_host_overhead.py, one thread, CPU time). Runs the
steps of a long answer several times over and prints each round, so that a change of a tenth of a millisecond
in one part shows through a shared machine's noise; compare two checkouts by alternating them:

    for rev in /tmp/old /work/main; do PYTHONPATH=$rev python benchmarks/bench_step_parts.py; done

For methods that run the engine's step (propose, then one verification forward: every method but VIA-SD and
speculative cascades, which override `step` and are refused). A drafter's passes inside `propose` are passes,
not host work.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from decoding.engine.loop import Method, generate, verify
from pipeline.step_probes import ForwardTimer
from pipeline.zoo import METHODS, build_method, mixed_prompts, random_target


def step_parts(method, target, prompt: list[int], max_new_tokens: int, temperature: float) -> tuple[float, float, int]:
    """(propose ms, verify + observe ms) per step outside the passes, and the steps measured: one `generate`
    (its prefill and setup), each step but the first run as the engine's step with clocks between its parts."""
    timer = ForwardTimer(target.device)
    total = {"propose": 0.0, "rest": 0.0, "steps": 0}

    def timed_step(state):
        if state.stats.num_steps == 0:  # the first step (warm-up of the method's own state) is not measured
            return Method.step(method, state)
        f0, t0 = timer.forward_s, timer.clock()
        proposal = method.propose(state)
        f1, t1 = timer.forward_s, timer.clock()
        method.observe(state, verify(state, proposal))
        total["propose"] += (t1 - t0) - (f1 - f0)
        total["rest"] += (timer.clock() - t1) - (timer.forward_s - f1)
        total["steps"] += 1

    method.step = timed_step  # this instance only
    try:
        with timer:
            generate(method, target, prompt, max_new_tokens=max_new_tokens, temperature=temperature)
    finally:
        del method.step
    steps = max(total["steps"], 1)
    return 1000 * total["propose"] / steps, 1000 * total["rest"] / steps, total["steps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="lookahead,self_draft,ptd")
    ap.add_argument("--max-new-tokens", type=int, default=120, help="one prompt's answer per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    names = [m for m in args.methods.split(",") if m]
    unknown = [m for m in names if m not in METHODS]
    if unknown or args.max_new_tokens < 2 or args.rounds < 1:
        ap.error(f"unknown method '{unknown[0]}' (known: {', '.join(METHODS)})" if unknown
                 else "--max-new-tokens needs at least 2 and --rounds at least 1")
    torch.set_num_threads(1)
    folder = tempfile.mkdtemp(prefix="step_parts_")
    os.environ.setdefault("SPECDEC_CACHE", folder)
    target = random_target("tiny", dtype=torch.float32, device="cpu", num_layers=6)
    prompt = mixed_prompts(1, 500)[0]
    methods = {}
    for name in names:
        method = build_method(name, target, folder)
        if type(method).step is not Method.step:  # its parts are its own
            ap.error(f"{name} overrides the engine's step: its parts are not propose / verify / observe")
        methods[name] = method
    print(f"tiny random Qwen3, fp32, cpu, threads=1, T={args.temperature:g}, {args.max_new_tokens} new tokens per round; "
          "host ms per step outside the passes")
    for r in range(args.rounds):
        cells = []
        for name, method in methods.items():
            propose_ms, rest_ms, n = step_parts(method, target, prompt, args.max_new_tokens, args.temperature)
            cells.append(f"{name}: propose {propose_ms:.3f} verify+observe {rest_ms:.3f} ({n} steps)")
        print(f"round {r + 1}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
