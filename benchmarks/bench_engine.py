"""Engine benchmark on a real model (default: the offline SmolLM2-135M).

Prints (1) AR tokens/s of our engine next to HF `generate` on the same prompts, measured side by
side and interleaved, and (2) the forward-cost curve: milliseconds for one forward of n tokens
(n = 1, 2, 4, ..., 128, as a tree block with a float mask) on top of a 300-token cache, the curve
that sets tree budgets.

    python benchmarks/bench_engine.py [--model smollm2-135m] [--prompts 5] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from decoding.methods.ar import AR
from decoding.engine.loop import generate
from decoding.engine.target import TargetModel
from pipeline.models import load_model, stop_token_ids
from pipeline.schema import register_configs
from pipeline.tasks import build_chat, load_examples


def compose_run(overrides: list[str]):
    """The run config `python -m pipeline <overrides>` would use, as dataclasses."""
    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        return OmegaConf.to_object(compose("config", overrides=overrides))


def load(model_name: str, task_name: str, limit: int, overrides: tuple[str, ...] = ()):
    """Model, tokenizer and chat prompts as `python -m pipeline model=<model_name> task=<task_name>` has them."""
    rc = compose_run([f"model={model_name}", f"task={task_name}", f"task.limit={limit}", *overrides])
    model, tokenizer = load_model(rc.model)
    prompts = [build_chat(tokenizer, rc.task, [(ex.turns[0], None)], rc.model.chat_template_kwargs)
               for ex in load_examples(rc.task)]
    return model, tokenizer, prompts


def bench_ar(model, tokenizer, prompts, max_new_tokens: int, repeats: int) -> None:
    target = TargetModel(model, tokenizer)
    stops = stop_token_ids(model, tokenizer)
    generate(AR(), target, prompts[0], max_new_tokens=8)  # warm-up
    ours_tok = ours_s = hf_tok = hf_s = 0.0
    mismatches = 0
    for _ in range(repeats):
        for prompt in prompts:
            t0 = time.perf_counter()
            state = generate(AR(), target, prompt, max_new_tokens=max_new_tokens, stop_ids=stops)
            ours_s += time.perf_counter() - t0
            ours_tok += len(state.new_tokens)
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                     eos_token_id=sorted(stops), pad_token_id=sorted(stops)[0])
            hf_s += time.perf_counter() - t0
            new = out[0, len(prompt):].tolist()
            hf_tok += len(new)
            mismatches += int(new != state.new_tokens)
    print(f"AR engine     : {ours_tok / ours_s:7.2f} tok/s  ({int(ours_tok)} tokens, {ours_s:.1f} s)")
    print(f"HF generate   : {hf_tok / hf_s:7.2f} tok/s  ({int(hf_tok)} tokens, {hf_s:.1f} s)")
    print(f"engine / HF   : {(ours_tok / ours_s) / (hf_tok / hf_s):.3f}x   outputs differing: {mismatches}")


def bench_forward_cost(model, context: int, sizes: list[int], repeats: int) -> None:
    target = TargetModel(model)
    ctx = torch.randint(100, 1000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    target.prefill(ctx)
    print(f"forward cost with a {context}-token cache (tree block, float mask), median of {repeats}:")
    base = None
    for n in sizes:
        tokens = torch.randint(100, 1000, (n,))
        depths = torch.arange(n)
        visible = torch.tril(torch.ones(n, n, dtype=torch.bool))
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            target.forward(tokens, depths, visible)
            times.append(time.perf_counter() - t0)
            target.truncate(context)
        ms = statistics.median(times[1:]) * 1000
        base = base or ms
        print(f"  n={n:4d}: {ms:8.1f} ms   ({ms / base:5.2f}x of n=1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="humaneval")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default=None, help="model.dtype (default: the model config's, auto = bf16 where native)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, prompts = load(args.model, args.task, args.prompts,
                                     (f"model.dtype={args.dtype}",) if args.dtype else ())
    print(f"model={args.model} dtype={next(model.parameters()).dtype} threads={torch.get_num_threads()} "
          f"torch={torch.__version__}")
    bench_ar(model, tokenizer, prompts, args.max_new_tokens, args.repeats)
    bench_forward_cost(model, args.context, [1, 2, 4, 8, 16, 32, 64, 128], repeats=5)


if __name__ == "__main__":
    main()
