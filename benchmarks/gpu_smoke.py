"""The GPU/bf16 smoke check: every method on a random Qwen3-shaped target in bf16, in one script.

On one GPU (default shape: Qwen3-1.7B's, random weights; a few minutes):
1. every method (pipeline/zoo.py METHODS) at T=0 and T=1 on a few prompts: no crash, tokens/s,
   τ, host ms per step (wall minus network forwards), and at T=0 the tie diagnosis of every
   mismatch with AR (decoding/engine/ties.py): a lossless method may leave AR only at near-ties;
   then Domino with method.compile=true (`--compiled`; the torch.compile'd chain, Triton on a GPU), and
   Domino, DominoTree and EAGLE-3 with method.cuda_graph=false (`--eager`: their drafting without CUDA graphs); then
   methods on the same weights with model.cuda_graph=true (`--graphed`: the target's block forwards replayed
   from CUDA graphs, decoding/engine/static_forward.py; emulated off CUDA), rows "<method> graphed";
2. DominoTree's fast builder (depth by depth; on CUDA the whole tree is one CUDA-graph replay) against the
   reference builder on the drafts of a real run: equal trees, and each builder's ms per tree; then the
   Domino chain replayed from its CUDA graphs against the eager chain on the rounds of a real run at T=0
   and T=1: the same picks, and each path's ms per chain (off CUDA the replay is emulated); then EAGLE-3's
   dynamic tree from its CUDA graph against the eager tree on the same prompts at T=0: the same trees, and
   each path's ms per proposal;
3. the forward-cost curve: ms of one forward of n rows (n = 1 .. 1024) on a 512-token cache, eager and replayed
   from the target's CUDA graphs (`cost_curve_graphed`; emulated off CUDA);
4. every method again on a tiny random Gemma 3 (sliding and full layers, an 8-token window the prompts
   cross), on the device in the same dtype: the engine's hybrid-attention paths (docs/architectures.md),
   which the Qwen3 shape does not reach, under the device's own transformers; then `--hybrid-graphed` methods
   on it with model.cuda_graph=true (the static forward's sliding-window masks over every kept key);
5. the device's own count of what the host waited for: every method at T=0 and T=1 on one prompt under
   `torch.cuda.set_sync_debug_mode("warn")` (pipeline/step_probes.py `device_syncs`), synchronizing operations
   per step and the lines they came from, next to the host reads per step the CPU tests count by rule in the
   same steps (`host_reads`; tests/decoding/test_host_syncs.py BOUNDS); reported, not a failure. Off CUDA it
   says so and counts nothing, and that does not make the run incomplete (the tiny CPU run, CI's, has no CUDA
   to count on).
The drafters are random too, in the published layout (z-lab DFlash / Huang2020 Domino config
fields and tensor names), so acceptance is low: this checks that everything runs and is correct
on the device, not how fast a trained drafter is.

    python benchmarks/gpu_smoke.py [--out gpu_smoke.json]            # a GPU
    python benchmarks/gpu_smoke.py --device cpu --tiny                # the same code, tiny shape, < 1 min (tests)

Exits 1 if a method crashed, a lossless method diverged from AR beyond a near-tie (either target), or the
two tree builders disagreed beyond a near-tie; 3 ("incomplete") if nothing failed but a method or section did
not run (`--methods-budget-s`, `--sections`); the last line says which.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from decoding.drafting.domino_scorer import LevelBuilder, ReferenceScorer
from decoding.drafting.draft_tree import build_best_first
from decoding.engine.cuda_graph import GraphReplayer
from decoding.engine.ties import diagnose
from decoding.engine.transfer import synchronize
from pipeline.errors import named_line
from pipeline.summary import tie_counts
from pipeline.step_probes import device_syncs, host_overhead, host_reads
from pipeline.zoo import METHODS, build_method, mixed_prompts, random_target

SECTIONS = {"methods", "builders", "curve", "hybrid", "syncs"}  # 1-5 of the docstring


def run_methods(target, folder, shape, names, prompt_ids, max_new_tokens, compiled=(), eager=(), on_row=None,
                deadline: float | None = None, graphed=()) -> list[dict]:
    """Every method of `names` at its defaults, then those of `compiled` with method.compile=true, those of
    `eager` with method.cuda_graph=false and those of `graphed` on the same weights with model.cuda_graph=true
    (`graphed_target`). Each row goes to `on_row` as soon as it is measured (a run cut short keeps what it
    printed). A method not started by `deadline` (a perf_counter time) is a `skipped` row, so the later
    sections still run inside the device's time limit. A graphed row's forward time includes the captures of
    the buckets first met after host_overhead's short warm-up (`graph_captures` counts them all)."""
    rows, ar_outputs = [], None
    on_row = on_row or print_row
    variants = [(n, "", {}, None) for n in names] + [(n, " compiled", {"compile": True}, None) for n in compiled] + \
        [(n, " eager", {"cuda_graph": False}, None) for n in eager] + [(n, " graphed", {}, "graphed") for n in graphed]
    for name, suffix, overrides, graphs in variants:
        label = name + suffix
        if deadline is not None and time.perf_counter() > deadline:
            rows.append({"method": label, "T": None, "skipped": "time budget"})
            on_row(rows[-1])
            continue
        try:
            runs_on = graphed_target(target) if graphs else target  # fresh graphs per method: its captures
            method = build_method(name, runs_on, folder, shape, **overrides)
        except Exception as err:  # a crash is a result here: report it and go on
            rows.append({"method": label, "T": None, "error": named_line(err)})
            on_row(rows[-1])
            continue
        for temperature in (0.0, 1.0):
            row = {"method": label, "T": temperature}
            try:  # the run and its tie diagnosis: either may crash on a device, and that is this row's result
                clock_before = warm_device(target.device)
                r = host_overhead(method, runs_on, prompt_ids, max_new_tokens, temperature)
                if graphs:
                    row["graph_captures"] = runs_on.graphs.captures
                if clock_before is not None:  # SM MHz after the warm-up and after the row (CUDA)
                    row["sm_clock_mhz"] = [clock_before, sm_clock(target.device)]
                outputs = r.pop("outputs")
                row.update({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()})
                row["tokens_per_s"] = round(r["tokens_per_step"] / (r["wall_ms"] / 1000), 2) if r["wall_ms"] else 0.0
                if temperature == 0 and name == "ar" and not graphs:  # graphed AR is checked against eager AR
                    ar_outputs = outputs
                elif temperature == 0 and method.lossless and ar_outputs is not None:
                    found = [d.to_dict() for d in (diagnose(target, p, a, o)
                                                   for p, a, o in zip(prompt_ids, ar_outputs, outputs)) if d is not None]
                    counts = tie_counts(found)
                    row.update(match=sum(a == o for a, o in zip(ar_outputs, outputs)), ties=counts["match_ties"],
                               diverged=counts["match_divergences"])
            except Exception as err:
                row = {"method": label, "T": temperature, "error": named_line(err)}
            rows.append(row)
            on_row(row)
        if graphs:  # its graphs' memory pools and KV buffer: freed before the next row (a cycle holds them)
            del method, runs_on
            release_graphs(target.device)
    return rows


