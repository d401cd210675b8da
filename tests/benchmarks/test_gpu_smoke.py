"""benchmarks/gpu_smoke.py runs on the CPU with the tiny shape (the same code a GPU runs), so CI
exercises the GPU script: every method at T=0 and T=1 in bf16, the tie diagnosis, methods on a target whose
forwards replay (emulated) CUDA graphs, the DominoTree builders against each other, the forward-cost curve
up to 1024 rows (eager and graphed), and every method again on a hybrid-attention (Gemma 3) target."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


# Not on the GPU machine's image (docs/gpu-bf16.md): the script must run with torch, transformers and
# what they need, and nothing of the pipeline's own stack.
ABSENT_ON_THE_GPU_IMAGE = ("hydra", "hydra_plugins", "omegaconf", "antlr4", "optuna", "wandb", "submitit")


@pytest.mark.slow
def test_gpu_smoke_runs_every_method_on_the_cpu_tiny_shape_with_only_the_gpu_images_packages(tmp_path):
    from pipeline.zoo import LOSSLESS, METHODS

    hide = tmp_path / "hide"  # imports of these fail, and importlib.util.find_spec reports them absent
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(f"import sys\nfor name in {ABSENT_ON_THE_GPU_IMAGE!r}:\n"
                                           "    sys.modules[name] = None\n")
    out = tmp_path / "smoke.json"
    path = os.pathsep.join([str(hide), str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])
    hidden = subprocess.run([sys.executable, "-c", "import hydra"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": path})
    assert hidden.returncode != 0 and "ModuleNotFoundError" in hidden.stderr  # the packages are really hidden
    proc = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--device", "cpu", "--tiny", "--out", str(out),
                           "--graphed", "ar,ddtree,sd"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SPECDEC_CACHE": str(tmp_path / "cache"), "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("gpu smoke: ok")
    report = json.loads(out.read_text())
    assert report["dtype"] == "bfloat16" and report["shape"] == "tiny"
    ran = {(r["method"], r["T"]) for r in report["methods"] if "error" not in r}
    graphed = ("ar graphed", "ddtree graphed", "sd graphed")  # the target's forwards from (emulated) CUDA graphs
    assert ran == {(m, t) for m in (*METHODS, *graphed) for t in (0.0, 1.0)}
    lossless_t0 = [r for r in report["methods"] if r["T"] == 0.0 and "ties" in r]
    assert len(lossless_t0) == len([m for m in LOSSLESS if m != "ar"]) + len(graphed)
    assert all(r["graph_captures"] >= 1 for r in report["methods"] if r["method"] in graphed)
    assert all(r["diverged"] == 0 for r in lossless_t0)
    assert report["builders"]["equal_trees"] and report["builders"]["rounds"] > 0
    assert report["builders"]["cuda_graph"] == "none"  # a CPU builds depth by depth, eagerly, as DominoTree does there
    chains = report["chains"]  # the Domino chain from its (emulated) graphs: both branches, the eager picks
    assert chains["rounds"] > 0 and chains["differing_rounds"] == 0
    assert chains["cuda_graph"] == "emulated" and chains["captures"] == 2
    trees = report["eagle3_trees"]  # EAGLE-3's tree from its (emulated) graph: the eager trees, one capture
    assert trees["rounds_compared"] > 0 and trees["differing_rounds"] == 0
    assert trees["cuda_graph"] == "emulated" and trees["captures"] == trees["cache_buffers"] >= 1
    assert [r["rows"] for r in report["cost_curve"]][-1] == 1024
    assert [r["rows"] for r in report["cost_curve_graphed"]][-1] == 1024
    # every method again on the hybrid-attention target (sliding + full layers), lossless ones at most tied
    hybrid = {(r["method"], r["T"]) for r in report["hybrid"] if "error" not in r}
    assert hybrid == {(f"gemma3/{m}", t) for m in METHODS for t in (0.0, 1.0)}
    assert all(r["diverged"] == 0 for r in report["hybrid"] if "diverged" in r)
    assert all(r["host_ms"] > 0 and r["tokens_per_s"] > 0 for r in report["methods"])
    drafted = {r["method"]: r["draft_tokens_per_step"] for r in report["methods"] if r["T"] == 0.0}
    assert drafted["ar"] == 0 and drafted["caddtree"] >= 1 and drafted["ddtree"] == 16  # a tree's nodes per step
    # every row was printed as it was measured, before the sections after it
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("| ") and "| T |" not in line for line in lines) == \
        len(report["methods"]) + len(report["hybrid"])
    assert lines.index(next(line for line in lines if line.startswith("DominoTree builders"))) > \
        max(i for i, line in enumerate(lines) if line.startswith("| ") and not line.startswith("| gemma3/"))


def load_smoke():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke", PROJECT_ROOT / "benchmarks" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_crashing_section_is_a_reported_problem_and_the_json_keeps_the_rest(tmp_path, monkeypatch, capsys):
    smoke = load_smoke()

    def broken(*args):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(smoke, "compare_builders", broken)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "smoke.json"
    monkeypatch.setattr(sys, "argv", ["gpu_smoke.py", "--device", "cpu", "--tiny", "--methods", "ar,pld",
                                      "--max-rows", "2", "--out", str(out)])
    assert smoke.main() == 1
    report = json.loads(out.read_text())
    assert [(r["method"], r["T"]) for r in report["methods"]] == [("ar", 0.0), ("ar", 1.0), ("pld", 0.0), ("pld", 1.0)]
    assert report["builders"] == {"error": "RuntimeError: capture failed"}
    assert [r["rows"] for r in report["cost_curve"]] == [1, 2]  # the section after the failing one still ran
    assert report["problems"] == ["the DominoTree builders' comparison crashed (RuntimeError: capture failed)"]
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("gpu smoke: FAILED: the DominoTree builders'")


def test_the_full_shape_on_a_cpu_is_refused_in_one_line():
    proc = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--device", "cpu"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout.strip().splitlines() == [
        "gpu smoke: FAILED: the full shape on a CPU takes hours (on a CPU: --device cpu --tiny)"]


def test_gpu_smoke_without_a_gpu_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    proc = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--device", "cuda", "--methods", "ar"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout.strip().splitlines() == [
        "gpu smoke: FAILED: no CUDA device is visible (on a CPU: --device cpu --tiny)"]


def built(tokens, parents, scores):
    from decoding.drafting.draft_tree import BuiltTree
    from decoding.engine.tree import TokenTree

    return BuiltTree(TokenTree(tokens, parents), scores)


def test_tree_gap_tells_a_near_tie_swap_at_the_cut_off_from_a_wrong_tree():
    smoke = load_smoke()
    # root 1; children 10 (-0.5) and 11 (-0.7); a third node at the cut-off: 20 under 10, or 21 under 11 (a near-tie)
    reference = built([1, 10, 11, 20], [-1, 0, 0, 1], [0.0, -0.5, -0.7, -1.2500001])
    assert smoke.tree_gap(reference, reference) == 0.0
    swapped = built([1, 10, 11, 21], [-1, 0, 0, 2], [0.0, -0.5, -0.7, -1.25])
    assert smoke.tree_gap(reference, swapped) < 1e-6 <= smoke.TREE_TIE_TOLERANCE
    rescored = built([1, 10, 11, 20], [-1, 0, 0, 1], [0.0, -0.5, -0.9, -1.25])  # same tree, a score off by 0.2
    assert smoke.tree_gap(reference, rescored) == pytest.approx(0.2)
    # the same scores linked to the wrong parents (a bug in the fast builder's host-side linking): paths differ
    relinked = built([1, 10, 11, 20], [-1, 0, 0, 2], [0.0, -0.5, -0.7, -1.2500001])
    assert smoke.tree_gap(reference, relinked) < smoke.TREE_TIE_TOLERANCE  # only the cut-off node moved: a tie
    deep = built([1, 10, 20, 11], [-1, 0, 1, 0], [0.0, -0.5, -0.6, -0.7])  # a node far above the cut-off misplaced
    wrong = built([1, 10, 20, 11], [-1, 0, 0, 0], [0.0, -0.5, -0.6, -0.7])
    assert smoke.tree_gap(deep, wrong) > smoke.TREE_TIE_TOLERANCE
    assert smoke.tree_gap(reference, built([1, 10, 11], [-1, 0, 0], [0.0, -0.5, -0.7])) is None


@pytest.mark.parametrize("near_ties, verdict", [(2, "gpu smoke: ok"), (1, "gpu smoke: FAILED: the fast and reference")])
def test_builders_that_differ_only_by_near_ties_pass_and_otherwise_fail(near_ties, verdict, tmp_path, monkeypatch, capsys):
    smoke = load_smoke()
    differing = {"rounds": 9, "equal_trees": False, "differing_rounds": 2, "near_tie_rounds": near_ties,
                 "size_mismatch_rounds": 0, "max_score_gap": 1e-6 if near_ties == 2 else 0.4, "cuda_graph": False,
                 "fast_ms_per_tree": 1.0, "reference_ms_per_tree": 2.0}
    monkeypatch.setattr(smoke, "compare_builders", lambda *args: differing)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["gpu_smoke.py", "--device", "cpu", "--tiny", "--methods", "ar",
                                      "--max-rows", "2", "--out", str(tmp_path / "smoke.json")])
    assert smoke.main() == (0 if near_ties == 2 else 1)
    out = capsys.readouterr().out
    assert "(2 rounds differ, " in out and out.strip().splitlines()[-1].startswith(verdict)


@pytest.mark.parametrize("chains, verdict", [
    ({"differing_rounds": 2, "near_tie_rounds": 2, "cuda_graph": "captured"}, "gpu smoke: incomplete"),  # no curve
    ({"differing_rounds": 2, "near_tie_rounds": 1, "cuda_graph": "captured"},
     "gpu smoke: FAILED: the Domino chain drafted differently from its CUDA graph in 1 round(s)"),
    ({"differing_rounds": 0, "near_tie_rounds": 0, "cuda_graph": "captured", "captures": 9},
     "gpu smoke: FAILED: the Domino chain's CUDA graph was captured 9 times, not 2"),
    ({"differing_rounds": 0, "near_tie_rounds": 0, "cuda_graph": "not used", "captures": 0},
     "gpu smoke: FAILED: the Domino chain's CUDA graph was never used")])
def test_a_domino_chain_graph_that_drafts_differently_or_is_misused_is_a_problem(chains, verdict, tmp_path,
                                                                                 monkeypatch, capsys):
    report = {"rounds": 9, "captures": 2, "eager_ms_per_chain": 1.0, "graph_ms_per_chain": 0.5, **chains}
    code, saved, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar", "--sections", "methods,builders",
                                  compare_chains=lambda *args: report)
    assert saved["chains"] == report
    assert code == (3 if verdict.endswith("incomplete") else 1) and last.startswith(verdict)


def run_smoke(tmp_path, monkeypatch, capsys, *args, **replaced):
    """gpu_smoke's main on the tiny CPU shape with `args`, its functions `replaced` -> (exit code, JSON report,
    last printed line)."""
    smoke = load_smoke()
    for name, fn in replaced.items():
        monkeypatch.setattr(smoke, name, fn)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "smoke.json"
    monkeypatch.setattr(sys, "argv", ["gpu_smoke.py", "--device", "cpu", "--tiny", *args, "--out", str(out)])
    code = smoke.main()
    return code, json.loads(out.read_text()), capsys.readouterr().out.strip().splitlines()[-1]


def test_methods_past_the_time_budget_are_skipped_rows_and_the_run_is_incomplete_not_ok(tmp_path, monkeypatch, capsys):
    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar,pld", "--methods-budget-s", "0",
                                   "--max-rows", "2")
    assert code == 3
    assert report["methods"] == [{"method": "ar", "T": None, "skipped": "time budget"},
                                 {"method": "pld", "T": None, "skipped": "time budget"}]
    assert report["skipped"] == ["ar", "pld"] and report["problems"] == []
    assert [r["rows"] for r in report["cost_curve"]] == [1, 2]  # the later sections still ran
    assert {r["method"] for r in report["hybrid"]} == {"gemma3/ar", "gemma3/pld"}  # the budget is section 1's
    assert last.startswith("gpu smoke: incomplete (not run: ar, pld)")


def test_a_second_call_runs_only_the_named_sections_and_methods_and_says_what_it_left_out(tmp_path, monkeypatch, capsys):
    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar,pld", "--hybrid-methods", "sd",
                                   "--sections", "methods,hybrid")
    assert code == 3
    assert [(r["method"], r["T"]) for r in report["methods"]] == [("ar", 0.0), ("ar", 1.0), ("pld", 0.0), ("pld", 1.0)]
    assert [r["method"] for r in report["hybrid"]] == ["gemma3/ar", "gemma3/ar", "gemma3/sd", "gemma3/sd"]
    assert report["builders"] == report["cost_curve"] == {"skipped": "--sections"}
    assert report["sections_run"] == ["hybrid", "methods"]
    assert report["skipped"] == ["section builders", "section curve", "section syncs"] and report["problems"] == []
    assert last.startswith("gpu smoke: incomplete (not run: section builders, section curve, section syncs)")


def test_a_failure_and_a_section_not_run_are_both_in_the_verdict(tmp_path, monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("no curve")

    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar", "--sections", "methods,curve",
                                   cost_curve=broken)
    assert code == 1 and report["cost_curve"] == {"error": "RuntimeError: no curve"}
    assert last.startswith("gpu smoke: FAILED: the forward-cost curve crashed (RuntimeError: no curve); the graphed "
                           "forward-cost curve crashed (RuntimeError: no curve) "
                           "(not run: section builders, section hybrid, section syncs)")


def test_an_unknown_section_is_refused_in_one_line_before_anything_runs():
    proc = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--device", "cpu", "--tiny", "--sections",
                           "methods,curves"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout.strip().splitlines() == [
        "gpu smoke: FAILED: unknown section(s) ['curves'] (known: ['builders', 'curve', 'hybrid', 'methods', 'syncs'])"]


def test_eager_variants_run_with_cuda_graphs_off_after_the_defaults(tmp_path, monkeypatch, capsys):
    smoke = load_smoke()
    built = []
    real = smoke.build_method

    def recording(name, *args, **overrides):
        method = real(name, *args, **overrides)
        built.append((name, method.config.cuda_graph if hasattr(method.config, "cuda_graph") else None))
        return method

    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar,domino", "--eager", "domino",
                                   "--sections", "methods", build_method=recording)
    assert code == 3 and report["problems"] == []
    assert [(r["method"], r["T"]) for r in report["methods"]] == [
        ("ar", 0.0), ("ar", 1.0), ("domino", 0.0), ("domino", 1.0), ("domino eager", 0.0), ("domino eager", 1.0)]
    assert built == [("ar", None), ("domino", True), ("domino", False)]
    assert report["methods"][-2]["diverged"] == 0


def test_graphed_variants_run_on_a_target_replaying_its_forwards_and_are_checked_against_eager_ar(tmp_path, monkeypatch,
                                                                                               capsys):
    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar", "--graphed", "ar,ddtree",
                                   "--sections", "methods,curve", "--max-rows", "4")
    assert code == 3 and report["problems"] == []
    assert [(r["method"], r["T"]) for r in report["methods"]] == [
        ("ar", 0.0), ("ar", 1.0), ("ar graphed", 0.0), ("ar graphed", 1.0), ("ddtree graphed", 0.0),
        ("ddtree graphed", 1.0)]
    graphed_t0 = [r for r in report["methods"] if r["method"].endswith("graphed") and r["T"] == 0.0]
    assert all(r["diverged"] == 0 and r["graph_captures"] >= 1 for r in graphed_t0)  # against the eager AR's tokens
    assert [r["rows"] for r in report["cost_curve_graphed"]] == [1, 2, 4]


def test_graphed_rows_on_the_hybrid_target_replay_its_sliding_layers_and_match_eager_ar(tmp_path, monkeypatch, capsys):
    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar,ddtree", "--hybrid-graphed",
                                   "ar,ddtree", "--sections", "hybrid")
    assert code == 3 and report["problems"] == []
    assert [(r["method"], r["T"]) for r in report["hybrid"]] == [
        (f"gemma3/{m}", t) for m in ("ar", "ddtree", "ar graphed", "ddtree graphed") for t in (0.0, 1.0)]
    graphed_t0 = [r for r in report["hybrid"] if r["method"].endswith("graphed") and r["T"] == 0.0]
    assert all(r["diverged"] == 0 and r["graph_captures"] >= 1 for r in graphed_t0)  # against the eager AR's tokens


def test_a_graphed_row_that_never_replays_is_a_problem(tmp_path, monkeypatch, capsys):
    smoke = load_smoke()
    real = smoke.graphed_target

    def never(target):
        runs_on = real(target)
        runs_on.graphs.enabled = False  # every forward eager: the row's target captured nothing
        return runs_on

    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar", "--graphed", "ar",
                                   "--sections", "methods", graphed_target=never)
    assert code == 1 and last.startswith("gpu smoke: FAILED: ar graphed never replayed a graph of the target")


def test_the_sync_count_is_saved_and_a_method_crashing_in_it_is_a_problem(tmp_path, monkeypatch, capsys):
    rows = [{"method": "ar", "T": 0.0, "syncs_per_step": 1.0, "steps": 15, "sites": {"loop.py:180": 1.0}},
            {"method": "ar", "T": 1.0, "error": "RuntimeError: boom"}]
    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar", "--sections", "methods,syncs",
                                   count_syncs=lambda *args: rows)
    assert report["syncs"] == rows
    assert code == 1 and last.startswith("gpu smoke: FAILED: ar crashed in the sync count (RuntimeError: boom)")


def test_off_cuda_the_sync_count_says_it_cannot_count(tmp_path, monkeypatch, capsys):
    code, report, last = run_smoke(tmp_path, monkeypatch, capsys, "--methods", "ar", "--sections", "syncs")
    assert report["syncs"] == {"skipped": "the sync debug mode is CUDA's"} and report["problems"] == []
    assert code == 3 and "section methods" in last  # the sections left out make it incomplete, not this one


def test_each_rows_sync_count_comes_with_the_cpu_rules_read_count(tmp_path, monkeypatch, capsys):
    """The rows of section 5 (the CUDA debug mode faked: it warns nothing here): each has the device's count and,
    from the same method, `host_reads`'s count by rule, which sees AR's one read per step."""
    import torch

    from pipeline.zoo import random_target

    smoke = load_smoke()
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    rows = smoke.sync_rows(random_target("tiny"), tmp_path, "tiny", ["ar"], [7, 30, 31, 32], 9)
    assert [(r["method"], r["T"], r["syncs_per_step"], r["reads_per_step"]) for r in rows] == \
        [("ar", 0.0, 0.0, 1.0), ("ar", 1.0, 0.0, 1.0)]
    smoke.print_syncs(rows)
    # the site of AR's read: the one-tensor `tolist` of `to_host` (its line found, not written down: it moves)
    import inspect

    from decoding.engine import transfer

    lines, first = inspect.getsourcelines(transfer.to_host)
    line = first + next(i for i, text in enumerate(lines) if "values = tensors[0].reshape(-1).tolist()" in text)
    assert capsys.readouterr().out.splitlines()[-1] == f"| ar | 1 | 0.0 |  | 1.0 (engine/transfer.py:{line}) |"
