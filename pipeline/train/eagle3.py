"""Training of the EAGLE-3 drafter (decoding/drafting/eagle3_drafter.py) with the training-time test
(EAGLE-3 `traineagle3/main.py`, SpecForge `OnlineEagle3Model`).

Per sequence: one teacher-forced target forward (no grad) gives the three layers' features and the
target's distribution at every position. Step 0 runs the drafter on fc(features) with a causal mask,
exactly the rows decoding caches; step j > 0 feeds the drafter its own step-(j-1) outputs with the
next ground-truth token, at RoPE position t + j, each row seeing the step-0 rows up to itself and its
own rows of the earlier steps (the "diagonal"): the same pass, mask and positions as a depth-(j+1)
node of the decoding tree (the drafter's own `step`, so training and decoding cannot drift apart).
The answers are the target's own greedy output, so ground-truth inputs are what an accepted draft
would have been.

Loss of step j: soft cross-entropy against the target's distribution renormalised over the draft
vocabulary, on answer positions whose target argmax lies in it; total sum_j decay^j loss_j (0.8).
Validation (held-out answers, T=0): top-1 agreement per step and the expected accept length of a
`ttt_length` chain (1 + leading agreeing steps per position, bonus included).

Departures: the draft vocabulary comes from counts over the training answers (as EAGLE's `scandata`)
and is 8192 wide by default for every target (EAGLE used 32000 for Llama-3.1-8B); each step's loss mask
marks the token that step predicts (the reference's masks sit two positions earlier: it shifts ids and
targets per step but not the mask, so it drops the first answer token's prediction and scores one past the
answer's end); each step's loss is averaged over its valid rows of the sequence (the reference averages
over all rows, masked ones included: answer-heavy sequences weigh more there and the scale differs).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import torch

from decoding.drafting.dflash_drafter import resolve_location
from decoding.drafting.eagle3_drafter import (Eagle3Drafter, Eagle3Spec, default_aux_layer_ids, load_eagle3,
                                             save_eagle3, taps_in_range, vocab_mapping)
from decoding.engine.readout import Readout as ModelReadout
from pipeline.errors import ConfigError
from pipeline.train.config import TrainConfig
from pipeline.train.exit_head import Readout
from pipeline.train.feature_scale import FeatureScale, rms_of_rows, run_feature_scale
from pipeline.train.trainer import (autocast, check_leg, learning_rate, make_wandb, progress_bar,
                                    publish, resume_state, _rope_theta, save_state, start_run,
                                    target_final_norm_gain, training_record, training_samples)

log = logging.getLogger(__name__)


def new_eagle3(target_config, layer_ids: list[int], draft_vocab_size: int, counts: torch.Tensor, seed: int):
    """A fresh drafter shaped like the target's layers (EAGLE-3: one decoder layer of the target's family)."""
    c = target_config
    spec = Eagle3Spec(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                      vocab_size=c.vocab_size, draft_vocab_size=min(draft_vocab_size, c.vocab_size),
                      target_hidden_size=c.hidden_size,
                      head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                      rms_norm_eps=c.rms_norm_eps, rope_theta=_rope_theta(c),
                      max_position_embeddings=c.max_position_embeddings, aux_layer_ids=list(layer_ids))
    torch.manual_seed(seed)
    model = Eagle3Drafter(spec)
    for p in model.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    model.d2t, model.t2d = vocab_mapping(counts, spec.draft_vocab_size)
    return model


@torch.no_grad()
def head_from_target(model: Eagle3Drafter, target) -> None:
    """Start the draft head as the target's own: lm_head rows of the draft vocabulary and the final
    norm, then trained. EAGLE-3's and SpecForge's trainers start the draft lm_head at random; vLLM's
    speculators copies the target's rows and freezes them (its final norm is its own). On a CPU budget of
    under one pass over the corpus the drafter then learns the target's last hidden state rather than a
    new readout."""
    draft_ids = model.to_target_ids(torch.arange(model.spec.draft_vocab_size))
    # the target's logit scale folded into the rows (Granite, Cohere; decoding/engine/readout.py), so the head starts
    # at the teacher's logits; a soft-cap (Gemma 2) cannot be folded into a linear head
    factor = ModelReadout.of(target.config).linear_factor
    model.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_ids].float() * factor)
    gain = target_final_norm_gain(target, model.spec.hidden_size)
    if gain is None:
        raise ConfigError("drafter.head_init=target: the target's final norm (model.norm) is not an RMSNorm of the "
                          "drafter's width; use drafter.head_init=random")
    model.norm.weight.copy_(gain.to(model.norm.weight))


@torch.no_grad()
def teacher_pass(target, ids: torch.Tensor, layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [T, 3H] of the three layers, final-norm hidden states [T, H]), float32."""
    out = target(input_ids=ids[None].to(target.device), output_hidden_states=True, logits_to_keep=1)
    # hidden_states[i + 1] is the output of decoder layer i; the last entry is after the final norm
    feats = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1).float()
    return feats, out.hidden_states[-1][0].float()


