"""Training of the early-exit drafter's exit head (decoding/drafting/exit_head.py): a tuned-lens translator
on the residual stream after the first `exit_layer` decoder layers, distilled from the full target.

Data: the same answer shards as the block drafters (pipeline/train/data.py; the target's greedy
answers to training prompts that are disjoint from every evaluation prompt). The shards tap other
layers, so one teacher-forced forward per sequence recomputes what this head needs: the residual
stream at `exit_layer` (its input) and the final-norm output (the teacher's logits are that times
lm_head, recomputed per step instead of stored: V floats per token would not fit). Positions are the
ones decoding drafts from, the last prompt token to the last-but-one answer token.

Loss: KL(q || p) at T=1 over a random batch of `tokens_per_step` positions, the tuned-lens objective.
Validation (held-out sequences) reports, for the trained head and for the plain early exit (the
untrained head, A = b = 0): KL, the top-1 agreement with the target (greedy acceptance per token)
and E[sum min(p, q)] (acceptance per token of speculative sampling at T=1).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

from decoding.drafting.exit_head import ExitTranslator, save_exit_head
from pipeline.errors import ConfigError
from decoding.engine.readout import Readout as ModelReadout
from pipeline.train.config import TrainConfig
from pipeline.train.trainer import (learning_rate, make_wandb, progress_bar, publish, resume_state, save_state,
                                    start_run, training_samples)

log = logging.getLogger(__name__)


class Readout:
    """The target's final norm and lm_head, read out in float32 on the lm_head's device: the head
    trains in float32 whatever the model's dtype (bf16 targets included)."""

    def __init__(self, model):
        self.norm = model.model.norm
        self.unembed = model.get_output_embeddings().weight.detach().float()
        self.device = self.unembed.device
        # the model's logit scale and soft-cap (Granite, Cohere, Gemma 2), as the drafter's readout applies them;
        # checked now, not at decoding after hours of training on another model's logits
        self.model_readout = ModelReadout.of(model.config)
        self.model_readout.check_once(model)

    def teacher(self, finals: torch.Tensor) -> torch.Tensor:
        return self.model_readout.read(lambda x: F.linear(x, self.unembed), finals)

    def student(self, head, h: torch.Tensor) -> torch.Tensor:
        return self.model_readout.read(lambda x: F.linear(x, self.unembed), self.norm(head(h)).float())


def drafting_rows(sample: dict) -> slice:
    """The rows decoding drafts from: the last prompt token to the last-but-one answer token."""
    return slice(sample["prompt_len"] - 1, len(sample["ids"]) - 1)


def within_positions(samples: list[dict], limit: int, seed: int) -> list[dict]:
    """A seeded random subset of the answers with at most `limit` drafting positions in all (every answer
    when they fit): the features stay in memory, so a 2 M-token corpus cannot go in whole."""
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed)).tolist()
    picked, total = [], 0
    for i in order:
        rows = drafting_rows(samples[i])
        n = rows.stop - rows.start
        if total + n > limit:
            continue
        picked.append(samples[i])
        total += n
    return picked


