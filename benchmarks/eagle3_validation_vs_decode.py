"""What an EAGLE-3 drafter's validation accept length says about decoding: the shipped SmolLM2 drafter's
chain, greedy in fp32, on the prompts of the trainer's held-out validation answers (the corpus's lowest
prompt hashes, as `pipeline/train/trainer.py` `training_samples` picks them).

Per answer it prints
- `tau`: tokens per target forward of the decoded chain (what a benchmark reports);
- `per-position`: the trainer's validation metric (`ttt_steps`: 1 + leading agreeing draft steps, averaged
  over every answer position, teacher-forced) on the same decoded text;
- `corpus`: the same metric on the corpus answer itself (what `training.json` averages);
- `differ`: decoding steps whose accepted drafts differ from the leading run validation computes at that root
  (at the end of the text, at EOS or `--max-new-tokens`, the engine counts a step's accepted drafts up to its
  committed tokens minus one, and the prediction is capped the same way).
Decoding stops at the model's EOS, as the runner does. A decoding step starts only where the previous one
stopped, so step starts are a biased sample of the positions: tau need not equal the per-position mean even when
every step accepts exactly what validation predicts. The `all` line pools steps and positions over the answers.

    python benchmarks/eagle3_validation_vs_decode.py [--answers 8] [--chain-length 7] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import zlib

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--chain-length", type=int, default=7, help="drafts per step (the trainer's ttt_length: 7)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--drafter", default="pipeline/assets/drafters/smollm2-135m/eagle3")
    ap.add_argument("--corpus", default="pipeline/assets/corpus/smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from decoding.engine.loop import committed_drafts, generate
    from decoding.engine.target import TargetModel
    from decoding.methods.eagle3 import Eagle3, Eagle3Config
    from pipeline.models import load_model, stop_token_ids
    from pipeline.schema import register_configs
    from pipeline.train.corpus import load_corpus
    from pipeline.train.eagle3 import teacher_pass, ttt_steps
    from pipeline.train.exit_head import Readout

    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=["model=smollm2-135m", "model.dtype=float32"]))
    model, tokenizer = load_model(cfg.model)
    target = TargetModel(model, tokenizer)
    length = args.chain_length
    method = Eagle3(Eagle3Config(drafter=args.drafter, tree=False, chain_length=length))
    method.setup(target)
    stops = stop_token_ids(model, tokenizer)
    readout = Readout(model)  # the trainer's teacher: the target's readout (soft cap included)

    def leading_runs(ids: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(leading agreeing steps per row [T-1], rows whose first draft is an answer token)."""
        with torch.no_grad():
            feats, finals = teacher_pass(model, ids, list(method.taps))
            steps = ttt_steps(method.drafter, method.embed, feats, finals, readout, ids, prompt_len, length)
        agree = torch.stack([a & ok for _, a, ok in steps])
        return agree.int().cumprod(0).sum(0), steps[0][2]

    samples = load_corpus(args.corpus)  # the trainer's validation answers: lowest prompt hash (data.seed 0)
    samples = sorted(samples, key=lambda s: zlib.crc32(s["ids"][:s["prompt_len"]].numpy().tobytes(), 0))
    totals = dict(steps=0, accepted=0, differ=0, pos_sum=0.0, pos_n=0, corpus_sum=0.0, corpus_n=0)
    print(f"{'answer':>6} {'steps':>5} {'tau':>5} {'per-position':>12} {'corpus':>6} {'differ':>6}")
    for i, sample in enumerate(samples[:args.answers]):
        prompt_len = sample["prompt_len"]
        prompt = sample["ids"][:prompt_len].tolist()
        roots, accepted = [], []
        step = method.step

        def recorded(state, step=step):
            roots.append(len(state.sequence) - 1)
            before = state.stats.num_accepted_tokens
            step(state)
            accepted.append(state.stats.num_accepted_tokens - before)

        method.step = recorded
        state = generate(method, target, prompt, max_new_tokens=args.max_new_tokens, stop_ids=stops)
        del method.step
        ids = torch.tensor(prompt + state.new_tokens)
        run, rows = leading_runs(ids, prompt_len)
        # the prediction counted as the engine counts a step (`committed_drafts`), with the text after the root as
        # the most it can have committed: at the text's end (EOS, the token limit) that caps it
        differ = sum(a != committed_drafts(int(run[r - 1]), ids[r + 1:]) for a, r in zip(accepted, roots))
        corpus_run, corpus_rows = leading_runs(sample["ids"], prompt_len)
        pos_sum, pos_n = float((1 + run.float())[rows].sum()), int(rows.sum())
        corpus_sum, corpus_n = float((1 + corpus_run.float())[corpus_rows].sum()), int(corpus_rows.sum())
        print(f"{i:>6} {state.stats.num_steps:>5} {state.stats.tau:>5.2f} {pos_sum / pos_n:>12.2f} "
              f"{corpus_sum / corpus_n:>6.2f} {differ:>6}", flush=True)
        for key, value in (("steps", state.stats.num_steps), ("accepted", state.stats.num_accepted_tokens),
                           ("differ", differ), ("pos_sum", pos_sum), ("pos_n", pos_n), ("corpus_sum", corpus_sum),
                           ("corpus_n", corpus_n)):
            totals[key] += value
    t = totals
    print(f"all {t['steps']} steps: tau {(t['accepted'] + t['steps']) / t['steps']:.3f}, per-position mean on the "
          f"decoded text {t['pos_sum'] / t['pos_n']:.3f}, on the corpus answers {t['corpus_sum'] / t['corpus_n']:.3f}, "
          f"steps differing from validation's prediction {t['differ']}")


if __name__ == "__main__":
    main()
