"""The drafter training loop: data (built once, resumable), a fresh DFlash drafter or a Domino head
on a trained DFlash backbone (the early exit's head: pipeline/train/exit_head.py), AdamW with warm-up
+ cosine decay, resumable checkpoints, a progress bar, W&B logging, and an export in the published
checkpoint layout after every checkpoint."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
import zlib
from typing import Optional
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from decoding.drafting.dflash_drafter import DFlashDrafter, DrafterSpec, load_drafter, resolve_location, save_drafter
from pipeline.errors import ConfigError
from pipeline.models import cpu_has_native_bf16, cuda_has_native_bf16, load_model, stop_token_ids
from pipeline.train.config import TrainConfig
from pipeline.train.data import build_dataset, load_samples
from pipeline.train.feature_scale import FeatureScale, rms_of_rows, run_feature_scale
from pipeline.train.objectives import dflash_loss, domino_loss, sample_blocks
from pipeline.train.prompts import training_prompts

log = logging.getLogger(__name__)


def new_drafter(cfg: TrainConfig, target_config) -> DFlashDrafter:
    d = cfg.drafter
    spec = DrafterSpec(
        hidden_size=target_config.hidden_size, num_hidden_layers=d.num_layers,
        num_attention_heads=target_config.num_attention_heads, num_key_value_heads=target_config.num_key_value_heads,
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // target_config.num_attention_heads,
        intermediate_size=d.intermediate_size, vocab_size=target_config.vocab_size,
        target_layer_ids=list(d.target_layer_ids), mask_token_id=d.mask_token_id, block_size=d.block_size,
        rms_norm_eps=target_config.rms_norm_eps, rope_theta=_rope_theta(target_config),
        num_target_layers=target_config.num_hidden_layers)
    torch.manual_seed(d.seed)
    model = DFlashDrafter(spec)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)  # Qwen3 initializer_range
    return model


@torch.no_grad()
def scale_fc_columns(model: DFlashDrafter, samples: list[dict]) -> None:
    """Data-dependent start of fc (weights only; the checkpoint format is unchanged): the tapped features
    have a few huge constant dimensions (attention-sink style outliers: one dimension of layer 27
    averages ~450 while the median spread is ~14), which would make every fused context row point
    the same way; scaling fc's input columns once by median(std)/std of each feature lets every dimension
    count from the first step (Adam then steps in the raw coordinates; drafter.feature_scale=rms instead
    trains in coordinates divided by each feature's RMS, and does not use this)."""
    feats = torch.cat([s["hidden"][1:].reshape(len(s["hidden"]) - 1, -1).float() for s in samples[:64]])
    std = feats.std(dim=0).clamp(min=1e-3)
    model.fc.weight.mul_((std.median() / std)[None].to(model.fc.weight.dtype))


@torch.no_grad()
def start_norm_at_target_gain(model: DFlashDrafter, target) -> None:
    """The output norm starts with the target's final norm's gain, since the drafter's output is read by
    the target's lm_head."""
    gain = target_final_norm_gain(target, model.norm.weight.numel())
    if gain is not None:
        model.norm.weight.copy_(gain.to(model.norm.weight))


@torch.no_grad()
def target_final_norm_gain(target, hidden_size: int) -> Optional[torch.Tensor]:
    """The per-dimension gain g [hidden_size] (float32, CPU) of the target's final norm (`model.norm`) when
    it computes x / rms(x) * g, else None: the start of a drafter's plain RMSNorm whose output the target's
    lm_head reads. Read off the norm's output, not its weight, so Gemma's `1 + weight` gives 1 + weight;
    a norm that is not such a scale (a LayerNorm with a bias, say) fails the random probe."""
    norm = getattr(target.model, "norm", None)
    weight = getattr(norm, "weight", None)
    if weight is None or weight.numel() != hidden_size:
        return None
    device, dtype = weight.device, weight.dtype
    # a constant row of rms 100 reads out g (the norm's eps vanishes beside 100^2)
    gain = norm(torch.full((1, hidden_size), 100.0, device=device, dtype=dtype)).float().cpu()[0]
    probe = torch.randn(4, hidden_size, generator=torch.Generator().manual_seed(0))
    plain = probe * torch.rsqrt(probe.pow(2).mean(-1, keepdim=True)) * gain
    theirs = norm(probe.to(device, dtype)).float().cpu()
    return gain if torch.allclose(theirs, plain, atol=1e-2, rtol=1e-2) else None


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def continued_dflash(location: str, folder: Path, cfg: TrainConfig, target_config) -> tuple[DFlashDrafter, dict]:
    """(drafter, its training.json or {}) from a trained DFlash checkpoint (`drafter.init_from`=location, resolved
    to `folder` once: ours or a published one), for a further leg with a fresh optimizer and schedule. Its
    architecture (layers, taps, block size, mask token) is the checkpoint's; the target must be the one it reads."""
    model = load_drafter(str(folder), dtype=torch.float32)
    spec, c, d = model.spec, target_config, cfg.drafter
    if spec.is_domino:
        raise ConfigError(f"drafter.init_from={location} is a Domino checkpoint; drafter=dflash continues a DFlash one")
    if (spec.hidden_size, spec.vocab_size) != (c.hidden_size, c.vocab_size) or max(spec.target_layer_ids) >= \
            c.num_hidden_layers:
        raise ConfigError(f"drafter.init_from={location}: taps layers {list(spec.target_layer_ids)} of a "
                          f"{spec.hidden_size}-wide, {spec.vocab_size}-token target; model {cfg.model.name} is "
                          f"{c.hidden_size}-wide with {c.vocab_size} tokens and {c.num_hidden_layers} layers")
    mine = (spec.num_hidden_layers, list(spec.target_layer_ids), spec.block_size, spec.mask_token_id)
    if mine != (d.num_layers, list(d.target_layer_ids), d.block_size, d.mask_token_id):
        log.info("drafter.init_from keeps its architecture: %d layers, taps %s, block %d, mask token %d "
                 "(the drafter.* values of this run are not used)", *mine)
    return model, training_record(folder)


def training_record(folder: Path) -> dict:
    """A checkpoint's training.json ({} if it has none, e.g. a published one): a continued leg's totals start there."""
    record = folder / "training.json"
    return json.loads(record.read_text()) if record.is_file() else {}


def domino_from_dflash(cfg: TrainConfig, backbone: Path) -> DFlashDrafter:
    """Same backbone weights (`drafter.init_from`, resolved to `backbone`), plus a fresh Domino head whose
    output layer starts at zero, so training starts exactly from DFlash's drafts."""
    d = cfg.drafter
    base = load_drafter(str(backbone), dtype=torch.float32)
    if base.spec.is_domino:
        raise ConfigError(f"drafter.init_from={d.init_from} is already a Domino checkpoint")
    spec = DrafterSpec(**{**base.spec.__dict__, "projector_type": "domino", "gru_hidden_dim": d.gru_hidden_dim,
                          "emb_dim": d.emb_dim, "pure_draft_prefix_len": d.pure_draft_prefix_len,
                          "shift_label": d.shift_label})
    torch.manual_seed(d.seed)
    model = DFlashDrafter(spec)
    model.load_state_dict(base.state_dict(), strict=False)
    torch.nn.init.normal_(model.embed_proj[0].weight, std=0.02)
    torch.nn.init.zeros_(model.embed_proj[2].weight)
    return model


def check_leg(state_dir: Path, out_dir: Path, init_from: Optional[str], init_folder: Optional[Path],
              prior_steps: int) -> None:
    """A state dir holds one run's state: a continued leg must not resume a first leg's optimizer and step
    (nor the reverse), and must not publish over the checkpoint it continues (`init_from` as written,
    `init_folder` where it resolved). `leg.json` says whose it is."""
    leg = {"init_from": str(init_folder.resolve()) if init_from else None, "init_steps": prior_steps,
           # the weights too: a folder retrained in place is another starting point
           **({"init_weights": weights_digest(init_folder)} if init_from else {})}
    # the folder it resolved to, and the spelling itself: a working-directory `drafters/...` that is also the
    # default out_dir resolves to the shipped copy only until this leg's first export lands there
    if init_from and out_dir.resolve() in (Path(leg["init_from"]), Path(init_from).expanduser().resolve()):
        raise ConfigError(f"drafter.out_dir={out_dir} is the checkpoint drafter.init_from continues; "
                          "export the new leg elsewhere")
    marker = state_dir / "leg.json"
    if (state_dir / "train_state.pt").exists():
        theirs = json.loads(marker.read_text()) if marker.exists() else {"init_from": None, "init_steps": 0}
        if "init_weights" not in theirs:  # a marker from before the weights were recorded: their folder decides
            theirs = {**theirs, **({"init_weights": leg["init_weights"]} if "init_weights" in leg else {})}
        if theirs != leg:
            if {**theirs, "init_weights": None} == {**leg, "init_weights": None}:
                raise ConfigError(f"drafter.state_dir={state_dir} holds a state begun from other weights in "
                                  f"{leg['init_from']} (retrained since): give this run its own drafter.state_dir")
            whose = (f"a run begun from {theirs['init_from']} (at its step {theirs['init_steps']})"
                     if theirs["init_from"] else "a run from scratch")
            mine = f"begins from {leg['init_from']} at its step {prior_steps}" if init_from else "starts from scratch"
            raise ConfigError(f"drafter.state_dir={state_dir} holds the state of {whose}; this run {mine}: give it its "
                              "own drafter.state_dir")
    marker.write_text(json.dumps(leg))


def weights_digest(folder: Path) -> str:
    """A checkpoint folder's config and weights, read in chunks."""
    digest = hashlib.sha256()
    for path in [folder / "config.json", *sorted(folder.glob("*.safetensors")), *sorted(folder.glob("*.bin"))]:
        if path.is_file():
            with path.open("rb") as handle:  # hashlib.file_digest needs Python 3.11; the project supports 3.10
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def learning_rate(step: int, cfg) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def lambda_base(step: int, cfg) -> float:
    ramp = min(1.0, step / max(1, 0.6 * cfg.steps))
    return cfg.lambda_start + (cfg.lambda_end - cfg.lambda_start) * ramp


def compute_loss(model, embed, lm_head, sample, blocks, cfg, step):
    d, mask_token = cfg.drafter, model.spec.mask_token_id  # a checkpoint's own (a continued leg, Domino's backbone)
    if d.kind == "dflash":
        return dflash_loss(model, embed, lm_head, sample, blocks, mask_token)
    return domino_loss(model, embed, lm_head, sample, blocks, mask_token, lambda_base(step, d))


def mean_per_key(metrics: list[dict[str, float]]) -> dict[str, float]:
    """Each metric averaged over the dicts that have it (a short answer lacks top1_pos3)."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for one in metrics:
        for k, v in one.items():
            totals[k] = totals.get(k, 0.0) + v
            counts[k] = counts.get(k, 0) + 1
    return {k: v / counts[k] for k, v in totals.items()}


@torch.no_grad()
def validate(model, embed, lm_head, samples, cfg) -> dict:
    gen = torch.Generator().manual_seed(1234)
    scored = []
    for sample in samples:
        blocks = sample_blocks(sample["ids"], sample["prompt_len"], model.spec.block_size, cfg.drafter.num_anchors,
                               cfg.drafter.loss_decay_gamma, model.spec.shift_label, gen)
        if blocks is None:  # an answer too short for a block: not scored, not counted
            continue
        scored.append(compute_loss(model, embed, lm_head, sample, blocks, cfg, cfg.drafter.steps)[1])
    if not scored:
        log.warning("no validation answer is long enough for a %d-token block: no val/ metrics", model.spec.block_size)
    return {f"val/{k}": v for k, v in mean_per_key(scored).items()}


def training_samples(cfg: TrainConfig, target, tokenizer, tap_layers: Optional[list[int]] = None) -> list[dict]:
    """The answer shards (built once, resumable; they store the hidden states of `tap_layers`, the drafter's
    taps, default `drafter.target_layer_ids`), or the corpus of `data.corpus` (token ids only: the target's
    features are recomputed by teacher-forced forwards, `with_taps`), in a seeded shuffle: the first
    val_sequences validate."""
    if cfg.data.corpus:
        from pipeline.train.corpus import load_corpus

        samples = load_corpus(cfg.data.corpus)
        # validation: the answers whose prompts hash lowest (seeded). A run resumed on a grown corpus never
        # trains on its validation answers: one of them that was there before was among the lowest then too
        def key(sample):
            return zlib.crc32(sample["ids"][:sample["prompt_len"]].numpy().tobytes(), cfg.data.seed)

        ordered = sorted(samples, key=key)
        val, rest = ordered[:cfg.drafter.val_sequences], ordered[cfg.drafter.val_sequences:]
        random.Random(cfg.data.seed).shuffle(rest)
        return val + rest
    prompts = training_prompts(cfg.data.num_prompts, cfg.data.seed)
    taps = list(cfg.drafter.target_layer_ids if tap_layers is None else tap_layers)
    paths = build_dataset(target, tokenizer, prompts, taps, Path(cfg.data.dir),
                          cfg.data.batch_size, cfg.data.max_new_tokens, stop_token_ids(target, tokenizer),
                          progress=lambda i, n: log.info("data: shard %d/%d", i, n),
                          template_kwargs=cfg.model.chat_template_kwargs)
    samples = load_samples(paths)
    random.Random(cfg.data.seed).shuffle(samples)
    return samples


@torch.no_grad()
def with_taps(sample: dict, target, layers: list[int], max_len: int | None = None) -> dict:
    """`sample` with the tapped layers' hidden states of every token but the last ([T-1, k, H], fp16 as
    the stored shards), from one teacher-forced target forward: a corpus stores token ids only."""
    if "hidden" in sample:
        return sample
    ids = sample["ids"][:max_len]
    out = target(input_ids=ids[None].to(target.device), output_hidden_states=True, logits_to_keep=1)
    hidden = torch.stack([out.hidden_states[layer + 1][0, :-1] for layer in layers], dim=1)
    return {**sample, "ids": ids, "hidden": hidden.to(torch.float16).cpu()}


def hidden_rms(samples) -> torch.Tensor:
    """Per-dimension RMS [k*H] of fc's input (the tapped layers' features, as `drafter_forward` flattens
    them) over the rows that predict answer tokens (feature_scale.py)."""
    return rms_of_rows(s["hidden"][max(s["prompt_len"] - 1, 0):].reshape(-1, s["hidden"][0].numel()) for s in samples)


def scaled_taps(sample: dict, scale: FeatureScale) -> dict:
    """`sample` with its tapped features in fc's training coordinates (float32; unchanged for a scale of ones)."""
    if bool((scale.scale == 1).all()):
        return sample
    hidden = sample["hidden"]
    flat = scale.features(hidden.reshape(len(hidden), -1).float())
    return {**sample, "hidden": flat.view(hidden.shape)}


