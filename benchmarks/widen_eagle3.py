"""A capacity experiment: an EAGLE-3 checkpoint with a wider MLP in its decoder layer, computing the same
function as the original, to continue training from (`drafter.init_from=<out>`).

The new hidden units' gate and up rows are drawn at the scale of the existing ones; their down-projection
columns are zero, so the widened drafter's outputs equal the original's until training moves them (the new
units still get gradients: their down columns do). The published format keeps its field names: only
`intermediate_size` changes, so the loader, the trainer and every method read the result unchanged.

    python benchmarks/widen_eagle3.py --intermediate 4608 --out /tmp/wide/eagle3 \
        [--drafter pipeline/assets/drafters/smollm2-135m/eagle3] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch


@torch.no_grad()
def widened(model, intermediate: int, seed: int = 0):
    """A copy of `model` (an Eagle3Drafter) whose MLP has `intermediate` hidden units, the same function."""
    from decoding.drafting.eagle3_drafter import Eagle3Drafter, cast_weights

    spec = model.spec
    if intermediate < spec.intermediate_size:
        raise ValueError(f"--intermediate {intermediate}: the drafter already has {spec.intermediate_size}")
    wide = Eagle3Drafter(dataclasses.replace(spec, intermediate_size=intermediate),
                         with_embeddings=model.embed_tokens is not None)
    state = model.state_dict()
    gen = torch.Generator().manual_seed(seed)
    extra = intermediate - spec.intermediate_size
    for name in ("gate_proj", "up_proj"):
        old = state[f"midlayer.mlp.{name}.weight"]
        new = torch.randn(extra, old.shape[1], generator=gen, dtype=torch.float32) * old.float().std()
        state[f"midlayer.mlp.{name}.weight"] = torch.cat([old, new.to(old.dtype)])
    down = state["midlayer.mlp.down_proj.weight"]
    state["midlayer.mlp.down_proj.weight"] = torch.cat([down, down.new_zeros(down.shape[0], extra)], dim=1)
    wide.load_state_dict(state)  # into fp32 parameters; then the original's dtype, buffers kept as load_eagle3 has them
    return cast_weights(wide, model.fc.weight.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", default="pipeline/assets/drafters/smollm2-135m/eagle3")
    ap.add_argument("--intermediate", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from decoding.drafting.dflash_drafter import resolve_location
    from decoding.drafting.eagle3_drafter import load_eagle3, save_eagle3
    from pipeline.train.trainer import training_record

    model = load_eagle3(args.drafter, dtype=torch.float32)
    wide = widened(model, args.intermediate, args.seed)
    out = Path(args.out)
    save_eagle3(wide, out)
    # a further leg reads the steps trained so far from here (and seeds its answer draws with them)
    folder = resolve_location(args.drafter)
    summary = training_record(folder)
    if summary:
        summary["widened_from"] = {"drafter": args.drafter, "intermediate_size": model.spec.intermediate_size}
        (out / "training.json").write_text(json.dumps(summary, indent=2))
    else:
        print(f"warning: {folder / 'training.json'} not found: a leg from {out} counts its steps from 0")
    params = sum(p.numel() for p in wide.parameters())
    print(f"{args.drafter}: intermediate {model.spec.intermediate_size} -> {args.intermediate}, "
          f"{params / 1e6:.2f} M parameters, written to {out}")


if __name__ == "__main__":
    main()
