"""Does the engine run a model family? Every method on a tiny random model of each family of
`pipeline.zoo.PROBED_ARCHITECTURES` (dense, MoE, latent-attention and scaled families; or of ARCHITECTURES, the
tested matrix of tests/decoding/test_architectures.py), with random
drafters of the matching shape (pipeline/zoo.py), on a repetitive prompt and a random one:
- AR against the model's own uncached greedy forward (token for token);
- the readout check of the layer-subset path (decoding/engine/readout.py) and that path over all layers
  against the model's forward (max |difference| of the logits);
- at T = 0 every lossless method against AR (fp32: token for token), the lossy ones run; at T = 1 every method runs;
- with `--static`, the static forward of `model.cuda_graph` (decoding/engine/static_forward.py): AR and every
  lossless method at T = 0 on the target replaying its forwards by emulation, against AR (fp32), and its captured
  function on the meta device in bf16, where a host read of a device value (which a CUDA graph cannot hold) fails.

    python benchmarks/arch_probe.py [--archs granite,cohere] [--methods ar,sd_slim,via_sd] [--tokens 24] [--static]

One line per family (a family with layer types the engine does not handle: its one-line refusal), then what
failed; last line: `families probed: N, every check passed: <names>` (exit 1 where a check failed).
A random model accepts drafts only by chance: this checks that the methods run and stay
lossless there, not how well they draft.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from decoding.engine.attention_layout import UnsupportedArchitecture
from decoding.engine.cuda_graph import GraphReplayer
from decoding.engine.loop import generate
from decoding.engine.target import TargetModel
from decoding.methods.ar import AR
from pipeline.errors import ConfigError
from pipeline.zoo import (ARCHITECTURES, LOSSLESS, METHODS, PROBED_ARCHITECTURES, build_method, mixed_prompts,
                          random_target, static_passes_on_meta, subset_and_full_logits, uncached_greedy)


def probe_static(arch: str, target: TargetModel, methods: list[str], tokens: int, prompts, ar,
                 folder: Path) -> tuple[str, list[str]]:
    """(the static forward's part of the line, what failed): the lossless methods at T = 0 on the target replaying
    its forwards by emulation, against AR; its captured function on the meta device (bf16)."""
    failed = []
    try:
        graphed = TargetModel(target.model, graphs=GraphReplayer(True, "model.cuda_graph", emulate=True))
    except ConfigError as err:  # a refusal in one line is an answer, not a failure
        return f"static not replayed ({str(err).splitlines()[0]})", []
    lossless = [m for m in methods if m in LOSSLESS]
    equal = 0
    for name in lossless:
        try:
            method = AR() if name == "ar" else build_method(name, graphed, folder)
            outs = [generate(method, graphed, p, max_new_tokens=tokens).new_tokens for p in prompts]
        except Exception as err:  # noqa: BLE001 - a crash is a result here
            failed.append(f"static {name}: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
            continue
        if outs == ar:
            equal += 1
        else:
            failed.append(f"static {name} T=0: differs from AR (fp32)")
    try:
        static_passes_on_meta(arch)
        meta = "meta ok"
    except Exception as err:  # noqa: BLE001 - the host read's error is the result
        meta = "meta fails"
        failed.append(f"static pass on the meta device (bf16): {type(err).__name__}: {str(err).splitlines()[0][:160]}")
    return f"static {equal}/{len(lossless)} = AR, {meta}", failed


def probe(arch: str, methods: list[str], tokens: int, static: bool = False) -> tuple[str, list[str]]:
    """(the family's line, what failed). A family the engine refuses (`UnsupportedArchitecture`: one line) is
    reported as refused, not as a failure."""
    try:
        target = random_target("tiny", arch=arch)
    except UnsupportedArchitecture as err:
        return f"{arch:10s} refused: {str(err).splitlines()[0]}", []
    prompts = mixed_prompts(2, 500)
    ar = [generate(AR(), target, p, max_new_tokens=tokens).new_tokens for p in prompts]
    failed = [] if ar == [uncached_greedy(target.model, p, tokens) for p in prompts] else ["AR != uncached forward"]
    try:
        target.readout.check_once(target.model)  # its one line, before the subset pass would raise it
        subset, full = subset_and_full_logits(target, prompts[1])
        gap = (subset - full).abs().max().item()
        readout = f"subset path {gap:.1e}"
        if gap > 1e-4:
            failed.append(f"layer-subset path differs from the forward by {gap:.3g}")
    except Exception as err:  # noqa: BLE001 - the check's one line is the result
        readout = "subset path refused"
        failed.append(f"readout: {str(err).splitlines()[0]}")
    folder = Path(tempfile.mkdtemp(prefix=f"arch_probe_{arch}_"))
    equal = ran = 0
    for name in (m for m in methods if m != "ar"):
        for temperature in (0.0, 1.0):
            try:
                method = build_method(name, target, folder)
                outs = [generate(method, target, p, max_new_tokens=tokens, temperature=temperature, seed=1).new_tokens
                        for p in prompts]
            except Exception as err:  # noqa: BLE001 - a crash is a result here
                failed.append(f"{name} T={temperature:g}: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
                continue
            ran += 1
            if temperature == 0 and name in LOSSLESS:
                if outs == ar:
                    equal += 1
                else:
                    failed.append(f"{name} T=0: differs from AR (fp32)")
    lossless = sum(1 for m in methods if m in LOSSLESS and m != "ar")
    line = (f"{arch:10s} {target.config.model_type:10s} {readout:22s} {equal}/{lossless} lossless = AR, "
            f"{ran}/{2 * (len(methods) - ('ar' in methods))} runs")
    if static:
        part, static_failed = probe_static(arch, target, methods, tokens, prompts, ar, folder)
        line, failed = f"{line}; {part}", failed + static_failed
    return line, failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default=",".join(PROBED_ARCHITECTURES))
    ap.add_argument("--methods", default=",".join(m for m in METHODS if m != "dominotree_reference"))
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--static", action="store_true", help="also the static forward of model.cuda_graph")
    args = ap.parse_args()
    archs, methods = args.archs.split(","), args.methods.split(",")
    unknown = [a for a in archs if a not in {**ARCHITECTURES, **PROBED_ARCHITECTURES}] + \
        [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)}")
    torch.set_num_threads(1)
    passed, refused, problems = [], [], []
    print(f"{len(archs)} families, fp32, {len(methods)} methods at T=0 and 1, {args.tokens} tokens"
          + (", and the static forward" if args.static else ""), flush=True)
    for arch in archs:
        line, failed = probe(arch, methods, args.tokens, args.static)
        print(line, flush=True)
        problems += [f"  {arch}: {f}" for f in failed]
        if " refused: " in line:
            refused.append(arch)
        elif not failed:
            passed.append(arch)
    print("\n".join(problems) if problems else "no failures")
    if refused:
        print(f"refused with one line: {', '.join(refused)}")
    print(f"families probed: {len(archs)}, every check passed: {', '.join(passed) or 'none'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