def autocast(cfg, device):
    """bf16 matmuls while training (`drafter.bf16_autocast`; weights, optimizer and losses stay fp32):
    on a CPU with native bf16 or a GPU they are ~2x cheaper; on a CPU without it (AVX2 only) bf16 is
    emulated and ~10x slower than fp32 (measured: an EAGLE-3 step took ~3 min, in fp32 ~15 s), so
    null (the default) turns them on only where bf16 is native."""
    device = torch.device(device)
    wanted = cfg.drafter.bf16_autocast
    if wanted is None:
        wanted = cuda_has_native_bf16(device) if device.type == "cuda" else cpu_has_native_bf16()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bool(wanted))


def resume_state(path: Path, model, optimizer) -> tuple[int, float]:
    """Load a saved training state into model and optimizer: (step, seconds trained), (0, 0) if none."""
    if not path.exists():
        return 0, 0.0
    saved = torch.load(path, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    log.info("resumed at step %d (%.0f s trained)", saved["step"], saved["elapsed_s"])
    return saved["step"], saved["elapsed_s"]


def atomic_save(obj, path: Path) -> None:
    """torch.save through a temporary file: a killed run leaves the previous file whole."""
    torch.save(obj, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)


def save_state(path: Path, model, optimizer, step: int, elapsed: float) -> None:
    atomic_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "elapsed_s": elapsed},
                path)