def release_graphs(device) -> None:
    import gc

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def graphed_target(target):
    """The same weights with the block forwards replayed from CUDA graphs (model.cuda_graph=true); off CUDA
    emulated (decoding/engine/static_forward.py), so the CPU run exercises the same bookkeeping."""
    from decoding.engine.target import TargetModel

    emulate = target.device.type != "cuda"
    return TargetModel(target.model, target.tokenizer, graphs=GraphReplayer(True, "model.cuda_graph", emulate))


def warm_device(device, seconds: float = 0.3) -> int | None:
    """On CUDA, matrix products for `seconds` before a timed row, then the SM clock (`sm_clock`). On the
    first H200 run (2026-12-04) forward times moved up to 4x between rows of the same shapes (tiny Gemma 3
    AR: 30-35 ms at T=0 against 7.4 at T=1), mostly in the row run first after seconds of host-only work
    building the method. Suspected, not established: a GPU clocked down while idle, or the host's speed
    (the forward is host-bound there). The clocks recorded before and after each row are a first clue."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    a = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a = torch.tanh(a @ a)
        synchronize(device)
    return sm_clock(device)


def gpu_driver() -> str | None:
    """The NVIDIA driver version (NVML), so the JSON says which driver a GPU table ran on."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no NVML
        return None


def sm_clock(device) -> int | None:
    """The GPU's SM clock in MHz now (None where NVML cannot say)."""
    try:
        return int(torch.cuda.clock_rate(torch.device(device)))
    except Exception:  # no NVML
        return None


