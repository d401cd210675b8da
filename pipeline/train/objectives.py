"""Training objectives of the block drafters, on one training sequence at a time.

DFlash (SpecForge `algorithms/common/dflash_family_model.py` recipe): random anchors from the last prompt
token (decoding's first root) to the answer's end; for each anchor a
block [anchor token, mask x (B-1)] at positions anchor..anchor+B-1 that sees the context strictly
before the anchor plus its own block (blocks never see each other); block row k is labelled with
the token at anchor+k (anchor+k+1 with `shift_label`), row 0 unlabelled; cross-entropy weighted by
exp(-(k-1)/gamma), so early block positions, which decide acceptance, weigh most.

Domino (SpecForge `modeling/draft/domino.py`): the same blocks; the GRU is teacher-forced on the true tokens
[anchor, t1, ...], the correction is added from position 1 + pure_draft_prefix_len on, and the loss
mixes corrected and base logits, (1 - lambda) * CE(base + corr) + lambda * CE(base), with lambda
annealed by the trainer (base-anchored curriculum).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from decoding.drafting.domino_head import correction


@dataclass
class Blocks:
    anchors: torch.Tensor  # [A]
    rows: torch.Tensor  # [A, B] positions of the block rows
    labels: torch.Tensor  # [A, B] label token per row (-100 = none)
    weights: torch.Tensor  # [A, B] loss weight per row


def sample_blocks(ids: torch.Tensor, prompt_len: int, block_size: int, num_anchors: int, gamma: float,
                  shift_label: bool, generator: torch.Generator) -> Blocks | None:
    """Anchors from the last prompt token (the root of the first decoding step) to the last
    answer token that still has a label after it."""
    n = len(ids)
    first, last = prompt_len - 1, n - 2
    if last < first:
        return None
    span = last - first + 1
    anchors = first + torch.randperm(span, generator=generator)[:min(num_anchors, span)].sort().values
    k = torch.arange(block_size)
    label_pos = anchors[:, None] + k[None] + int(shift_label)
    labels = torch.where(label_pos < n, ids[label_pos.clamp(max=n - 1)], torch.full_like(label_pos, -100))
    first_row = 0 if shift_label else 1
    labels[:, :first_row] = -100
    weights = torch.exp(-(k - first_row).clamp(min=0).float() / gamma)[None].expand(len(anchors), -1).clone()
    weights[labels < 0] = 0.0
    return Blocks(anchors, anchors[:, None] + k[None], labels, weights)


def block_mask(blocks: Blocks, context_len: int) -> torch.Tensor:
    """[A*B, context_len + A*B] bool: context j < anchor, and the row's own block."""
    a, b = blocks.rows.shape
    ctx = torch.arange(context_len)[None] < blocks.anchors.repeat_interleave(b)[:, None]
    block_id = torch.arange(a).repeat_interleave(b)
    own = block_id[:, None] == block_id[None]
    return torch.cat([ctx, own], dim=1)


def drafter_forward(drafter, embed, sample: dict, blocks: Blocks, mask_token_id: int) -> torch.Tensor:
    """Backbone hidden states of every block row: [A, B, H]."""
    ids, hidden = sample["ids"], sample["hidden"]
    a, b = blocks.rows.shape
    block_tokens = torch.full((a, b), mask_token_id, dtype=torch.long)
    block_tokens[:, 0] = ids[blocks.anchors]
    dtype = next(drafter.parameters()).dtype
    context = hidden.reshape(len(hidden), -1).to(dtype)
    out = drafter(embed(block_tokens.reshape(-1)).to(dtype), blocks.rows.reshape(-1), context,
                  torch.arange(len(hidden)), mask=block_mask(blocks, len(hidden)))
    return out.view(a, b, -1)


def weighted_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    ce = F.cross_entropy(logits.float(), labels.clamp(min=0), reduction="none")
    return (ce * weights).sum() / weights.sum().clamp(min=1e-6)


