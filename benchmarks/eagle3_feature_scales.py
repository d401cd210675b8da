"""The scales of the target features an EAGLE-3 drafter reads (the outputs of its three tapped layers), over
every position (prompt and answer) of the first `--answers` training answers: per layer, the median
per-dimension RMS, the largest dimensions' RMS, mean and spread, and the share of tokens whose feature
RMS is above 5x the layer's median (attention-sink style outliers). Why it matters: docs/methods/eagle3.md,
"Tenth leg" (`drafter.feature_scale`).

    python benchmarks/eagle3_feature_scales.py [--answers 32] [--threads 2]
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="pipeline/assets/corpus/smollm2-135m")
    ap.add_argument("--answers", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from decoding.drafting.eagle3_drafter import default_aux_layer_ids
    from drafter_fit import training_setup  # this folder is on the path when a script here runs
    from pipeline.train.eagle3 import teacher_pass

    cfg, target, samples = training_setup("eagle3", args.corpus, "float32")
    layer_ids = list(cfg.drafter.eagle_layer_ids) or default_aux_layer_ids(target.config.num_hidden_layers)
    answers = samples[cfg.drafter.val_sequences:cfg.drafter.val_sequences + args.answers]
    with torch.no_grad():
        feats = torch.cat([teacher_pass(target, s["ids"], layer_ids)[0] for s in answers])
    width = target.config.hidden_size
    print(f"{len(answers)} training answers, {len(feats)} positions, fp32")
    for i, layer in enumerate(layer_ids):
        x = feats[:, i * width:(i + 1) * width]
        rms, mean, std = x.pow(2).mean(0).sqrt(), x.mean(0), x.std(0)
        token_rms = x.pow(2).mean(1).sqrt()
        top = rms.topk(3).indices.tolist()
        largest = ", ".join(f"dim {d}: rms {rms[d]:.1f} mean {mean[d]:.1f} std {std[d]:.1f}" for d in top)
        print(f"layer {layer}: median rms {rms.median():.2f}; {largest}; tokens above 5x the median token rms: "
              f"{(token_rms > 5 * token_rms.median()).float().mean():.4f}")


if __name__ == "__main__":
    main()