def compare_builders(target, folder, shape, prompt_ids, max_new_tokens) -> dict:
    """Record the draft passes of a DominoTree run, then build every round's tree with both builders."""
    method = build_method("dominotree", target, folder, shape)
    cfg, recorded = method.config, []
    real_pass = method.draft_pass

    def recording(state):
        draft = real_pass(state)
        recorded.append((state.root, draft))
        return draft

    method.draft_pass = recording
    from decoding.engine.loop import generate

    for p in prompt_ids:
        generate(method, target, p, max_new_tokens=max_new_tokens)
    # a GPU: the fast builder as DominoTree runs it there, one graph per tree; a CPU: depth by depth, eagerly
    graphs = device_graphs(target.device) if torch.device(target.device).type == "cuda" else None
    times = {"fast": [], "reference": []}
    gaps = []  # per round whose trees differ: tree_gap of the two trees (None: different sizes)
    for i, (root, draft) in enumerate(recorded):
        built = {}
        for kind in ("fast", "reference"):
            synchronize(target.device)
            t0 = time.perf_counter()
            if kind == "fast":
                built[kind] = LevelBuilder(method.drafter, method.head, method.embed, draft.hidden, draft.logits,
                                           cfg.node_topk, cfg.corr_topm, graphs=graphs).build(
                    root, cfg.num_nodes, max_depth=len(draft.logits))
            else:
                scorer = ReferenceScorer(method.drafter, method.head, method.embed, draft.hidden, draft.logits,
                                         cfg.node_topk, cfg.corr_topm)
                built[kind] = build_best_first(root, scorer, cfg.num_nodes, max_depth=len(draft.logits))
            synchronize(target.device)
            if i:  # round 0 captures the CUDA graph: not timed
                times[kind].append(time.perf_counter() - t0)
        if built["fast"].tree.tokens != built["reference"].tree.tokens or \
                built["fast"].tree.parents != built["reference"].tree.parents:
            gaps.append(tree_gap(built["fast"], built["reference"]))
    ms = {k: round(1000 * sum(v) / max(1, len(v)), 3) for k, v in times.items()}
    return {"rounds": len(recorded), "equal_trees": not gaps, "differing_rounds": len(gaps),
            "near_tie_rounds": sum(g is not None and g <= TREE_TIE_TOLERANCE for g in gaps),
            "size_mismatch_rounds": sum(g is None for g in gaps),
            "max_score_gap": max((g for g in gaps if g is not None), default=0.0),
            "cuda_graph": graph_state(graphs), "captures": graphs.captures if graphs else 0,
            "fast_ms_per_tree": ms["fast"], "reference_ms_per_tree": ms["reference"]}


def device_graphs(device) -> GraphReplayer:
    """The CUDA graphs of a drafting step on a GPU; elsewhere the same buffer bookkeeping, emulated."""
    return GraphReplayer(True, "method.cuda_graph", emulate=torch.device(device).type != "cuda")


def graph_state(graphs: GraphReplayer | None) -> str:
    """"captured" (a CUDA graph replayed), "emulated" (no GPU), "not used", or "none" (a CPU's eager build). A
    failed capture raises: the section's error."""
    if graphs is None:
        return "none"
    return ("emulated" if graphs.emulate else "captured") if graphs.captures else "not used"


def graph_problems(what: str, section: dict, expected_captures: int) -> list[str]:
    """A graph that was never used, or was captured again and again (its inputs' shapes or its weights change
    between rounds: every capture is a sync) is a problem: it ran, but not as designed. (A failed capture raises:
    the section's error.)"""
    state = section.get("cuda_graph")
    if state == "not used":
        return [f"{what}'s CUDA graph was never used"]
    if state in ("captured", "emulated") and section.get("captures") != expected_captures:
        return [f"{what}'s CUDA graph was captured {section.get('captures')} times, not {expected_captures}"]
    return []


def compare_chains(target, folder, shape, prompt_ids, max_new_tokens) -> dict:
    """Record every round's corrected chain of an eager Domino run at T = 0 and T = 1 (the greedy and the
    sampled branch), then draft each again from its CUDA graph (method.cuda_graph; emulated off CUDA): the
    same picks, and each path's ms per chain (the graph's includes copying the round's inputs in). A round
    whose picks differ is a near-tie when the corrected logits up to the first differing pick differ by at most
    TREE_TIE_TOLERANCE."""
    from decoding.engine.loop import generate
    from decoding.methods.domino import chain_picks, graphed_chain

    method = build_method("domino", target, folder, shape, cuda_graph=False)
    calls = []  # the inputs of every round: fresh tensors per round, which the eager chain only reads
    method.chain = lambda *args: calls.append(args) or chain_picks(*args)
    for temperature in (0.0, 1.0):
        for p in prompt_ids:
            generate(method, target, p, max_new_tokens=max_new_tokens, temperature=temperature)
    graphs = device_graphs(target.device)
    graphed = graphed_chain(graphs)
    times = {"eager": [], "graph": []}
    differing = near_ties = 0
    with torch.inference_mode():  # as Domino.propose runs the chain
        for args in calls:
            differs, tie = replay_round(args, chain_picks, graphed, graphs, times, target.device)
            differing += differs
            near_ties += tie
    ms = {k: round(1000 * sum(v) / max(1, len(v)), 3) for k, v in times.items()}
    return {"rounds": len(calls), "differing_rounds": differing, "near_tie_rounds": near_ties,
            "cuda_graph": graph_state(graphs), "captures": graphs.captures,
            "eager_ms_per_chain": ms["eager"], "graph_ms_per_chain": ms["graph"]}


