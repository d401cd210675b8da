"""The DFlash block-diffusion drafter (Chen et al., z-lab/dflash), native, in the published layout.

A few Qwen3-style decoder layers with no embedding and no head of their own: the block
[last committed token, mask x (B-1)] is embedded with the *target's* `embed_tokens`, and the
drafter's output goes through the *target's* `lm_head`. The context is the hidden states of a few
tapped target layers (`target_layer_ids`; feature of layer i = output of decoder layer i),
concatenated and fused by `fc` (k*H -> H, no bias) + `hidden_norm`. In every layer K/V are
projected from [context; block] with the same weights, Q from the block only, and the block
attends to all of the context and to itself without a causal mask, so one pass gives a marginal
distribution for every block position.

The projected context K/V are kept in a per-prompt `DraftCache` (the committed context never
changes); the block's own K/V are recomputed every pass and never stored, which is z-lab's
"update, then crop back to `start`".

Tensor names match z-lab/Qwen3-{4B,8B}-DFlash-b16 (`layers.{i}.self_attn.{q,k,v,o}_proj`,
`q_norm`, `k_norm`, `mlp.{gate,up,down}_proj`, `{input,post_attention}_layernorm`, `fc`,
`hidden_norm`, `norm`). A Domino checkpoint (Huang2020/Qwen3-{4B,8B}-Domino-b16) is the same
backbone plus `prefix_gru.*` and `embed_proj.{0,2}.weight` (see `decoding/drafting/domino_head.py`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from decoding.drafting.domino_head import build_domino_modules, is_domino_projector
from pipeline.errors import ConfigError
from pipeline.resources import SHIPPED_DRAFTERS

log = logging.getLogger(__name__)


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Evenly spaced from 1 to L-3 (z-lab `build_target_layer_ids`): 36 layers, 5 taps -> 1, 9, 17, 25, 33."""
    if num_taps == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_taps - 1)) for i in range(num_taps)]


