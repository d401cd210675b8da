"""Drafter training data: the target's own answers to training prompts, with the hidden states of
the tapped target layers for every token (what the drafter sees as context at inference).

Answers come from batched HF `generate` (far cheaper per token on a CPU than batch-1 decoding),
greedy, so the drafter learns exactly the continuations that lossless T=0 decoding will verify.
The tapped hidden states are read off that same generate call (`output_hidden_states`), so no
second pass over the data is needed. One shard per prompt batch; existing shards are kept, so a
killed run resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from pipeline.tasks.chat import build_chat
from pipeline.tasks.base import TaskConfig

log = logging.getLogger(__name__)


def shard_path(data_dir: Path, index: int) -> Path:
    return data_dir / f"shard_{index:04d}.pt"


@torch.inference_mode()
def generate_shard(model, tokenizer, messages: list[str], tap_layers: list[int], max_new_tokens: int,
                   stop_ids: set[int], template_kwargs=None) -> list[dict]:
    """Greedy answers for one batch of user messages, with per-token tapped hidden states."""
    prompts = [build_chat(tokenizer, TaskConfig(), [(m, None)], template_kwargs) for m in messages]
    width = max(len(p) for p in prompts)
    pad = sorted(stop_ids)[0]
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=pad, eos_token_id=sorted(stop_ids),
                         output_hidden_states=True, return_dict_in_generate=True)
    # hidden_states[step][layer + 1]: step 0 covers the prompt, step s > 0 the token generated at s - 1
    taps = torch.stack([torch.cat([step[layer + 1] for step in out.hidden_states], dim=1) for layer in tap_layers],
                       dim=2)  # [B, width + steps - 1, k, H]
    samples = []
    for b, prompt in enumerate(prompts):
        answer = out.sequences[b, width:].tolist()
        end = next((i + 1 for i, t in enumerate(answer) if t in stop_ids), len(answer))
        ids = prompt + answer[:end]
        start = width - len(prompt)
        hidden = taps[b, start:start + len(ids) - 1]  # every token but the last has a hidden state
        samples.append({"ids": torch.tensor(ids), "prompt_len": len(prompt), "hidden": hidden.to(torch.float16)})
    return samples


def build_dataset(model, tokenizer, prompts: list[tuple[str, str]], tap_layers: list[int], data_dir: Path,
                  batch_size: int, max_new_tokens: int, stop_ids: set[int], progress=None,
                  template_kwargs=None) -> list[Path]:
    data_dir.mkdir(parents=True, exist_ok=True)
    # num_prompts is not part of the key: prompt lists are prefix-stable, so more prompts add shards
    meta = {"tap_layers": list(tap_layers), "max_new_tokens": max_new_tokens, "batch_size": batch_size}
    meta_path = data_dir / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()) != meta:
        from pipeline.errors import ConfigError

        raise ConfigError(f"{data_dir} holds data built with other settings; remove it or choose data.dir")
    meta_path.write_text(json.dumps(meta, indent=2))
    paths = []
    for index, first in enumerate(range(0, len(prompts), batch_size)):
        path = shard_path(data_dir, index)
        paths.append(path)
        if not path.exists():
            batch = [text for _, text in prompts[first:first + batch_size]]
            samples = generate_shard(model, tokenizer, batch, tap_layers, max_new_tokens, stop_ids, template_kwargs)
            tmp = path.with_suffix(".tmp")
            torch.save(samples, tmp)
            tmp.rename(path)
            log.info("data shard %d: %d answers, %d tokens", index, len(samples), sum(len(s["ids"]) for s in samples))
        if progress is not None:
            progress(index + 1, -(-len(prompts) // batch_size))
    return paths


def load_samples(paths: list[Path]) -> list[dict]:
    samples = []
    for path in paths:
        samples.extend(torch.load(path, weights_only=True))
    return samples