@torch.no_grad()
def feature_rms(target, samples: list[dict], layer_ids: list[int]) -> torch.Tensor:
    """Per-dimension RMS [3H] of the tapped features over the rows that predict answer tokens."""
    return rms_of_rows(teacher_pass(target, s["ids"], layer_ids)[0][max(s["prompt_len"] - 1, 0):] for s in samples)


def feature_scale(mode: str, state_dir: Path, model: Eagle3Drafter, target, samples: list[dict],
                  layer_ids: list[int], fresh: bool, count: int = 32) -> FeatureScale:
    """The run's FeatureScale (pipeline/train/feature_scale.py), measured on the first `count` training answers."""
    return run_feature_scale(mode, state_dir, model, lambda: feature_rms(target, samples[:count], layer_ids), fresh)


def ttt_hidden(drafter: Eagle3Drafter, embed, feats, ids, ttt_length: int):
    """The drafter's outputs h_j [T-1, H] of steps j = 0..ttt_length-1 over the rows t = 0..T-2 (row t of
    step j: the depth-j tree node after the committed rows 0..t whose path is ids[t+2 : t+2+j])."""
    n = len(ids) - 1
    causal = torch.ones(n, n, dtype=torch.bool, device=feats.device).tril()  # step 0: the cached rows
    eye = torch.eye(n, dtype=torch.bool, device=feats.device)
    hidden = drafter.fc(feats[:n].to(drafter.fc.weight.dtype))
    empty = drafter.new_cache()
    past_k, past_v = empty.keys.to(hidden.dtype), empty.values.to(hidden.dtype)
    rows = torch.arange(n, device=ids.device)
    for j in range(ttt_length):
        inputs = ids[(rows + 1 + j).clamp(max=len(ids) - 1)]  # beyond the end: masked out of every loss
        visible = torch.cat([causal, *([eye] * j)], dim=1)  # step-0 rows up to t, own rows of the earlier steps
        h, past_k, past_v = drafter.step(embed(inputs).to(hidden.dtype), hidden, rows.to(feats.device) + j, past_k,
                                         past_v, visible)
        yield h
        hidden = h


def ttt_steps(drafter: Eagle3Drafter, embed, feats, finals, readout: Readout, ids, prompt_len: int, ttt_length: int):
    """Per step j: (soft-CE loss, top-1 agreement [T-1] bool, valid [T-1] bool) over the rows t = 0..T-2."""
    n = len(ids) - 1
    t2d = drafter.t2d
    # the target's distribution at every position, once per sequence (step j reads rows t+1+j), in fp32 even
    # inside the trainer's bf16 autocast
    with torch.no_grad(), torch.autocast(finals.device.type, enabled=False):
        full = readout.teacher(finals.float())  # [T, V], soft-capped as the target's (Gemma 2)
        best_all = full.argmax(-1)
        teacher_all = torch.softmax(full[:, t2d], dim=-1)  # renormalised over the draft vocabulary
        del full
    out = []
    for j, h in enumerate(ttt_hidden(drafter, embed, feats, ids, ttt_length)):
        target_row = torch.arange(n, device=feats.device) + 1 + j  # row t predicts x_{t+2+j}: target logits t+1+j
        valid = (target_row <= len(ids) - 2) & (target_row + 1 >= prompt_len)  # the predicted token is an answer's
        rows = target_row.clamp(max=len(ids) - 1)
        best, teacher = best_all[rows], teacher_all[rows]
        keep = valid & t2d[best]
        logq = torch.log_softmax(drafter.logits(h).float(), dim=-1)
        loss = (-(teacher * logq).sum(-1) * keep).sum() / keep.sum().clamp(min=1)
        out.append((loss, drafter.to_target_ids(logq.argmax(-1)) == best, valid))
    return out