@dataclass
class DrafterSpec:
    """The fields of a DFlash/Domino `config.json` that the drafter uses."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    num_target_layers: int | None = None
    # Domino head (projector_type "domino"; legacy alias "causal_v5")
    projector_type: str | None = None
    gru_hidden_dim: int | None = None
    emb_dim: int | None = None
    pure_draft_prefix_len: int = 0
    shift_label: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def is_domino(self) -> bool:
        return is_domino_projector(self.projector_type)

    @classmethod
    def from_config(cls, cfg: dict, where: str = "config.json") -> "DrafterSpec":
        dflash = cfg.get("dflash_config") or {}

        def pick(name, default=None):
            return dflash.get(name, cfg.get(name, default))

        for name in ("layer_types",):
            if any(t != "full_attention" for t in cfg.get(name) or []):
                raise ConfigError(f"{where}: sliding-window drafter layers are not supported")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise ConfigError(f"{where}: rope type {rope.get('rope_type')!r} is not supported (default RoPE only)")
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in cfg]
        if pick("target_layer_ids") is None or pick("mask_token_id") is None:
            missing.append("dflash_config.{target_layer_ids,mask_token_id}")
        if missing:
            raise ConfigError(f"{where}: not a DFlash drafter config (missing {', '.join(missing)})")
        heads = cfg["num_attention_heads"]
        return cls(
            hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
            target_layer_ids=list(pick("target_layer_ids")), mask_token_id=int(pick("mask_token_id")),
            block_size=int(pick("block_size", 16)), rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
            num_target_layers=cfg.get("num_target_layers"), projector_type=pick("projector_type"),
            gru_hidden_dim=pick("gru_hidden_dim"), emb_dim=pick("emb_dim"),
            pure_draft_prefix_len=int(pick("pure_draft_prefix_len", 0)), shift_label=bool(pick("shift_label", False)),
        )

    def to_config(self) -> dict:
        """config.json in the published layout (Qwen3 fields + block_size + dflash_config)."""
        dflash = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}
        if self.is_domino:
            dflash.update(projector_type=self.projector_type, gru_hidden_dim=self.gru_hidden_dim, emb_dim=self.emb_dim,
                          pure_draft_prefix_len=self.pure_draft_prefix_len, shift_label=self.shift_label)
        return {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "attention_bias": False,
            "block_size": self.block_size, "num_target_layers": self.num_target_layers, "dflash_config": dflash,
            "torch_dtype": "bfloat16",
        }


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed).to(x.dtype)  # HF's order: cast, then scale (bf16 ties as the reference's)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                      expand: bool | None = None) -> torch.Tensor:
    """SDPA of q [1, heads, n, d] over k, v [1, kv_heads, m, d] (grouped-query when kv_heads < heads).
    SDPA groups the heads itself (no copy of the K/V), except with a mask on CUDA, where its grouped
    path has only the math kernel (transformers' `use_gqa_in_sdpa` draws the same line): there the K/V
    heads are repeated first, for the fused masked kernels. `expand` forces either path (tests)."""
    groups = q.shape[-3] // k.shape[-3]
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if expand is None:
        expand = mask is not None and q.device.type == "cuda"
    if expand:
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class Attention(nn.Module):
    """Q from the block; K/V from [context; block] with shared projections (KV injection)."""

    def __init__(self, spec: DrafterSpec):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.heads, self.kv_heads, self.head_dim = spec.num_attention_heads, spec.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, spec.rms_norm_eps)
        self.k_norm = RMSNorm(d, spec.rms_norm_eps)

    def project_kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """[n, H] -> K, V as [kv_heads, n, d] (K normed and rotated)."""
        k = self.k_norm(self.k_proj(x).view(len(x), self.kv_heads, self.head_dim)).transpose(0, 1)
        v = self.v_proj(x).view(len(x), self.kv_heads, self.head_dim).transpose(0, 1)
        return rotate(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        q = self.q_norm(self.q_proj(x).view(len(x), self.heads, self.head_dim)).transpose(0, 1)
        q = rotate(q, cos, sin)
        k_blk, v_blk = self.project_kv(x, cos, sin)
        k, v = torch.cat([ctx_k, k_blk], dim=1), torch.cat([ctx_v, v_blk], dim=1)
        out = grouped_attention(q[None], k[None], v[None], mask)  # non-causal
        return self.o_proj(out[0].transpose(0, 1).reshape(len(x), -1))


class MLP(nn.Module):
    def __init__(self, spec: DrafterSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, spec: DrafterSpec):
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


@dataclass
class DraftCache:
    """Per-prompt projected context K/V of every drafter layer ([kv_heads, n, d] each)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.keys[0].shape[1]


class DFlashDrafter(nn.Module):
    def __init__(self, spec: DrafterSpec):
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.num_hidden_layers))
        self.fc = nn.Linear(len(spec.target_layer_ids) * spec.hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        if spec.is_domino:
            self.prefix_gru, self.embed_proj = build_domino_modules(spec)
        inv_freq = 1.0 / spec.rope_theta ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * self.inv_freq.to(positions.device)[None]
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, block_embeds, block_positions, context, context_positions, mask=None, cache=None):
        """One drafting pass.

        block_embeds [Q, H]: target embeddings of the block rows; context [C, k*H]: tapped target
        hidden states of context tokens not yet in `cache`. `mask` [Q, cached + C + Q] bool (None =
        every row sees everything: the inference case). With a cache, the new context's K/V are
        appended to it. Returns the final-normed hidden states [Q, H]."""
        fused = self.hidden_norm(self.fc(context.to(block_embeds.dtype)))
        cos_b, sin_b = self.rope(block_positions, block_embeds.dtype)
        cos_c, sin_c = self.rope(context_positions, block_embeds.dtype)
        if mask is not None:
            mask = mask[None, None]
        h = block_embeds
        for i, layer in enumerate(self.layers):
            k_ctx, v_ctx = layer.self_attn.project_kv(fused, cos_c, sin_c)
            if cache is not None:
                k_ctx = cache.keys[i] = torch.cat([cache.keys[i], k_ctx], dim=1)
                v_ctx = cache.values[i] = torch.cat([cache.values[i], v_ctx], dim=1)
            h = h + layer.self_attn(layer.input_layernorm(h), cos_b, sin_b, k_ctx, v_ctx, mask)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)

    def new_cache(self) -> DraftCache:
        p = next(self.parameters())
        empty = p.new_zeros(self.spec.num_key_value_heads, 0, self.spec.head_dim)
        n = self.spec.num_hidden_layers
        return DraftCache([empty] * n, [empty] * n)

    @torch.inference_mode()
    def draft(self, cache: DraftCache, context: torch.Tensor, block_embeds: torch.Tensor, start: int) -> torch.Tensor:
        """Inference pass: `context` [n, k*H] = tapped hidden states of the tokens at positions
        [start - n, start) (committed since the last pass); the block starts at position `start`."""
        if cache.length + len(context) != start:
            raise RuntimeError(f"drafter context out of sync: {cache.length} cached + {len(context)} new != {start}")
        device = block_embeds.device
        ctx_pos = torch.arange(cache.length, start, device=device)
        blk_pos = torch.arange(start, start + len(block_embeds), device=device)
        return self.forward(block_embeds, blk_pos, context, ctx_pos, cache=cache)


