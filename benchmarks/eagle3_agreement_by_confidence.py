"""Where does an EAGLE-3 drafter disagree with the target? Its first draft step's top-1 agreement with the
target (the trainer's validation metric `val/top1_step0`, teacher-forced, T=0) split by how sure the target
is of the token it predicts: the target's own top-1 probability at that position, in buckets.

Low agreement where the target hesitates is expected (a near-even choice is hard to foresee); low
agreement where the target is sure is either what the drafter has not learned or what its inputs (the
features up to x_t and the embedding of x_{t+1}; the target's confidence comes after reading x_{t+1}) do
not determine. Run on the held-out validation answers
(`drafter.val_sequences`, as the trainer picks them) unless `--train-answers N` picks the first N of the
training pool instead.

    python benchmarks/eagle3_agreement_by_confidence.py [--drafter DIR] [--dtype float32] [--threads 2]
"""

from __future__ import annotations

import argparse

import torch

EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0 + 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", default="pipeline/assets/drafters/smollm2-135m/eagle3")
    ap.add_argument("--corpus", default="pipeline/assets/corpus/smollm2-135m")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-answers", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from decoding.drafting.eagle3_drafter import load_eagle3
    from drafter_fit import training_setup  # this folder is on the path when a script here runs
    from pipeline.train.eagle3 import teacher_pass, ttt_steps
    from pipeline.train.exit_head import Readout

    cfg, target, samples = training_setup("eagle3", args.corpus, args.dtype)
    n_val = cfg.drafter.val_sequences
    answers = samples[n_val:n_val + args.train_answers] if args.train_answers else samples[:n_val]
    drafter = load_eagle3(args.drafter, dtype=getattr(torch, args.dtype)).eval()
    embed, readout = target.get_input_embeddings(), Readout(target)

    agree_in, count_in = torch.zeros(len(EDGES) - 1), torch.zeros(len(EDGES) - 1)
    with torch.no_grad():
        for s in answers:
            ids = s["ids"]
            feats, finals = teacher_pass(target, ids, drafter.spec.aux_layer_ids)
            (_, agree, valid), = ttt_steps(drafter, embed, feats, finals, readout, ids.to(feats.device),
                                           s["prompt_len"], 1)
            # step 0's row t predicts x_{t+2} from the target's row t+1 (ttt_steps)
            sure = torch.softmax(readout.teacher(finals.float()), -1).amax(-1)[1:len(ids)]
            bucket = torch.bucketize(sure, torch.tensor(EDGES[1:-1]), right=True)
            for b in range(len(EDGES) - 1):
                rows = valid & (bucket == b)
                agree_in[b] += float((agree & rows).sum())
                count_in[b] += float(rows.sum())
    total = count_in.sum()
    print(f"drafter {args.drafter}, {args.dtype}, {len(answers)} answers "
          f"({'training pool' if args.train_answers else 'held out'}), {int(total)} positions")
    print(f"{'target top-1 probability':<26}{'share of positions':>20}{'drafter top-1 agreement':>26}")
    for b in range(len(EDGES) - 1):
        label = f"[{EDGES[b]:.1f}, {min(EDGES[b + 1], 1.0):.1f}{']' if b == len(EDGES) - 2 else ')'}"
        share = count_in[b] / max(total, 1)
        rate = f"{agree_in[b] / count_in[b]:.3f}" if count_in[b] else "-"
        print(f"{label:<26}{share:>20.3f}{rate:>26}")
    print(f"{'all':<26}{1.0:>20.3f}{agree_in.sum() / max(total, 1):>26.3f}")


if __name__ == "__main__":
    main()