def compare_eagle3_trees(target, folder, shape, prompt_ids, max_new_tokens) -> dict:
    """EAGLE-3 at T = 0 with its dynamic tree replayed from a CUDA graph (method.cuda_graph, the default on a
    GPU; emulated off CUDA) and eagerly, on the same prompts: every round's tree compared while the two runs
    are in step (a tree that differs can accept another number of tokens, so the rounds after it are not
    compared), and each path's ms per proposal (the drafter's cache update and the tree; a round that captured
    or made new cache buffers is not timed). One capture per cache buffer a tree ran on is expected."""
    from decoding.engine import cuda_graph
    from decoding.engine.loop import generate

    runs = {}
    for kind in ("graph", "eager"):
        real = cuda_graph.graphs_for
        if kind == "graph" and torch.device(target.device).type != "cuda":  # as a GPU's setup asks
            cuda_graph.graphs_for = lambda device, enabled, what: GraphReplayer(enabled, what, emulate=True)
        try:
            method = build_method("eagle3", target, folder, shape, cuda_graph=kind == "graph")
        finally:
            cuda_graph.graphs_for = real
        trees, times, buffers, propose = [], [], [], method.propose

        def timed(state, propose=propose, trees=trees, times=times, buffers=buffers, method=method):
            captures, buffer = method.graphs.captures, method.cache.buffer_k
            synchronize(target.device)
            t0 = time.perf_counter()
            proposal = propose(state)
            synchronize(target.device)
            ran = len(proposal.tree.tokens) > 1  # a tree was expanded (not a one-token prompt's first round)
            if ran and (not buffers or method.cache.buffer_k is not buffers[-1]):  # a tree on new buffers (made
                buffers.append(method.cache.buffer_k)  # here or in `begin`; kept: identity, not id())
            if method.cache.buffer_k is buffer and method.graphs.captures == captures:  # no capture, no allocation
                times.append(time.perf_counter() - t0)
            trees.append((proposal.tree.tokens, proposal.tree.parents))
            return proposal

        method.propose = timed
        for p in prompt_ids:
            trees.append(None)  # a prompt's first round
            generate(method, target, p, max_new_tokens=max_new_tokens)
        runs[kind] = (trees, times, method.graphs, len(buffers))
    (graph_trees, graph_times, graphs, buffers), (eager_trees, eager_times, _, _) = runs["graph"], runs["eager"]
    compared = differing = 0
    prompt_in_step = True
    for got, want in zip(graph_trees, eager_trees):
        if got is None or want is None:  # a new prompt: both runs start in step again
            prompt_in_step = got is None and want is None
            continue
        if prompt_in_step:
            compared += 1
            if got != want:
                differing += 1
                prompt_in_step = False
    ms = {k: round(1000 * sum(v) / max(1, len(v)), 3) for k, v in (("graph", graph_times), ("eager", eager_times))}
    return {"rounds_compared": compared, "differing_rounds": differing, "cuda_graph": graph_state(graphs),
            "captures": graphs.captures, "cache_buffers": buffers, "graph_ms_per_proposal": ms["graph"],
            "eager_ms_per_proposal": ms["eager"]}


def replay_round(args, eager, graphed, graphs: GraphReplayer, times: dict, device) -> tuple[bool, bool]:
    """One recorded round through the eager chain and the graph: (picks differ, and only at a near-tie)."""
    out, captures = {}, graphs.captures
    for kind, chain in (("eager", eager), ("graph", graphed)):
        synchronize(device)
        t0 = time.perf_counter()
        picks, rows = chain(*args)
        synchronize(device)
        if graphs.captures == captures:  # a round that captured its branch's graph is not timed
            times[kind].append(time.perf_counter() - t0)
        out[kind] = (picks.clone(), rows.clone())
    (want, want_rows), (got, got_rows) = out["eager"], out["graph"]
    if torch.equal(got, want):
        return False, False
    first = int((got != want).nonzero()[0])
    return True, bool((got_rows[:first + 1] - want_rows[:first + 1]).abs().max() <= TREE_TIE_TOLERANCE)


# Both builders keep the budget's best nodes by cumulative log-probability, with the head's math in fp32. Where
# one GPU kernel rounds differently from another, two nodes of almost equal score at the tree's cut-off can swap (a
# different, equally good tree); every node both trees hold then has the same score to about 1e-5, and a node only
# one holds scores about the other's lowest kept node. A scoring or linking bug moves them far more.
TREE_TIE_TOLERANCE = 1e-3