# ----------------------------------------------------------------------------------- checkpoints
# location -> {"folder", "sha256"} of every checkpoint resolved since `forget_resolved()` (the run
# summary's provenance: a path as written does not say which folder, or which weights, it found)
RESOLVED: dict[str, dict] = {}


def forget_resolved() -> None:
    RESOLVED.clear()


def weights_digest(folder: Path) -> str | None:
    """sha256 (16 hex) of a checkpoint's weight files, in name order; None if it has none."""
    files = sorted([*folder.glob("*.safetensors"), *folder.glob("pytorch_model.bin")])
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def note_resolved(location: str, folder: Path) -> Path:
    if location not in RESOLVED:
        RESOLVED[location] = {"folder": str(folder.resolve()), "sha256": weights_digest(folder)}
    return folder


def local_folder(location: str) -> Path | None:
    """The folder `location` names, absolute or relative to the cwd, else among the shipped drafters.
    Where both exist and differ (a trainer's export in this checkout named like a shipped drafter), the
    cwd one is used, with a warning naming both."""
    found = [c for c in (Path(location).expanduser(), SHIPPED_DRAFTERS / location) if c.is_dir()]
    if not found:
        return None
    if len(found) == 2 and found[0].resolve() != found[1].resolve() and location not in RESOLVED:
        log.warning("drafter %s: using %s (relative to the working directory), not the shipped %s",
                    location, found[0].resolve(), found[1])
    return note_resolved(location, found[0])


def resolve_location(location: str) -> Path:
    """A local folder (`local_folder`) or an HF hub id."""
    folder = local_folder(location)
    if folder is not None:
        return folder
    if location.count("/") != 1 or location.startswith((".", "/")):
        raise ConfigError(f"drafter checkpoint {location!r}: no such folder")
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(location, allow_patterns=["*.json", "*.safetensors", "pytorch_model.bin"]))
    except Exception as err:  # offline, unknown repo, gated...
        raise ConfigError(f"drafter checkpoint {location!r}: not a local folder and not downloadable "
                          f"from the HF hub ({type(err).__name__})") from None
    return note_resolved(location, folder)


def load_drafter(location: str, device=None, dtype=None) -> DFlashDrafter:
    from safetensors.torch import load_file

    folder = resolve_location(location)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"drafter checkpoint {folder}: no config.json")
    spec = DrafterSpec.from_config(json.loads(config_path.read_text()), str(config_path))
    model = DFlashDrafter(spec)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"drafter checkpoint {folder}: no *.safetensors file")
    state = {}
    for f in files:
        state.update(load_file(f))
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ConfigError(f"drafter checkpoint {folder}: tensor names do not match the DFlash layout "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.load_state_dict(state)
    return cast_weights(model, dtype).to(device=device).eval()


def cast_weights(model: nn.Module, dtype) -> nn.Module:
    """Cast the float parameters to `dtype`, leaving buffers alone: RoPE's `inv_freq` stays fp32, as in
    HF's models (a bf16 inv_freq rounds the frequencies to 8 bits: angles off by ~0.1 rad per 100
    positions of distance in the fast channels), and index buffers keep their integer types. Call it
    before moving the model: the move then carries bf16 weights, and re-packs a GRU's weights."""
    if dtype is not None:
        for param in model.parameters():
            if param.is_floating_point():
                param.data = param.data.to(dtype)
    return model


def save_drafter(model: DFlashDrafter, folder: Path, dtype=torch.bfloat16) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(model.spec.to_config(), indent=2))