def progress_bar(d, step: int, show: bool,
                 fields: str = "loss {task.fields[loss]:.3f}  acc_len {task.fields[acc]:.2f}"):
    progress = Progress(TextColumn(f"[bold]train {d.kind}"), BarColumn(), MofNCompleteColumn(), TextColumn(fields),
                        TimeElapsedColumn(), disable=not show)
    return progress, progress.add_task("train", total=d.steps, completed=step, loss=0.0, acc=0.0)


def start_run(cfg: TrainConfig):
    """(state dir, output dir, frozen target, tokenizer) of a training run."""
    d = cfg.drafter
    state_dir, out_dir = Path(d.state_dir), Path(d.out_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_model(cfg.model)
    target.requires_grad_(False)
    return state_dir, out_dir, target, tokenizer


def publish(summary: dict, out_dir: Path, wb) -> dict:
    """training.json next to the exported checkpoint, the W&B summary, one log line."""
    (out_dir / "training.json").write_text(json.dumps(summary, indent=2))
    if wb is not None:
        wb.summary.update(summary)
        wb.finish()
    log.info("trained %s: %s", summary["kind"], summary)
    return summary


def make_wandb(cfg: TrainConfig, run_config: dict, state_dir: Path):
    if cfg.tracker.kind == "none":
        return None
    import wandb

    return wandb.init(project=cfg.tracker.project, entity=cfg.tracker.entity,
                      mode=os.environ.get("WANDB_MODE", cfg.tracker.mode), job_type=f"train_{cfg.drafter.kind}",
                      config=run_config, dir=str(state_dir), name=f"train_{cfg.drafter.kind}", reinit="finish_previous")


def train(cfg: TrainConfig, run_config: dict, show_progress: bool = True) -> dict:
    d = cfg.drafter
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if d.kind == "exit_head":
        from pipeline.train.exit_head import train_exit_head

        return train_exit_head(cfg, run_config, show_progress)
    if d.kind == "eagle3":
        from pipeline.train.eagle3 import train_eagle3

        return train_eagle3(cfg, run_config, show_progress)
    state_dir, out_dir, target, tokenizer = start_run(cfg)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()

    if d.kind == "domino" and not d.init_from:
        raise ConfigError("drafter=domino needs drafter.init_from=<trained DFlash checkpoint>")
    prior = {}  # a continued DFlash leg: the checkpoint's own training.json
    init_folder = resolve_location(d.init_from) if d.init_from else None  # once: a hub id is one download
    continued = d.kind == "dflash" and bool(d.init_from)
    if d.kind == "domino":
        model = domino_from_dflash(cfg, init_folder)
    elif continued:
        model, prior = continued_dflash(d.init_from, init_folder, cfg, target.config)
    else:
        model = new_drafter(cfg, target.config)
    prior_steps = int(prior.get("steps", 0))
    # Domino's init_from is its backbone, not a leg to continue; its state dir is still that backbone's alone
    check_leg(state_dir, out_dir, d.init_from, init_folder, prior_steps)
    layers = list(model.spec.target_layer_ids)  # a checkpoint's own taps (Domino's backbone, a continued leg)
    samples = training_samples(cfg, target, tokenizer, layers)
    raw_taps = lambda sample: with_taps(sample, target, layers, d.max_train_len)  # noqa: E731 - the corpus: recomputed
    held_out, train_set = samples[:d.val_sequences], samples[d.val_sequences:]
    fresh = d.kind == "dflash" and not continued
    # measured on the first 32 training answers, as EAGLE-3's
    scale = run_feature_scale(d.feature_scale, state_dir, model, lambda: hidden_rms(map(raw_taps, train_set[:32])), fresh)
    taps = lambda sample: scaled_taps(raw_taps(sample), scale)  # noqa: E731 - fc's coordinates (feature_scale)
    val = [taps(s) for s in held_out]
    if fresh:
        if d.feature_scale == "none":  # rms: the random start stays as drawn, in the scaled coordinates (feature_scale.py)
            scale_fc_columns(model, [raw_taps(s) for s in train_set[:64]])
        start_norm_at_target_gain(model, target)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=d.lr, weight_decay=0.01)
    resume_path = state_dir / "train_state.pt"
    step, elapsed = resume_state(resume_path, model, optimizer)
    # a continued leg does not replay the first one's draws
    gen = torch.Generator().manual_seed(d.seed * 1000 + prior_steps + step)
    rng = random.Random(d.seed * 1000 + prior_steps + step)
    wb = make_wandb(cfg, run_config, state_dir)

    def checkpoint(final: bool = False) -> dict:
        save_state(resume_path, model, optimizer, step, elapsed)
        with scale.folded(model):
            save_drafter(model, out_dir)
        metrics = validate(model.eval(), embed, lm_head, val, cfg) if final or step % (5 * d.checkpoint_every) == 0 else {}
        model.train()
        return metrics

    progress, task = progress_bar(d, step, show_progress)
    budget_s = d.time_budget_min * 60
    with progress:
        while step < d.steps and elapsed < budget_s:
            t0 = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, d)
            optimizer.zero_grad(set_to_none=True)
            step_metrics = []
            batch = []  # the sequences long enough for a block: the step averages over them alone
            for sample in map(taps, rng.sample(train_set, d.seqs_per_step)):
                blocks = sample_blocks(sample["ids"], sample["prompt_len"], model.spec.block_size, d.num_anchors,
                                       d.loss_decay_gamma, model.spec.shift_label, gen)
                if blocks is not None:
                    batch.append((sample, blocks))
            for sample, blocks in batch:
                with autocast(cfg, target.device):
                    loss, metrics = compute_loss(model, embed, lm_head, sample, blocks, cfg, step)
                (loss / len(batch)).backward()
                step_metrics.append(metrics)
            agg = mean_per_key(step_metrics)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            elapsed += time.perf_counter() - t0
            progress.update(task, completed=step, loss=agg.get("loss", 0.0), acc=agg.get("accept_len", 0.0))
            logged = {f"train/{k}": v for k, v in agg.items()} | {"train/lr": optimizer.param_groups[0]["lr"]}
            if step % d.checkpoint_every == 0:
                logged |= checkpoint()
                log.info("step %d: %s", step, {k: round(v, 4) for k, v in logged.items()})
            if wb is not None:
                wb.log(logged, step=step)
    final = checkpoint(final=True)
    summary = {"kind": d.kind, "steps": prior_steps + step,
               "train_minutes": round(prior.get("train_minutes", 0) + elapsed / 60, 1), "sequences": len(train_set),
               "tokens": sum(len(s["ids"]) for s in samples), "feature_scale": d.feature_scale,
               **({"init_from": d.init_from, "init_steps": prior_steps, "leg_steps": step} if continued else {}),
               # this run's (a continued checkpoint's: its last leg's) objective and schedule, as configured when
               # it finished (a resumed run: its last start's values)
               "recipe": {"lr": d.lr, "warmup_steps": d.warmup_steps, "seqs_per_step": d.seqs_per_step,
                          "num_anchors": d.num_anchors, "loss_decay_gamma": d.loss_decay_gamma, "seed": d.seed,
                          **({"lambda_start": d.lambda_start, "lambda_end": d.lambda_end} if d.kind == "domino" else {})},
               **{k: round(v, 4) for k, v in final.items()}}
    return publish(summary, out_dir, wb)