@torch.no_grad()
def exit_features(model, samples: list[dict], exit_layer: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual stream after `exit_layer` layers, final-norm output), each [N, H] float32, over the
    drafting positions of every sample."""
    inputs, finals = [], []
    for s in samples:
        # the decoder only: the full-vocabulary logits of every position are not needed here
        out = model.model(input_ids=s["ids"][None].to(model.device), output_hidden_states=True)
        rows = drafting_rows(s)
        # hidden_states[k] is the output of decoder layer k - 1; the last entry is after the final norm
        inputs.append(out.hidden_states[exit_layer][0, rows].to(device, torch.float32))
        finals.append(out.hidden_states[-1][0, rows].to(device, torch.float32))
    return torch.cat(inputs), torch.cat(finals)


@torch.no_grad()
def evaluate_head(readout: Readout, head, inputs, finals, chunk: int = 512) -> dict:
    totals = {"kl": 0.0, "top1": 0.0, "accept_t1": 0.0}
    for first in range(0, len(inputs), chunk):
        logq = torch.log_softmax(readout.teacher(finals[first:first + chunk]), -1)
        logp = torch.log_softmax(readout.student(head, inputs[first:first + chunk]), -1)
        q = logq.exp()
        totals["kl"] += float((q * (logq - logp)).sum())
        totals["top1"] += float((logq.argmax(-1) == logp.argmax(-1)).sum())
        totals["accept_t1"] += float(torch.minimum(q, logp.exp()).sum())
    return {k: v / max(len(inputs), 1) for k, v in totals.items()}


def train_exit_head(cfg: TrainConfig, run_config: dict, show_progress: bool = True) -> dict:
    d = cfg.drafter
    state_dir, out_dir, target, tokenizer = start_run(cfg)
    if not 1 <= d.exit_layer < target.config.num_hidden_layers:
        raise ConfigError(f"drafter.exit_layer={d.exit_layer}: model {cfg.model.name} has "
                          f"{target.config.num_hidden_layers} layers (the exit must be before the last)")

    samples = training_samples(cfg, target, tokenizer)
    if not 1 <= d.val_sequences < len(samples):
        raise ConfigError(f"drafter.val_sequences={d.val_sequences}: needs at least 1 and fewer than the "
                          f"{len(samples)} answers (data.num_prompts)")
    readout = Readout(target)
    val_in, val_final = exit_features(target, samples[:d.val_sequences], d.exit_layer, readout.device)
    train_in, train_final = exit_features(target, within_positions(samples[d.val_sequences:], d.max_train_positions,
                                                                   d.seed), d.exit_layer, readout.device)
    if len(train_in) == 0:
        raise ConfigError("drafter=exit_head: no training positions (raise data.num_prompts or lower "
                          "drafter.val_sequences)")

    torch.manual_seed(d.seed)
    head = ExitTranslator(target.config.hidden_size).to(readout.device)
    baseline = {f"early_exit/{k}": v for k, v in evaluate_head(readout, head, val_in, val_final).items()}
    optimizer = torch.optim.AdamW(head.parameters(), lr=d.lr, weight_decay=0.0)
    resume_path = state_dir / "train_state.pt"
    step, elapsed = resume_state(resume_path, head, optimizer)
    gen = torch.Generator().manual_seed(d.seed * 1000 + step)
    wb = make_wandb(cfg, run_config, state_dir)

    def checkpoint() -> None:
        save_state(resume_path, head, optimizer, step, elapsed)
        save_exit_head(head, out_dir, d.exit_layer)

    progress, task = progress_bar(d, step, show_progress, fields="loss {task.fields[loss]:.3f}")
    with progress:
        while step < d.steps and elapsed < d.time_budget_min * 60:
            t0 = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, d)
            rows = torch.randint(len(train_in), (min(d.tokens_per_step, len(train_in)),), generator=gen)
            with torch.no_grad():
                logq = torch.log_softmax(readout.teacher(train_final[rows]), -1)
            logp = torch.log_softmax(readout.student(head, train_in[rows]), -1)
            loss = F.kl_div(logp, logq, log_target=True, reduction="batchmean")  # KL(q || p)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            step += 1
            elapsed += time.perf_counter() - t0
            loss_value = float(loss.detach())
            progress.update(task, completed=step, loss=loss_value)
            logged = {"train/kl": loss_value, "train/lr": optimizer.param_groups[0]["lr"]}
            if step % d.checkpoint_every == 0:
                checkpoint()
                logged |= {f"val/{k}": v for k, v in evaluate_head(readout, head, val_in, val_final).items()}
                log.info("step %d: %s", step, {k: round(v, 4) for k, v in logged.items()})
            if wb is not None:
                wb.log(logged, step=step)
    checkpoint()
    final = {f"val/{k}": v for k, v in evaluate_head(readout, head, val_in, val_final).items()}
    summary = {"kind": d.kind, "exit_layer": d.exit_layer, "steps": step, "train_minutes": round(elapsed / 60, 1),
               "train_positions": len(train_in), "val_positions": len(val_in),
               **{k: round(v, 4) for k, v in (final | baseline).items()}}
    return publish(summary, out_dir, wb)
