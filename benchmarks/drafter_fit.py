"""Is the shipped EAGLE-3 drafter short of capacity or of data? Its training metrics on answers it trained on
against the same metrics on the held-out validation answers.

The trainer's own validation (`pipeline/train/eagle3.py` `validate`: top-1 agreement per training-time-test step,
expected chain accept length at T=0, teacher-forced) on
- `validation`: the held-out answers (`drafter.val_sequences`, the corpus's lowest prompt hashes, as
  `pipeline/train/trainer.py` `training_samples` picks them);
- `training`: the first `--train-answers` of the training pool in the trainer's shuffled order (a leg draws
  4 answers per step at random from the pool, so most of these were drawn at least once: the shipped drafter's
  3592 steps drew 14,368 answers from a pool of 10,966).
Similar figures on both mean the drafter does not fit the answers it has seen better than new ones: more of the
same data cannot raise it, a larger drafter or other data may. A large gap would mean it is short of data.

    python benchmarks/drafter_fit.py [--train-answers 64] [--dtype float32] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-answers", type=int, default=64)
    ap.add_argument("--drafter", default="pipeline/assets/drafters/smollm2-135m/eagle3")
    ap.add_argument("--corpus", default="pipeline/assets/corpus/smollm2-135m")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from decoding.drafting.eagle3_drafter import load_eagle3
    from pipeline.models import load_model
    from pipeline.train.config import register_train_configs
    from pipeline.train.eagle3 import validate
    from pipeline.train.exit_head import Readout
    from pipeline.train.trainer import training_samples

    register_train_configs()
    with initialize_config_module(config_module="conf.train", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("train", overrides=[
            "drafter=eagle3", f"data.corpus={args.corpus}", f"model.dtype={args.dtype}"]))
    target, tokenizer = load_model(cfg.model)
    target.requires_grad_(False)
    drafter = load_eagle3(args.drafter, dtype=getattr(torch, args.dtype)).eval()
    samples = training_samples(cfg, target, tokenizer)
    n_val = cfg.drafter.val_sequences
    sets = {"validation": samples[:n_val], "training": samples[n_val:n_val + args.train_answers]}
    embed, readout = target.get_input_embeddings(), Readout(target)
    print(f"drafter {args.drafter}, {args.dtype}, ttt_length {cfg.drafter.ttt_length}")
    rows = {}
    for name, answers in sets.items():
        t0 = time.perf_counter()
        rows[name] = validate(drafter, embed, readout, target, answers, cfg.drafter)
        tokens = sum(len(s["ids"]) - s["prompt_len"] for s in answers)
        print(f"{name}: {len(answers)} answers, {tokens} answer tokens, {time.perf_counter() - t0:.0f} s", flush=True)
    steps = cfg.drafter.ttt_length
    print(f"{'answers':<11}" + "".join(f"{'top1 s' + str(j):>9}" for j in range(steps)) + f"{'accept':>8}")
    for name, m in rows.items():
        print(f"{name:<11}" + "".join(f"{m[f'val/top1_step{j}']:>9.3f}" for j in range(steps))
              + f"{m['val/accept_len_chain']:>8.3f}")


if __name__ == "__main__":
    main()