def tree_gap(a, b) -> float | None:
    """How far two built trees are from a near-tie swap (0.0 when equal; None when their sizes differ): the largest
    score difference of a node both hold (nodes matched by their token path from the root), and of a node only one
    holds from the other tree's lowest kept score (a tie can only swap nodes at the cut-off)."""
    pa, pb = scored_paths(a), scored_paths(b)
    if len(pa) != len(pb):
        return None
    low_a, low_b = min(pa.values()), min(pb.values())
    gaps = [abs(pa[p] - pb[p]) for p in pa.keys() & pb.keys()]
    gaps += [abs(s - low_b) for p, s in pa.items() if p not in pb] + [abs(s - low_a) for p, s in pb.items() if p not in pa]
    return max(gaps, default=0.0)


def scored_paths(built) -> dict[tuple[int, ...], float]:
    """{token path below the root: cumulative score} of a BuiltTree's nodes (parents come before children)."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(built.tree.tokens, built.tree.parents):
        paths.append(() if parent < 0 else paths[parent] + (token,))
    return dict(zip(paths, built.scores))


@torch.inference_mode()
def cost_curve(target, context: int, sizes: list[int], repeats: int = 3) -> list[dict]:
    vocab = target.config.vocab_size
    target.prefill(torch.randint(3, vocab - 1, (context,), generator=torch.Generator().manual_seed(0)).tolist())
    rows, base = [], None
    for n in sizes:
        tokens = torch.randint(3, vocab - 1, (n,), device=target.device)
        depths = torch.arange(n, device=target.device)
        visible = torch.ones(n, n, dtype=torch.bool).tril()
        times = []
        for _ in range(repeats + 1):
            synchronize(target.device)
            t0 = time.perf_counter()
            target.forward(tokens, depths, visible)
            synchronize(target.device)
            times.append(time.perf_counter() - t0)
            target.truncate(context)
        ms = 1000 * sorted(times[1:])[len(times[1:]) // 2]
        base = base or ms
        rows.append({"rows": n, "ms": round(ms, 3), "x_one_row": round(ms / base, 2)})
    return rows


def print_header(report: dict) -> None:
    print(f"device {report['device']}  shape {report['shape']}  dtype {report['dtype']}  torch {report['torch']}  "
          f"transformers {report['transformers']}  driver {report['driver']}", flush=True)
    print("| method | T | tok/s | τ | host ms/step | fwd ms/step | match | ties | diverged |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)


def print_row(r: dict) -> None:
    if "error" in r:
        print(f"| {r['method']} | {r['T']} | FAILED: {r['error']} |", flush=True)
        return
    if "skipped" in r:
        print(f"| {r['method']} | – | skipped ({r['skipped']}) |", flush=True)
        return
    print(f"| {r['method']} | {r['T']:g} | {r['tokens_per_s']:.1f} | {r['tau']:.2f} | {r['host_ms']:.3f} | "
          f"{r['forward_ms']:.3f} | {r.get('match', '–')} | {r.get('ties', '–')} | {r.get('diverged', '–')} |", flush=True)


def print_builders(b: dict) -> None:
    if "error" in b:
        print(f"DominoTree builders: FAILED: {b['error']}", flush=True)
        return
    differ = "" if b["equal_trees"] else (f" ({b['differing_rounds']} rounds differ, {b['near_tie_rounds']} of them "
                                          f"near-ties, {b['size_mismatch_rounds']} in size; largest score gap "
                                          f"{b['max_score_gap']:.2g})")
    print(f"DominoTree builders: {b['rounds']} rounds, equal trees: {b['equal_trees']}{differ}, CUDA graph: "
          f"{b['cuda_graph']}, fast {b['fast_ms_per_tree']} ms/tree, reference {b['reference_ms_per_tree']} ms/tree",
          flush=True)


def print_section(title: str, section: dict, describe) -> None:
    """A comparison section's line: `describe(section)`, or its error."""
    print(f"{title}: FAILED: {section['error']}" if "error" in section else f"{title}: {describe(section)}",
          flush=True)


def print_chains(c: dict) -> None:
    print_section("Domino chain, graph vs eager", c, lambda c: (
        f"{c['rounds']} rounds, {c['differing_rounds']} differ ({c['near_tie_rounds']} near-ties), CUDA graph: "
        f"{c['cuda_graph']} ({c['captures']} captures), eager {c['eager_ms_per_chain']} ms/chain, graph "
        f"{c['graph_ms_per_chain']} ms/chain"))


def print_eagle3(e: dict) -> None:
    print_section("EAGLE-3 tree, graph vs eager", e, lambda e: (
        f"{e['rounds_compared']} rounds compared, {e['differing_rounds']} differ, CUDA graph: {e['cuda_graph']} "
        f"({e['captures']} captures for {e['cache_buffers']} cache buffers), eager {e['eager_ms_per_proposal']} "
        f"ms/proposal, graph {e['graph_ms_per_proposal']} ms/proposal"))


