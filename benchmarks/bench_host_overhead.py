"""Host overhead per decoding step, per method: the time a step spends outside the networks'
forwards (wall minus forwards: the engine's and the method's Python and small tensor work), on a
tiny random Qwen3-shaped model whose forward takes a few milliseconds, so that the host work
is what shows. Every method at its default settings (pipeline/zoo.py), at T=0 and T=1, prompts
that mix repeated text (drafts get accepted) and random tokens (drafts get rejected).

Goal: <= 0.5 ms per step for every method (on a GPU the forward of a big model is tens of ms, but
the host work of a step is serial with it unless it is this small).

    python benchmarks/bench_host_overhead.py [--methods ar,pld,ptd] [--compiled domino] [--prompts 4] [--layers 36]
        [--max-new-tokens 64]
    python benchmarks/bench_host_overhead.py --model smollm2-135m --methods ar,ddtree,dominotree --compiled ""
    python benchmarks/bench_host_overhead.py --methods caddtree --flat-cost --compiled ""

`--model NAME`: that model config instead (as `python -m pipeline model=NAME` loads it), MT-Bench first turns,
and the model's own drafters (`model.drafters`) for the methods that take one: the host work that grows with a
real vocabulary (top-k, softmax, running sums over 49k-152k entries), which is device work on a GPU. Methods
without a drafter field keep the random drafters of pipeline/zoo.py.

`--flat-cost`: CaDDTree and cost-aware DominoTree with a flat verify-cost curve (a GPU's): their trees reach the cap.

`--compiled` (default domino): methods also measured with method.compile=true (their rows say
"compiled"; not in the worst line, which is about the defaults). `--count-ops`: a last column with the
torch calls per step outside the network passes, counted in a second run (load-independent).
`--repeats N`: each row is the run with the least host time of N (other jobs on the machine only add time, so
the minimum is the steadier figure where the cores are shared).

Last line: `worst host overhead: <method> <ms> ms/step`.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from pipeline.step_probes import host_overhead
from pipeline.zoo import METHODS, build_method, mixed_prompts, random_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # the reference DominoTree builder is a test oracle, not a setting anyone runs: not in the default list
    ap.add_argument("--methods", default=",".join(m for m in METHODS if m != "dominotree_reference"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    # the tiny model's depth (6): the engine's per-layer cache work shows on deeper stacks (real models: 24-36)
    ap.add_argument("--layers", type=int, default=6)
    # also measured with method.compile=true (decoding/engine/compiled.py); each compiles once per temperature
    # branch (~30 s on a CPU core), and these rows are not the defaults the worst line is about
    ap.add_argument("--compiled", default="domino")
    # torch calls per step outside the passes (pipeline/step_probes.py HostOpCounter), from a second, untimed run:
    # a count that does not depend on the machine's load, where the times on a shared machine do
    ap.add_argument("--count-ops", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="runs per row; the row shows the one with the least host time")
    ap.add_argument("--model", default="tiny", help="tiny (random) or a model config name (its drafters)")
    # CaDDTree (and DominoTree budget=cond_adaptive) with a flat verify-cost curve, as profiled on an H200: the
    # stop rule then admits trees up to the cap (1024 nodes), the host work a GPU run of these methods meets
    ap.add_argument("--flat-cost", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: needs at least 1")
    check_method_names(ap, args.methods, args.compiled)
    torch.set_num_threads(args.threads)
    folder = tempfile.mkdtemp(prefix="host_overhead_")
    drafters = {}
    if args.model == "tiny":
        # the random model's CaDDTree cost profile is its own; a real model's cache is the pipeline's (its weights
        # materialised once, its cost profile the one `python -m pipeline` would use)
        os.environ.setdefault("SPECDEC_CACHE", folder)
        target = random_target("tiny", dtype=torch.float32, device=args.device, num_layers=args.layers)
        prompts = mixed_prompts(args.prompts, 500)
        print(f"tiny random Qwen3 ({args.layers} layers, hidden 64, vocab 512), fp32, {args.device}, "
              f"threads={torch.get_num_threads()}, {args.prompts} prompts x {args.max_new_tokens} tokens")
    else:
        target, prompts, drafters = real_target(args.model, args.prompts)
        print(f"{args.model} ({target.num_layers} layers, {target.dtype}), its drafters {sorted(drafters)}, "
              f"threads={torch.get_num_threads()}, {len(prompts)} MT-Bench prompts x {args.max_new_tokens} tokens")
    rows = []
    print(f"{'method':22s} {'T':>3s} {'steps':>6s} {'tok/step':>8s} {'wall ms':>8s} {'fwd ms':>8s} {'host ms':>8s}"
          + (f" {'host ops':>8s}" if args.count_ops else "") + (f" {'nodes':>6s}" if args.flat_cost else ""))
    runs = [(m, {}) for m in args.methods.split(",") if m]
    runs += [(m, {"compile": True}) for m in args.compiled.split(",") if m]
    for name, overrides in runs:
        method = build_method(name, target, folder, **drafter_override(name, drafters), **overrides)
        if args.flat_cost and getattr(method, "cost", None) is not None:
            method.cost = flat_cost_model(method.config.max_budget)
        label = name + (" compiled" if overrides else "")
        for temperature in (float(t) for t in args.temperatures.split(",")):
            # a shared machine only ever adds time: of several runs, the one with the least host time
            r = min((host_overhead(method, target, prompts, args.max_new_tokens, temperature)
                     for _ in range(args.repeats)), key=lambda run: run["host_ms"])
            if not overrides:
                rows.append((name, temperature, r))
            ops = f" {'–':>8s}" if args.count_ops else ""
            if args.count_ops and not overrides:  # a compiled region would be traced with the counter: not counted
                counted = host_overhead(method, target, prompts, args.max_new_tokens,
                                        temperature, count_ops=True)
                ops = f" {counted['host_ops']:8.1f}"
            print(f"{label:22s} {temperature:3g} {r['steps']:6d} {r['tokens_per_step']:8.2f} {r['wall_ms']:8.3f} "
                  f"{r['forward_ms']:8.3f} {r['host_ms']:8.3f}{ops}"
                  + (f" {r['draft_tokens_per_step']:6.1f}" if args.flat_cost else ""), flush=True)
    name, temperature, worst = max(rows, key=lambda row: row[2]["host_ms"])
    print(f"(worst at T={temperature:g}; goal <= 0.5 ms/step)")
    print(f"worst host overhead: {name} {worst['host_ms']:.3f} ms/step")


def check_method_names(ap: argparse.ArgumentParser, methods: str, compiled: str) -> None:
    """One error line for an unknown method, or a --compiled one whose config has no `compile` option."""
    from dataclasses import fields

    from decoding import method_configs
    from pipeline.zoo import BASE_METHOD

    unknown = [m for m in (methods + "," + compiled).split(",") if m and m not in METHODS]
    if unknown:
        ap.error(f"unknown method {unknown[0]!r}; known: {', '.join(METHODS)}")
    configs = method_configs()
    compilable = [m for m in METHODS if any(f.name == "compile" for f in fields(configs[BASE_METHOD.get(m, m)]))]
    for name in (m for m in compiled.split(",") if m):
        if name not in compilable:
            ap.error(f"--compiled {name}: its config has no compile option; methods with one: {', '.join(compilable)}")


def flat_cost_model(max_budget: int):
    """A verify cost that does not grow with the tree (30 ms for 0..max_budget nodes) and a 5 ms drafting pass."""
    from decoding.drafting.verify_cost import VerifyCostModel

    return VerifyCostModel(node_counts=[0, max_budget], context_lengths=[64], fitted=[[0.03, 0.03]], draft_s=0.005)


def real_target(name: str, limit: int):
    """The model config `name` as the pipeline loads it, its MT-Bench first turns and its drafters by kind
    (shipped paths resolved under pipeline/assets)."""
    from bench_engine import compose_run, load  # this folder is on the path when a script here runs

    from decoding.engine.target import TargetModel
    from pipeline.resources import SHIPPED_DRAFTERS

    model, tokenizer, prompts = load(name, "mt_bench", limit)
    drafters = dict(compose_run([f"model={name}"]).model.drafters)
    drafters = {k: str(SHIPPED_DRAFTERS / v) if (SHIPPED_DRAFTERS / v).exists() else v for k, v in drafters.items()}
    return TargetModel(model, tokenizer), prompts, drafters


def drafter_override(name: str, drafters: dict) -> dict:
    """{"drafter": the model's drafter} for a method whose config has a drafter field of a kind the model has."""
    from dataclasses import fields

    from decoding import method_configs
    from pipeline.zoo import BASE_METHOD

    base = BASE_METHOD.get(name, name)
    kind = {"domino": "domino", "dominotree": "domino", "eagle3": "eagle3"}.get(base, "dflash")
    has_field = any(f.name == "drafter" for f in fields(method_configs()[base]))  # block drafters and EAGLE-3
    return {"drafter": drafters[kind]} if has_field and kind in drafters else {}


if __name__ == "__main__":
    main()