def accept_length(pred: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean leading run of correct predictions per block (+1 for the bonus token): a training-time
    stand-in for tau."""
    valid = labels >= 0
    correct = ((pred == labels) | ~valid).long().cumprod(dim=1) * valid.long()
    return float(correct.sum(dim=1).float().mean()) + 1.0


def top1_by_position(pred: torch.Tensor, labels: torch.Tensor, positions: int = 3) -> dict[str, float]:
    """`top1_pos{k}`: how often the block's k-th draft (its k-th labelled row) is the label, over the blocks
    that have one, whatever the drafts before it (the block drafts every position at once; EAGLE-3's
    `top1_step{k}` is the same count for a drafter fed the true tokens). Where accept length stalls, these say
    whether the first draft or the later ones fall short."""
    labelled = labels >= 0
    first = int(labelled.any(dim=0).long().argmax())  # row 0 is unlabelled unless labels are shifted
    out = {}
    for k in range(1, positions + 1):
        col = first + k - 1
        if col < labels.shape[1] and labelled[:, col].any():
            valid = labelled[:, col]
            out[f"top1_pos{k}"] = float((pred[valid, col] == labels[valid, col]).float().mean())
    return out


def dflash_loss(drafter, embed, lm_head, sample, blocks, mask_token_id) -> tuple[torch.Tensor, dict]:
    z = drafter_forward(drafter, embed, sample, blocks, mask_token_id)
    labelled = blocks.weights > 0
    logits = lm_head(z[labelled])
    loss = weighted_ce(logits, blocks.labels[labelled], blocks.weights[labelled])
    with torch.no_grad():
        pred = torch.full_like(blocks.labels, -1)
        pred[labelled] = logits.argmax(-1)
        metrics = {"loss": float(loss), "accept_len": accept_length(pred, blocks.labels),
                   **top1_by_position(pred, blocks.labels)}
    return loss, metrics


def domino_loss(drafter, embed, lm_head, sample, blocks, mask_token_id, lambda_base: float) -> tuple[torch.Tensor, dict]:
    spec = drafter.spec
    z = drafter_forward(drafter, embed, sample, blocks, mask_token_id)
    ids = sample["ids"]
    a, b = blocks.rows.shape
    # teacher forcing: the GRU reads the true [root, t1, t2, ...]; states[:, j] has read root..t_j, and
    # the row that predicts t_i (row i - offset) takes the state that has read root..t_{i-1}
    offset = int(spec.shift_label)
    prev_pos = (blocks.anchors[:, None] + torch.arange(b)[None]).clamp(max=len(ids) - 1)
    states = drafter.prefix_gru(embed(ids[prev_pos]).to(z.dtype))[0]  # [A, B, G]
    first_corrected = spec.pure_draft_prefix_len + (1 - offset)
    labelled = blocks.weights > 0
    base = lm_head(z)
    corr = torch.zeros_like(base)
    # row k (k >= first_corrected) takes states[:, k + offset - 1]
    state_rows = states[:, first_corrected - (1 - offset): b - (1 - offset)]
    corr[:, first_corrected:] = correction(drafter.embed_proj, z[:, first_corrected:].reshape(-1, z.shape[-1]),
                                           state_rows.reshape(-1, state_rows.shape[-1])).view(a, b - first_corrected, -1)
    final = base + corr
    labels, weights = blocks.labels[labelled], blocks.weights[labelled]
    loss_final = weighted_ce(final[labelled], labels, weights)
    loss_base = weighted_ce(base[labelled], labels, weights)
    loss = (1 - lambda_base) * loss_final + lambda_base * loss_base
    with torch.no_grad():
        pred = torch.full_like(blocks.labels, -1)
        pred[labelled] = final[labelled].argmax(-1)
        pred_base = torch.full_like(blocks.labels, -1)  # the backbone alone: what the GRU's correction adds
        pred_base[labelled] = base[labelled].argmax(-1)
        metrics = {"loss": float(loss), "loss_final": float(loss_final), "loss_base": float(loss_base),
                   "accept_len": accept_length(pred, blocks.labels),
                   "accept_len_base": accept_length(pred_base, blocks.labels), "lambda_base": lambda_base,
                   **top1_by_position(pred, blocks.labels)}
    return loss, metrics