def print_curve(curve) -> None:
    if isinstance(curve, dict):
        print(f"forward cost: FAILED: {curve['error']}", flush=True)
        return
    print("forward cost: " + ", ".join(f"n={r['rows']}: {r['ms']} ms ({r['x_one_row']}x)" for r in curve), flush=True)


def section(fn, *args) -> dict | list:
    """A section's result, or {"error": ...}: one failing section does not lose the others."""
    try:
        return fn(*args)
    except Exception as err:
        return {"error": named_line(err)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="default cuda (cpu needs --tiny: the full shape on a CPU takes hours)")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape (CI, CPU) instead of Qwen3-1.7B's")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--prompts", type=int, default=None, help="default 4 (tiny: 2)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 48 (tiny: 16)")
    ap.add_argument("--compiled", default=None,
                    help="methods also run with method.compile=true (default domino; tiny: none, it compiles for ~1 min)")
    ap.add_argument("--eager", default=None,
                    help="methods also run with method.cuda_graph=false (default domino,dominotree,eagle3; tiny: none, "
                         "a CPU has no graphs)")
    ap.add_argument("--graphed", default=None,
                    help="methods also run with model.cuda_graph=true (default ar,dflash,ddtree,dominotree,eagle3,sd; "
                         "tiny: none)")
    ap.add_argument("--max-rows", type=int, default=1024, help="largest row count of the cost curve")
    ap.add_argument("--hybrid-methods", default=None, help="section 4's methods (default: --methods)")
    ap.add_argument("--hybrid-graphed", default=None,
                    help="section 4's methods also run with model.cuda_graph=true (default ar,ddtree; tiny: none)")
    ap.add_argument("--sections", default="methods,builders,curve,hybrid,syncs",
                    help="which of the five sections run (e.g. a second device call for what a first one skipped)")
    ap.add_argument("--methods-budget-s", type=float, default=None,
                    help="start no method of section 1 after this many seconds of it (the rest are skipped rows)")
    ap.add_argument("--out", default=None, help="write the report as JSON (rewritten after every section)")
    args = ap.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() or not args.tiny else "cpu")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print("gpu smoke: FAILED: no CUDA device is visible (on a CPU: --device cpu --tiny)", flush=True)
        return 1
    if torch.device(device).type == "cpu" and not args.tiny:
        print("gpu smoke: FAILED: the full shape on a CPU takes hours (on a CPU: --device cpu --tiny)", flush=True)
        return 1
    sections = set(args.sections.split(","))
    if sections - SECTIONS:
        print(f"gpu smoke: FAILED: unknown section(s) {sorted(sections - SECTIONS)} (known: {sorted(SECTIONS)})")
        return 1
    shape = "tiny" if args.tiny else "qwen3-1.7b"
    n_prompts = args.prompts or (2 if args.tiny else 4)
    max_new = args.max_new_tokens or (16 if args.tiny else 48)
    folder = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    os.environ.setdefault("SPECDEC_CACHE", str(folder / "cache"))  # the CaDDTree cost profile of this random model
    t0 = time.perf_counter()
    report = {"device": torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda" else "cpu",
              "driver": gpu_driver() if torch.device(device).type == "cuda" else None,
              "shape": shape, "dtype": args.dtype, "torch": torch.__version__, "transformers": transformers.__version__,
              "methods": []}

    def save() -> None:
        report["seconds"] = round(time.perf_counter() - t0, 1)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2))

    print_header(report)
    target = section(random_target, shape, getattr(torch, args.dtype), device)
    if isinstance(target, dict):  # e.g. out of memory at the full shape
        return finish(report, [f"the random target could not be built ({target['error']})"], save)
    prompt_ids = mixed_prompts(n_prompts, target.config.vocab_size - 1)
    names = [m for m in args.methods.split(",") if m]
    compiled = variant_methods(args.compiled, args.tiny, "domino")
    eager = variant_methods(args.eager, args.tiny, "domino,dominotree,eagle3")
    graphed = variant_methods(args.graphed, args.tiny, "ar,dflash,ddtree,dominotree,eagle3,sd")
    names = with_ar_first(names)

    def recorder(rows: list, prefix: str = ""):
        """Each measured row, labelled with `prefix`, into `rows`, printed and saved at once."""
        def on_row(row: dict) -> None:
            row["method"] = prefix + row["method"]
            rows.append(row)
            print_row(row)
            save()
        return on_row

    report["sections_run"] = sorted(sections)
    not_run = {"skipped": "--sections"}
    report["builders"], report["chains"], report["cost_curve"], report["hybrid"] = not_run, not_run, not_run, []
    report["eagle3_trees"] = not_run
    report["cost_curve_graphed"] = not_run
    if "methods" in sections:  # host_overhead warms each method up (untimed) before its timed runs
        deadline = None if args.methods_budget_s is None else time.perf_counter() + args.methods_budget_s
        run_methods(target, folder, shape, names, prompt_ids, max_new, compiled, eager, on_row=recorder(report["methods"]),
                    deadline=deadline, graphed=graphed)
    if "builders" in sections:
        report["builders"] = section(compare_builders, target, folder, shape, prompt_ids[:2], max_new)
        print_builders(report["builders"])
        save()
        report["chains"] = section(compare_chains, target, folder, shape, prompt_ids[:2], max_new)
        print_chains(report["chains"])
        save()
        report["eagle3_trees"] = section(compare_eagle3_trees, target, folder, shape, prompt_ids[:2], max_new)
        print_eagle3(report["eagle3_trees"])
        save()
    if "curve" in sections:
        sizes = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if n <= args.max_rows]
        report["cost_curve"] = section(cost_curve, target, 512, sizes)
        print_curve(report["cost_curve"])
        save()
        report["cost_curve_graphed"] = section(cost_curve, graphed_target(target), 512, sizes)
        release_graphs(target.device)
        print("CUDA graphs (model.cuda_graph=true):" if device != "cpu" else "static forwards (emulated graphs):")
        print_curve(report["cost_curve_graphed"])
        save()
    hybrid = None
    if "hybrid" in sections:
        hybrid_names = with_ar_first([m for m in (args.hybrid_methods or args.methods).split(",") if m])
        hybrid_graphed = variant_methods(args.hybrid_graphed, args.tiny, "ar,ddtree")
        hybrid = section(run_hybrid, args.dtype, device, folder, hybrid_names, max_new,
                         recorder(report["hybrid"], f"{HYBRID_ARCH}/"), hybrid_graphed)
    report["syncs"] = not_run
    if "syncs" in sections:
        report["syncs"] = section(count_syncs, target, folder, shape, names, prompt_ids[0], max_new)
        print_syncs(report["syncs"])
        save()
    rows = report["methods"] + report["hybrid"]
    problems = [f"{r['method']} crashed ({r['error']})" for r in rows if "error" in r]
    problems += [f"{r['method']} diverged from AR on {r['diverged']} prompt(s)" for r in rows if r.get("diverged")]
    if isinstance(hybrid, dict):
        problems.append(f"the {HYBRID_ARCH} target could not be built ({hybrid['error']})")
    if "error" in report["builders"]:
        problems.append(f"the DominoTree builders' comparison crashed ({report['builders']['error']})")
    elif report["builders"].get("differing_rounds", 0) > report["builders"].get("near_tie_rounds", 0):
        b = report["builders"]
        problems.append(f"the fast and reference DominoTree builders built different trees in "
                        f"{b['differing_rounds'] - b['near_tie_rounds']} round(s) beyond a near-tie "
                        f"({b['size_mismatch_rounds']} in size; largest score gap {b['max_score_gap']:.3g})")
    problems += graph_problems("the DominoTree builder", report["builders"], expected_captures=1)
    chains = report["chains"]
    if "error" in chains:
        problems.append(f"the Domino chain's graph-vs-eager comparison crashed ({chains['error']})")
    elif chains.get("differing_rounds", 0) > chains.get("near_tie_rounds", 0):
        problems.append(f"the Domino chain drafted differently from its CUDA graph in "
                        f"{chains['differing_rounds'] - chains['near_tie_rounds']} round(s) beyond a near-tie")
    problems += graph_problems("the Domino chain", chains, expected_captures=2)  # T = 0 and T > 0
    trees = report["eagle3_trees"]
    if "error" in trees:
        problems.append(f"the EAGLE-3 tree's graph-vs-eager comparison crashed ({trees['error']})")
    elif trees.get("differing_rounds"):  # the same kernels on the same inputs: no tie to allow for
        problems.append(f"EAGLE-3's tree from its CUDA graph differed from the eager tree in "
                        f"{trees['differing_rounds']} prompt(s)")
    problems += graph_problems("the EAGLE-3 tree", trees, expected_captures=trees.get("cache_buffers"))  # one each
    if isinstance(report["syncs"], dict) and "error" in report["syncs"]:
        problems.append(f"the sync count crashed ({report['syncs']['error']})")
    elif isinstance(report["syncs"], list):
        problems += [f"{r['method']} crashed in the sync count ({r['error']})" for r in report["syncs"] if "error" in r]
    for key, what in (("cost_curve", "forward-cost curve"), ("cost_curve_graphed", "graphed forward-cost curve")):
        if isinstance(report[key], dict) and "error" in report[key]:  # section() caught a crash
            problems.append(f"the {what} crashed ({report[key]['error']})")
    problems += [f"{r['method']} never replayed a graph of the target" for r in rows
                 if r.get("graph_captures") == 0 and "error" not in r]
    skipped = [f"section {name}" for name in sorted(SECTIONS - sections)] + [r["method"] for r in rows if "skipped" in r]
    return finish(report, problems, save, skipped)


