"""Lookahead anchor: our `method=lookahead` against the authors' implementation (PyPI `lade` 0.0.2)
on the same model, prompts, N, W, G, greedy; prints tokens per step ("compression ratio"), time per
step, and whether both outputs equal AR.

`lade` 0.0.2 needs transformers 4.34 (legacy tuple caches, `padding_mask`) and is LLaMA-only, so it
runs in its own venv through benchmarks/lade_anchor_child.py; this process never imports it:

    python -m venv /tmp/lade-venv
    /tmp/lade-venv/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \\
        transformers==4.34.1 lade==0.0.2 --no-deps
    /tmp/lade-venv/bin/pip install "tokenizers>=0.14,<0.15" "huggingface-hub>=0.16.4,<0.18" safetensors \\
        numpy packaging pyyaml regex requests tqdm filelock fsspec typing_extensions sympy networkx jinja2
    python benchmarks/bench_lade_anchor.py [--task gsm8k] [--prompts 5] [--max-new-tokens 128]

SmolLM2-135M is a LLaMA; its cached folder is re-described for transformers 4.34 (rope_theta at the
top level) next to a link to the same weights. Both sides draw the initial window with Python's
Mersenne Twister seeded 10 (lade calls random.seed(10) itself; ours: method.seed=10), so the two
runs start from the same window and any step-count difference comes from the algorithms.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import load  # noqa: E402

from decoding.methods.ar import AR  # noqa: E402
from decoding.engine.loop import generate  # noqa: E402
from decoding.methods.lookahead import Lookahead, LookaheadConfig  # noqa: E402
from decoding.engine.target import TargetModel  # noqa: E402
from pipeline.models import cache_root  # noqa: E402


def legacy_model_dir(model, out: Path) -> Path:
    """The cached SmolLM2 folder as transformers 4.34 reads it (same weights, linked)."""
    src = cache_root() / "models" / "smollm2-135m"
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    config["rope_theta"] = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    config["torch_dtype"] = config.pop("dtype", "float32")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    link = out / "model.safetensors"
    if not link.exists():
        link.symlink_to(src / "model.safetensors")
    return out


def run_ours(target, prompts, args, eos):
    method = Lookahead(LookaheadConfig(ngram_size=args.level, window_size=args.window, guess_set_size=args.guess,
                                       seed=10))
    generate(method, target, prompts[0], max_new_tokens=8, stop_ids={eos})  # warm-up
    rows = []
    for ids in prompts:
        t0 = time.perf_counter()
        state = generate(method, target, ids, max_new_tokens=args.max_new_tokens, stop_ids={eos})
        rows.append({"new_tokens": state.new_tokens, "steps": state.stats.num_steps,
                     "wall_s": time.perf_counter() - t0, "rows": state.stats.extra["forward_rows"]})
    return rows


def run_lade(args, prompts, eos, model_dir: Path, tmp: Path):
    job = {"model_dir": str(model_dir), "prompts": prompts, "max_new_tokens": args.max_new_tokens,
           "level": args.level, "window": args.window, "guess": args.guess, "threads": args.threads,
           "eos_token_id": eos}
    (tmp / "job.json").write_text(json.dumps(job))
    child = Path(__file__).resolve().parent / "lade_anchor_child.py"
    subprocess.run([args.lade_python, str(child), str(tmp / "job.json"), str(tmp / "out.json")], check=True)
    return json.loads((tmp / "out.json").read_text())


def fastest(runs: list[list[dict]]) -> list[dict]:
    """Per prompt, the repeat with the shortest wall time (outputs and steps are identical)."""
    return [min(reps, key=lambda r: r["wall_s"]) for reps in zip(*runs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lade-python", default="/tmp/lade-venv/bin/python")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--level", type=int, default=5, help="N")
    ap.add_argument("--window", type=int, default=7, help="W")
    ap.add_argument("--guess", type=int, default=7, help="G")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per side; the fastest counts")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                    help="our side's attention kernel (lade on transformers 4.34 runs eager attention)")
    args = ap.parse_args()
    if not Path(args.lade_python).exists():
        raise SystemExit(f"error: {args.lade_python} not found; create the lade venv first (see this script's "
                         "docstring)")
    torch.set_num_threads(args.threads)
    model, tokenizer, prompts = load("smollm2-135m", args.task, args.prompts, (f"model.attn_implementation={args.attn}",))
    eos = int(model.config.eos_token_id)
    target = TargetModel(model, tokenizer)
    ar = [generate(AR(), target, ids, max_new_tokens=args.max_new_tokens, stop_ids={eos}).new_tokens
          for ids in prompts]
    ours_runs, lade_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = legacy_model_dir(model, Path(tmp) / "model")
        for _ in range(args.repeats):  # alternate, so machine-load drift hits both sides alike
            ours_runs.append(run_ours(target, prompts, args, eos))
            theirs = run_lade(args, prompts, eos, model_dir, Path(tmp))
            lade_runs.append(theirs["results"])
    ours, theirs["results"] = fastest(ours_runs), fastest(lade_runs)
    print(f"model=smollm2-135m task={args.task} prompts={len(prompts)} max_new_tokens={args.max_new_tokens} "
          f"N={args.level} W={args.window} G={args.guess} threads={args.threads} greedy, our attention: {args.attn}")
    print(f"lade {theirs['transformers']=} {theirs['torch']=}; ours transformers 5 / torch {torch.__version__}")
    print(f"{'prompt':>6} {'tok/step lade':>14} {'tok/step ours':>14} {'ms/step lade':>13} {'ms/step ours':>13} "
          f"{'rows/step lade':>15} {'rows/step ours':>15} {'lade==AR':>9} {'ours==AR':>9}")
    totals = {"lade": [0, 0, 0.0], "ours": [0, 0, 0.0]}
    for i, (t, o) in enumerate(zip(theirs["results"], ours)):
        for name, row in (("lade", t), ("ours", o)):
            totals[name][0] += len(row["new_tokens"])
            totals[name][1] += row["steps"]
            totals[name][2] += row["wall_s"]
        print(f"{i:>6} {len(t['new_tokens']) / t['steps']:>14.3f} {len(o['new_tokens']) / o['steps']:>14.3f} "
              f"{1000 * t['wall_s'] / t['steps']:>13.1f} {1000 * o['wall_s'] / o['steps']:>13.1f} "
              f"{t['rows'] / t['steps']:>15.1f} {o['rows'] / o['steps']:>15.1f} "
              f"{str(t['new_tokens'] == ar[i]):>9} {str(o['new_tokens'] == ar[i]):>9}")
    (lt, ls, lw), (ot, os_, ow) = totals["lade"], totals["ours"]
    print(f"{'all':>6} {lt / ls:>14.3f} {ot / os_:>14.3f} {1000 * lw / ls:>13.1f} {1000 * ow / os_:>13.1f}")
    print(f"tokens per step: ours / lade = {(ot / os_) / (lt / ls):.3f};  time per step: ours / lade = "
          f"{(ow / os_) / (lw / ls):.3f}")


if __name__ == "__main__":
    main()
