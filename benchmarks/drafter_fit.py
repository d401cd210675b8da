"""Does a shipped drafter (EAGLE-3, DFlash or Domino) fit the answers it trained on better than new ones? Its training
metrics on answers of its training pool against the same metrics on the held-out validation answers.

The trainer's own validation (EAGLE-3, `pipeline/train/eagle3.py` `validate`: top-1 agreement per
training-time-test step, expected chain accept length at T=0, teacher-forced; DFlash and Domino,
`pipeline/train/trainer.py` `validate`: loss and accept length of the block at sampled anchors, seeded, the same
anchors for every drafter of a `drafter.num_anchors`, block size and label shift, so drafters compare paired) on
- `validation`: the held-out answers (`drafter.val_sequences`, the corpus's lowest prompt hashes, as
  `pipeline/train/trainer.py` `training_samples` picks them);
- `training`: the first `--train-answers` of the training pool in the trainer's shuffled order (a leg draws
  4 answers per step at random from the pool, so most of these were drawn at least once: the EAGLE-3 drafter
  shipped since 2026-12-06 drew 14,400 answers in its 3600 steps, all from the complete corpus; the DFlash
  drafter shipped since 2026-12-08 16,056 in its 4014).
Similar figures on both mean no sign of overfitting (an underfit drafter shows the same); whether more passes
over the data help is for further training legs to measure. A large gap would mean it is short of data.

    python benchmarks/drafter_fit.py [--kind eagle3|dflash|domino] [--train-answers 64] [--dtype float32] [--threads 2]
        [drafter.num_anchors=64 ...]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-answers", type=int, default=64)
    ap.add_argument("--kind", default="eagle3", choices=["eagle3", "dflash", "domino"])
    ap.add_argument("--drafter", default=None, help="default: the shipped SmolLM2 drafter of --kind")
    ap.add_argument("--corpus", default="pipeline/assets/corpus/smollm2-135m")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("overrides", nargs="*", help="training-config overrides the validation reads, e.g. "
                    "drafter.num_anchors=64 drafter.loss_decay_gamma=2 (a drafter's last leg: its training.json "
                    "`recipe`; the accept length moves with the anchors, the loss with both)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    location = args.drafter or f"pipeline/assets/drafters/smollm2-135m/{args.kind}"
    cfg, target, samples = training_setup(args.kind, args.corpus, args.dtype, args.overrides)
    n_val = cfg.drafter.val_sequences
    sets = {"validation": samples[:n_val], "training": samples[n_val:n_val + args.train_answers]}
    validate = eagle3_validation(location, target, cfg, args.dtype) if args.kind == "eagle3" else \
        dflash_validation(location, target, cfg, args.dtype)
    print(f"drafter {location}, {args.dtype}")
    rows = {}
    for name, answers in sets.items():
        t0 = time.perf_counter()
        rows[name] = validate(answers)
        tokens = sum(len(s["ids"]) - s["prompt_len"] for s in answers)
        print(f"{name}: {len(answers)} answers, {tokens} answer tokens, {time.perf_counter() - t0:.0f} s", flush=True)
    columns = list(dict.fromkeys(c for m in rows.values() for c in m))
    print(f"{'answers':<11}" + "".join(f"{c.removeprefix('val/'):>16}" for c in columns))
    for name, m in rows.items():
        # a set without one answer long enough for a DFlash block has no metrics: "-"
        print(f"{name:<11}" + "".join(f"{m[c]:>16.3f}" if c in m else f"{'-':>16}" for c in columns))


def training_setup(kind: str, corpus: str, dtype: str, overrides: list[str] = ()):
    """(training config, target, answers in the trainer's order: the held-out validation ones first) of a
    `python -m pipeline.train drafter=<kind>` run on `corpus`, the target frozen."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from pipeline.models import load_model
    from pipeline.train.config import register_train_configs
    from pipeline.train.trainer import training_samples

    register_train_configs()
    with initialize_config_module(config_module="conf.train", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("train", overrides=[
            f"drafter={kind}", f"data.corpus={corpus}", f"model.dtype={dtype}", *overrides]))
    target, tokenizer = load_model(cfg.model)
    target.requires_grad_(False)
    return cfg, target, training_samples(cfg, target, tokenizer)


def eagle3_validation(location: str, target, cfg, dtype: str):
    from decoding.drafting.eagle3_drafter import load_eagle3
    from pipeline.train.eagle3 import validate
    from pipeline.train.exit_head import Readout

    drafter = load_eagle3(location, dtype=getattr(torch, dtype)).eval()
    embed, readout = target.get_input_embeddings(), Readout(target)
    return lambda answers: validate(drafter, embed, readout, target, answers, cfg.drafter)


def dflash_validation(location: str, target, cfg, dtype: str):
    from decoding.drafting.dflash_drafter import load_drafter
    from pipeline.train.trainer import validate, with_taps

    drafter = load_drafter(location, dtype=getattr(torch, dtype)).eval()
    layers = list(drafter.spec.target_layer_ids)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()

    def run(answers):
        answers = [with_taps(s, target, layers, cfg.drafter.max_train_len) for s in answers]
        return validate(drafter, embed, lm_head, answers, cfg)
    return run


if __name__ == "__main__":
    main()
