"""Runs INSIDE the separate `lade` venv (never imported by the project): the authors' Lookahead
Decoding, PyPI `lade` 0.0.2 (transformers 4.34, LLaMA only), greedy, on prompts given as token ids.

    <lade-venv>/bin/python benchmarks/lade_anchor_child.py job.json result.json

job.json: {"model_dir", "prompts": [[ids]], "max_new_tokens", "level", "window", "guess", "threads"}.
result.json: per prompt the generated ids, lade's step count (one per jforward call, the fused
prefill step included), the rows it sent through the model (the prompt of the fused prefill step
counted as one row, as our prefill is not counted either) and the wall time of the generate call.
"""

import json
import os
import sys
import time

os.environ["USE_LADE"] = "1"

import lade  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main() -> None:
    job = json.load(open(sys.argv[1]))
    torch.set_num_threads(job["threads"])
    lade.augment_all()
    lade.config_lade(LEVEL=job["level"], WINDOW_SIZE=job["window"], GUESS_SET_SIZE=job["guess"], DEBUG=0)
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], torch_dtype=torch.float32).eval()
    steps, rows = [0], [0]
    original = model.jforward_multilevel

    def counting(*args, **kwargs):  # lade counts steps the same way (one per jforward call)
        steps[-1] += 1
        window = sum(len(level) for level in kwargs["past_tokens"] if level is not None)
        rows[-1] += 1 + window + len(kwargs.get("guess_tokens") or [])  # last token + window + guesses
        return original(*args, **kwargs)

    model.jforward_multilevel = counting
    with torch.inference_mode():  # warm-up, not measured
        model.generate(torch.tensor([job["prompts"][0]]), max_new_tokens=8, do_sample=False,
                       eos_token_id=job["eos_token_id"], pad_token_id=job["eos_token_id"])
    results = []
    for ids in job["prompts"]:
        steps.append(0)
        rows.append(0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=job["max_new_tokens"], do_sample=False,
                                 eos_token_id=job["eos_token_id"], pad_token_id=job["eos_token_id"])
        results.append({"new_tokens": out[0, len(ids):].tolist(), "steps": steps[-1], "rows": rows[-1],
                        "wall_s": time.perf_counter() - t0})
    json.dump({"transformers": __import__("transformers").__version__, "torch": torch.__version__,
               "results": results}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