def expected_accept_length(agreements: list[torch.Tensor], valid: list[torch.Tensor]) -> tuple[float, int]:
    """Sum over the rows where step 0 is valid of 1 + leading agreeing steps, and their count."""
    run = torch.ones_like(agreements[0], dtype=torch.bool)
    total = torch.ones_like(agreements[0], dtype=torch.float32)
    for agree, ok in zip(agreements, valid):
        run = run & agree & ok
        total += run.float()
    rows = valid[0]
    return float(total[rows].sum()), int(rows.sum())


def token_counts(samples: list[dict], vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(s["ids"][s["prompt_len"]:], minlength=vocab_size)[:vocab_size]
    return counts


def continued_eagle3(location: str, folder: Path, target_config, layer_ids: list[int]) -> tuple[Eagle3Drafter, dict]:
    """(drafter, its training.json or {}) from a trained checkpoint (`drafter.init_from`=location, resolved to
    `folder` once), for a further leg with a fresh optimizer and schedule: its draft vocabulary and layer
    taps are kept, so they must match this run."""
    model = load_eagle3(str(folder), dtype=torch.float32)
    spec, c = model.spec, target_config
    if list(spec.aux_layer_ids) != list(layer_ids) or spec.hidden_size != c.hidden_size \
            or spec.vocab_size != c.vocab_size:
        raise ConfigError(f"drafter.init_from={location}: taps layers {list(spec.aux_layer_ids)} of a "
                          f"{spec.hidden_size}-wide, {spec.vocab_size}-token target; this run taps {layer_ids} of "
                          f"a {c.hidden_size}-wide, {c.vocab_size}-token one")
    return model, training_record(folder)


@torch.no_grad()
def validate(drafter, embed, readout, target, samples, d, scale: FeatureScale | None = None) -> dict:
    """`scale`: the run's FeatureScale while the drafter is in its coordinates (None: a drafter as exported)."""
    agree = [0.0] * d.ttt_length
    count = [0] * d.ttt_length
    accept, rows = 0.0, 0
    for s in samples:
        feats, finals = teacher_pass(target, s["ids"], drafter.spec.aux_layer_ids)
        if scale is not None:
            feats = scale.features(feats)
        steps = ttt_steps(drafter, embed, feats, finals, readout, s["ids"].to(feats.device), s["prompt_len"],
                          d.ttt_length)
        for j, (_, a, ok) in enumerate(steps):
            agree[j] += float((a & ok).sum())
            count[j] += int(ok.sum())
        total, n = expected_accept_length([a for _, a, _ in steps], [ok for _, _, ok in steps])
        accept, rows = accept + total, rows + n
    out = {f"val/top1_step{j}": agree[j] / max(count[j], 1) for j in range(d.ttt_length)}
    out["val/accept_len_chain"] = accept / max(rows, 1)
    return out


def train_eagle3(cfg: TrainConfig, run_config: dict, show_progress: bool = True) -> dict:
    d = cfg.drafter
    state_dir, out_dir, target, tokenizer = start_run(cfg)
    layers = target.config.num_hidden_layers
    layer_ids = list(d.eagle_layer_ids) or default_aux_layer_ids(layers)
    if not taps_in_range(layer_ids, layers):
        raise ConfigError(f"drafter.eagle_layer_ids={layer_ids}: model {cfg.model.name} has {layers} layers: taps "
                          f"are outputs of layers 0..{layers - 2}")

    samples = training_samples(cfg, target, tokenizer)
    if not 1 <= d.val_sequences < len(samples):
        raise ConfigError(f"drafter.val_sequences={d.val_sequences}: needs at least 1 and fewer than the "
                          f"{len(samples)} answers (data.num_prompts)")
    val, train_set = samples[:d.val_sequences], samples[d.val_sequences:]
    prior: dict = {}
    init_folder = None
    if d.init_from:
        if d.head_init == "target":
            raise ConfigError("drafter.head_init=target starts a new drafter; drafter.init_from continues a "
                              "trained one: set one of them")
        init_folder = resolve_location(d.init_from)  # once: a hub id is one download
        model, prior = continued_eagle3(d.init_from, init_folder, target.config, layer_ids)
    else:
        model = new_eagle3(target.config, layer_ids, d.draft_vocab_size,
                           token_counts(train_set, target.config.vocab_size), d.seed)
    if d.head_init == "target":
        head_from_target(model, target)
    prior_steps = int(prior.get("steps", 0))
    if d.init_from and model.spec.draft_vocab_size != d.draft_vocab_size:
        log.info("drafter.init_from keeps its draft vocabulary of %d (drafter.draft_vocab_size=%d is not used)",
                 model.spec.draft_vocab_size, d.draft_vocab_size)
    check_leg(state_dir, out_dir, d.init_from, init_folder, prior_steps)
    scale = feature_scale(d.feature_scale, state_dir, model, target, train_set, layer_ids, fresh=not d.init_from)
    model.train()
    embed = target.get_input_embeddings()
    readout = Readout(target)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=d.lr,
                                  betas=(0.9, 0.95), weight_decay=0.0)
    resume_path = state_dir / "train_state.pt"
    step, elapsed = resume_state(resume_path, model, optimizer)
    rng = random.Random(d.seed * 1000 + prior_steps + step)  # a continued leg does not replay the first one's draws
    wb = make_wandb(cfg, run_config, state_dir)

    def checkpoint(final: bool = False) -> dict:
        save_state(resume_path, model, optimizer, step, elapsed)
        with scale.folded(model):
            save_eagle3(model, out_dir)
        if not (final or step % (5 * d.checkpoint_every) == 0):
            return {}
        metrics = validate(model.eval(), embed, readout, target, val, d, scale)
        model.train()
        return metrics

    progress, task = progress_bar(d, step, show_progress)
    with progress:
        while step < d.steps and elapsed < d.time_budget_min * 60:
            t0 = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, d)
            optimizer.zero_grad(set_to_none=True)
            loss_sum, agree0, n0 = 0.0, 0.0, 0
            for s in rng.sample(train_set, min(d.seqs_per_step, len(train_set))):
                ids = s["ids"][:d.max_train_len]
                feats, finals = teacher_pass(target, ids, layer_ids)
                feats = scale.features(feats)
                with autocast(cfg, target.device):
                    steps = ttt_steps(model, embed, feats, finals, readout, ids.to(feats.device), s["prompt_len"],
                                      d.ttt_length)
                    loss = sum(d.ttt_decay ** j * loss_j for j, (loss_j, _, _) in enumerate(steps))
                (loss / d.seqs_per_step).backward()
                loss_sum += float(loss.detach()) / d.seqs_per_step
                agree0 += float((steps[0][1] & steps[0][2]).sum())
                n0 += int(steps[0][2].sum())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            step += 1
            elapsed += time.perf_counter() - t0
            progress.update(task, completed=step, loss=loss_sum, acc=agree0 / max(n0, 1))
            logged = {"train/loss": loss_sum, "train/top1_step0": agree0 / max(n0, 1),
                      "train/lr": optimizer.param_groups[0]["lr"]}
            if step % d.checkpoint_every == 0:
                logged |= checkpoint()
                log.info("step %d: %s", step, {k: round(v, 4) for k, v in logged.items()})
            if wb is not None:
                wb.log(logged, step=step)
    final = checkpoint(final=True)
    minutes = prior.get("train_minutes", 0) + elapsed / 60
    summary = {"kind": d.kind, "steps": prior_steps + step, "train_minutes": round(minutes, 1),
               "sequences": len(train_set), "tokens": sum(len(s["ids"]) for s in samples), "layer_ids": layer_ids,
               "draft_vocab_size": model.spec.draft_vocab_size, "ttt_length": d.ttt_length,
               "feature_scale": d.feature_scale,
               **({"init_from": d.init_from, "init_steps": prior_steps, "leg_steps": step} if d.init_from else {}),
               **{k: round(v, 4) for k, v in final.items()}}
    return publish(summary, out_dir, wb)