def count_syncs(target, folder, shape, names, prompt, max_new_tokens) -> list[dict] | dict:
    """Section 5: per method and temperature, `device_syncs` (or the method's error line) and `host_reads`;
    off CUDA, a note."""
    if target.device.type != "cuda":
        return {"skipped": "the sync debug mode is CUDA's"}
    return sync_rows(target, folder, shape, names, prompt, max_new_tokens)


def sync_rows(target, folder, shape, names, prompt, max_new_tokens) -> list[dict]:
    """Per method and temperature: the device's sync count, and the host reads the CPU's rule counts, with its
    top line."""
    rows = []
    for name in names:
        for temperature in (0.0, 1.0):
            try:
                method = build_method(name, target, folder, shape)
                row = {"method": name, "T": temperature, **device_syncs(method, target, prompt, max_new_tokens,
                                                                        temperature)}
            except Exception as err:
                rows.append({"method": name, "T": temperature, "error": named_line(err)})
                continue
            try:  # a second, warm run: CaDDTree's timed budget may shape its trees differently from the first
                reads = host_reads(method, target, prompt, max_new_tokens, temperature, top=1)
                row |= {"reads_per_step": reads["reads_per_step"], "reads_sites": reads["sites"]}
            except Exception as err:  # the rule's counter failing is reported, not the method's problem
                row["reads_per_step"] = f"counter failed: {named_line(err)}"
            rows.append(row)
    return rows


