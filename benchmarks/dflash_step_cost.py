"""Where a DFlash training step's time goes, per training answer: the target's teacher-forced forward that
recomputes the tapped features (`with_taps`: a corpus stores token ids only) against the drafter's loss and
backward over `--anchors` blocks (`dflash_loss`, whose cost grows with the labelled rows).
It shows what more anchors per answer cost next to what the features of that answer already cost.

Corpus answers in a seeded shuffle (seed 0), the shipped SmolLM2 DFlash drafter in
fp32 (the trainer's weights), the target in `--dtype`, one thread by default. Per anchor count it prints
seconds per answer for the features and for the loss + backward, and the labelled rows per answer.

    python benchmarks/dflash_step_cost.py [--anchors 16,64] [--answers 12] [--dtype float32]
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchors", default="16,64", help="anchors per answer, comma-separated")
    ap.add_argument("--answers", type=int, default=12)
    ap.add_argument("--drafter", default="pipeline/assets/drafters/smollm2-135m/dflash")
    ap.add_argument("--corpus", default="pipeline/assets/corpus/smollm2-135m")
    ap.add_argument("--dtype", default="float32", help="the target's (model.dtype)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from decoding.drafting.dflash_drafter import load_drafter
    from pipeline.models import load_model
    from pipeline.schema import register_configs
    from pipeline.train.corpus import load_corpus
    from pipeline.train.objectives import dflash_loss, sample_blocks
    from pipeline.train.trainer import with_taps

    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=["model=smollm2-135m", f"model.dtype={args.dtype}"]))
    target, _ = load_model(cfg.model)
    target.requires_grad_(False)
    drafter = load_drafter(args.drafter, dtype=torch.float32).train()
    spec = drafter.spec
    answers = load_corpus(args.corpus)
    random.Random(0).shuffle(answers)
    answers = answers[:args.answers]
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    print(f"SmolLM2-135M target ({args.dtype}), DFlash drafter fp32, {torch.get_num_threads()} thread(s), "
          f"{len(answers)} answers of mean length {sum(len(a['ids']) for a in answers) / len(answers):.0f}")
    print(f"{'anchors':>7s} {'features s':>10s} {'loss+bwd s':>10s} {'rows':>6s}")
    generator = torch.Generator().manual_seed(0)
    for num_anchors in (int(a) for a in args.anchors.split(",")):
        features = loss_s = rows = 0.0
        for answer in answers:
            t0 = time.perf_counter()
            answer = with_taps(answer, target, list(spec.target_layer_ids))
            t1 = time.perf_counter()
            blocks = sample_blocks(answer["ids"], answer["prompt_len"], spec.block_size, num_anchors, 7.0,
                                   spec.shift_label, generator)
            loss, _ = dflash_loss(drafter, embed, head, answer, blocks, spec.mask_token_id)
            loss.backward()
            t2 = time.perf_counter()
            drafter.zero_grad(set_to_none=True)
            features, loss_s, rows = features + t1 - t0, loss_s + t2 - t1, rows + int((blocks.labels >= 0).sum())
        n = len(answers)
        print(f"{num_anchors:7d} {features / n:10.2f} {loss_s / n:10.2f} {rows / n:6.0f}")


if __name__ == "__main__":
    main()
