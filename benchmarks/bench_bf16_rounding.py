"""How far a multi-row verify forward moves the logits from AR's one-row step, in the model's dtype: the
evidence behind the near-tie tolerance of decoding/engine/ties.py.

On AR's own greedy continuations of a few prompts, every `--rows`-row chain forward (a verification block
that accepts everything) is compared, row by row, with the one-row forwards AR makes at the same
positions on the same cache. Prints the median and max change of the top token's logit and of any logit,
with the top logit's magnitude, and the tie tolerance at that magnitude.

    python benchmarks/bench_bf16_rounding.py [--model smollm2-135m] [--dtype bfloat16] [--prompts 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from decoding.methods.ar import AR
from decoding.engine.loop import generate
from decoding.engine.target import TargetModel
from decoding.engine.ties import tolerance
from pipeline.models import load_model
from pipeline.tasks import build_chat, load_examples

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import compose_run  # noqa: E402


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rc = compose_run([f"model={args.model}", f"model.dtype={args.dtype}", f"task={args.task}",
                      f"task.limit={args.prompts}"])
    model, tokenizer = load_model(rc.model)
    target = TargetModel(model, tokenizer)
    top_moves, any_moves, tops = [], [], []
    for example in load_examples(rc.task):
        prompt = build_chat(tokenizer, rc.task, [(example.turns[0], None)], rc.model.chat_template_kwargs)
        seq = prompt + generate(AR(), target, prompt, max_new_tokens=args.max_new_tokens).new_tokens
        n = args.rows
        for start in range(len(prompt), len(seq) - n, n // 2):
            target.prefill(seq[:start - 1])
            block = target.forward(torch.tensor(seq[start - 1:start - 1 + n]), torch.arange(n), None).logits
            target.prefill(seq[:start - 1])
            for k in range(n):
                one = target.forward(torch.tensor([seq[start - 1 + k]]), torch.tensor([0]), None).logits[0]
                best = one.argmax()
                top_moves.append(float((block[k][best] - one[best]).abs()))
                any_moves.append(float((block[k] - one).abs().max()))
                tops.append(float(one.max()))
    top = statistics.median(tops)
    print(f"model={args.model} dtype={target.dtype} rows={args.rows} positions={len(tops)}")
    print(f"top token's logit moves: median {statistics.median(top_moves):.3f}, max {max(top_moves):.3f}")
    print(f"any logit moves:         median {statistics.median(any_moves):.3f}, max {max(any_moves):.3f} "
          f"({100 * max(any_moves) / top:.1f}% of the median top logit {top:.2f})")
    print(f"tie tolerance at the median top logit: {tolerance(target.dtype, top):.3f}")


if __name__ == "__main__":
    main()