def print_syncs(syncs) -> None:
    if isinstance(syncs, dict):
        print(f"device syncs per step: {syncs.get('error') or syncs.get('skipped')}", flush=True)
        return
    print("| method | T | device syncs per step | where | host reads per step (the CPU's rule) |\n"
          "|---|---|---|---|---|")
    for r in syncs:
        where = r.get("error") or ", ".join(f"{site} ({n})" for site, n in r["sites"].items())
        reads = " ".join([str(r.get("reads_per_step", ""))] + [f"({site})" for site in r.get("reads_sites", {})])
        print(f"| {r['method']} | {r['T']:g} | {r.get('syncs_per_step', 'FAILED')} | {where} | {reads} |", flush=True)


def variant_methods(given: str | None, tiny: bool, default: str) -> list[str]:
    """The methods of a variant option (`--compiled`, `--eager`, `--graphed`, `--hybrid-graphed`): as given, else
    none for the tiny CPU run and `default` on a device."""
    return [m for m in (given if given is not None else "" if tiny else default).split(",") if m]


def with_ar_first(names: list[str]) -> list[str]:
    """AR runs first: it is the reference of the tie diagnosis."""
    return names if names[:1] == ["ar"] else ["ar", *[n for n in names if n != "ar"]]


HYBRID_ARCH = "gemma3"  # sliding + full layers, local/global rotary (pipeline/zoo.py ARCHITECTURES)


def run_hybrid(dtype: str, device, folder: Path, names, max_new_tokens, on_row, graphed=()) -> list[dict]:
    """Every method of `names` on a tiny random Gemma 3 on the device (random drafters of its shape), then those
    of `graphed` on it with model.cuda_graph=true."""
    target = random_target("tiny", getattr(torch, dtype), device, arch=HYBRID_ARCH)
    prompt_ids = mixed_prompts(2, target.config.vocab_size - 1)  # 24 tokens each: past the 8-token window
    return run_methods(target, folder / HYBRID_ARCH, "tiny", names, prompt_ids, max_new_tokens, on_row=on_row,
                       graphed=graphed)


def finish(report: dict, problems: list[str], save, skipped=()) -> int:
    """The verdict, in the JSON too (a lost stdout keeps it) and as the last line; a run where a method or
    section did not run is never `ok` (exit 3; 2 is argparse's usage error): it says what did not run."""
    report["problems"], report["skipped"] = problems, list(skipped)
    save()
    verdict = "FAILED: " + "; ".join(problems) if problems else "incomplete" if skipped else "ok"
    if skipped:
        verdict += f" (not run: {', '.join(skipped)})"
    print(f"gpu smoke: {verdict} ({report['seconds']} s)", flush=True)
    return 1 if problems else 3 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
