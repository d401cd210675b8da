"""The Domino correction head (Huang et al., jianuo-huang/Domino; Huang2020/Qwen3-*-Domino-b16).

DFlash's block pass gives per-position *marginals*: position k ignores which tokens were actually
drafted before it. Domino adds a small causal head on the same backbone:
- `prefix_gru`: bias-free single-layer GRU (H -> G) over the target embeddings of the realised
  path [root, t1, ..., tk];
- `embed_proj`: Linear(H+G -> E, no bias) . SiLU . Linear(E -> V, no bias), a low-rank correction
  added to the base logits: logits_k = lm_head(z_k) + embed_proj([z_k; h_k]).
With `shift_label` (the published checkpoints), block row k predicts the token at offset k+1 from
the root, so all B rows are draft positions; the first `pure_draft_prefix_len` positions use the
base logits uncorrected.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

DOMINO_PROJECTORS = ("domino", "causal_v5")  # causal_v5: the legacy name in early checkpoints


def is_domino_projector(projector_type: str | None) -> bool:
    return projector_type in DOMINO_PROJECTORS


def build_domino_modules(spec) -> tuple[nn.GRU, nn.Sequential]:
    if not (spec.gru_hidden_dim and spec.emb_dim):
        from pipeline.errors import ConfigError

        raise ConfigError("Domino drafter config needs dflash_config.gru_hidden_dim and emb_dim")
    gru = nn.GRU(spec.hidden_size, spec.gru_hidden_dim, num_layers=1, batch_first=True, bias=False)
    proj = nn.Sequential(nn.Linear(spec.hidden_size + spec.gru_hidden_dim, spec.emb_dim, bias=False), nn.SiLU(),
                         nn.Linear(spec.emb_dim, spec.vocab_size, bias=False))
    return gru, proj


def gru_cell(gi: torch.Tensor, h: torch.Tensor, w_hh_t: torch.Tensor) -> torch.Tensor:
    """torch.nn.GRU's cell without biases, written out: from the input projection gi = W_ih x [..., 3G],
    the state h [..., G] and W_hh^T [G, 3G] (one state or a batch of them); the reset and update gates
    share one sigmoid. Used by both tree builders, and (as `gru_update`, with W_hh h from the step
    before) by the chain, on every device (nn.GRU on CUDA goes through cuDNN, whose RNNs default to TF32)."""
    return gru_update(gi, h @ w_hh_t, h)


def gru_update(gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The GRU cell from both projections gi = W_ih x and gh = W_hh h ([..., 3G]) and the state h; the
    gate blocks are taken as views by split (one dispatch each, not one per slice)."""
    g = h.shape[-1]
    return gru_gates(*gi.split((2 * g, g), dim=-1), *gh.split((2 * g, g), dim=-1), h)


def gru_gates(gi_ru: torch.Tensor, gi_n: torch.Tensor, gh_ru: torch.Tensor, gh_n: torch.Tensor,
              h: torch.Tensor) -> torch.Tensor:
    """The GRU cell's arithmetic from the projections' gate blocks: five kernels (the reset and update
    gates share one sigmoid; addcmul and lerp fuse the n and h' lines), as few as a chain step can launch."""
    r, u = torch.sigmoid(gi_ru + gh_ru).chunk(2, dim=-1)
    n = torch.tanh(torch.addcmul(gi_n, r, gh_n))
    return torch.lerp(n, h, u)  # n + u (h - n)


def gru_step(gi: torch.Tensor, h: torch.Tensor, gh_ru: torch.Tensor, gh_n: torch.Tensor,
             w_next_t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One step of the Domino chain's GRU from its input projection gi [3G], state h [G] and the gate
    blocks of W_hh h [2G], [G] -> (new h, the gate blocks of its W_hh projection for the step after, its
    W1_s projection [E] for this position's correction): one matmul with `w_next_t` = [W_hh^T | W1_s^T]
    [G, 3G + E] and one split into the three."""
    g = h.shape[-1]
    gi_ru, gi_n = gi.split((2 * g, g), dim=-1)
    h = gru_gates(gi_ru, gi_n, gh_ru, gh_n, h)
    return (h, *(h @ w_next_t).split((2 * g, g, w_next_t.shape[1] - 3 * g)))


def gru_path_state(gru: nn.GRU, embeds: torch.Tensor) -> torch.Tensor:
    """State after reading a whole path: embeds [L, H] -> [G]."""
    return gru(embeds[None])[1][0, 0]


def correction(embed_proj: nn.Sequential, z: torch.Tensor, state: torch.Tensor,
               rows: torch.Tensor | None = None) -> torch.Tensor:
    """Logit correction for backbone hidden z [n, H] and GRU states [n, G]: [n, V], or [n, M] over
    the candidate token ids `rows` [M] only (W2 restricted to those rows: the top-M trick)."""
    mid = embed_proj[1](embed_proj[0](torch.cat([z, state], dim=-1)))
    w2 = embed_proj[2].weight
    # the W2 matmul in float32, as DominoTree's reference (domino_adapter: W2[C].float()) runs it
    return mid.float() @ (w2 if rows is None else w2[rows]).float().t()


class Float32Head:
    """The Domino head (GRU, W1, W2) copied to float32 for inference on a bf16/fp16 drafter.

    DominoTree's reference runs the W2 correction in fp32; we also keep the GRU and W1 in fp32 (a
    departure: the references run them in the model dtype), so the chain, the reference tree
    builder and the fast builder compute the same numbers up to fp32 rounding, whatever the
    drafter's dtype (tested in bf16). Extra memory: the head's weights in fp32 (about 220 MB for
    the published Qwen3-8B head, dominated by W2 [V, E]) and the GRU input table (`input_table`)."""

    def __init__(self, drafter):
        self.gru: nn.GRU = copy.deepcopy(drafter.prefix_gru).float().requires_grad_(False)
        self.embed_proj: nn.Sequential = copy.deepcopy(drafter.embed_proj).float().requires_grad_(False)
        self.hidden_size = drafter.spec.hidden_size
        w1 = self.embed_proj[0].weight
        self.w_ih = self.gru.weight_ih_l0  # [3G, H]
        self.w_z = w1[:, :self.hidden_size]  # [E, H]: the z part of W1
        self.w_s = w1[:, self.hidden_size:]  # [E, G]: the GRU-state part of W1
        self.w_s_t = self.w_s.t()  # [G, E], one view kept: the tree builder's CUDA graph checks weights by identity
        self.w_hh_t = self.gru.weight_hh_l0.t().contiguous()  # [G, 3G]
        # [G, 3G + E]: a chain step's one matmul gives the next step's W_hh h and this state's W1_s h
        self.w_next_t = torch.cat([self.w_hh_t, self.w_s_t], dim=1).contiguous()
        self.w2 = self.embed_proj[2].weight  # [V, E]
        self._input_table: torch.Tensor | None = None

    def input_table(self, embed: nn.Embedding) -> torch.Tensor:
        """[V, 3G]: the GRU input projection W_ih . embed(t) of every token, computed once (the target's
        embeddings and W_ih are frozen), so a GRU step's input is a row lookup, not a matmul; the
        released Domino rollout keeps the same table. Memory: V x 3G fp32 (150 MB for SmolLM2's head,
        1.9 GB for the published Qwen3-8B one)."""
        if self._input_table is None:  # through the module's forward: Gemma scales its embeddings there
            ids = torch.arange(embed.num_embeddings, device=embed.weight.device)
            self._input_table = torch.cat([embed(chunk).float() @ self.w_ih.t() for chunk in ids.split(8192)])
        return self._input_table
