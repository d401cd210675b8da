"""The EAGLE-3 draft model (Li et al. 2025, SafeAILab/EAGLE `cnets.py`), native, in the published layout.

One decoder layer of the target's family fed with [token embedding; hidden]:

    g = fc(cat(f_low, f_mid, f_high))       # three target layers' features (3*H_t -> H), first step only
    x = cat(input_layernorm(embed(tok)), hidden_norm(g))   # 2H wide, the embedding first
    h = g + o_proj(attn(x))                 # q/k/v_proj read 2H; the residual is the un-normed g
    h = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))               # over the draft vocabulary; draft id i is target id i + d2t[i]

and `h` (pre-norm) is fed back as the next step's `g`. Position t holds the feature of token x_t and
the embedding of x_{t+1} and predicts x_{t+2}. Rows computed from target features form the per-prompt
cache (`Eagle3Cache`); rows drafted from the model's own `h` (tree expansion) are scratch.

Checkpoint (`config.json` + `model.safetensors` or `pytorch_model.bin`), as yuhuili/EAGLE3-* and the
SpecForge / SGLang / vLLM Qwen3 EAGLE-3 checkpoints publish it: `midlayer.self_attn.{q,k,v,o}_proj`,
`midlayer.mlp.{gate,up,down}_proj`, `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}`, `fc`,
`norm`, `lm_head`, `d2t` (int64 offsets), `t2d` (bool mask over the target vocabulary), optionally
`embed_tokens` (else the target's is used). vLLM's renaming (`layers.0.` for `midlayer.`,
`draft_id_to_target_id` for `d2t`) is read as well. Config fields: the Llama ones plus `draft_vocab_size`,
`target_hidden_size`, and `eagle_config.eagle_aux_hidden_state_layer_ids`.

Layer ids: ours name a decoder layer's *output* (TargetModel hidden taps), SpecForge's convention. EAGLE
and vLLM take the *input* of decoder layers 2, L//2 and L-3 (HF `hidden_states[2]`, `[L//2]`, `[L-3]`),
which are the outputs of layers 1, L//2-1 and L-4: the default here. A checkpoint's
`eagle_aux_hidden_state_layer_ids` comes in either convention; as SGLang does, the first id decides (1:
outputs, SpecForge; 2 or more: inputs, vLLM / EAGLE, so 1 is subtracted).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from decoding.drafting.dflash_drafter import (MLP, RMSNorm, cast_weights,  # the same SwiGLU and norms
                                              grouped_attention, resolve_location, rotate)
from pipeline.errors import ConfigError


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """Outputs of layers 1, L//2 - 1, L - 4 (= inputs of layers 2, L//2, L - 3, EAGLE's choice)."""
    return [1, num_target_layers // 2 - 1, num_target_layers - 4]


def taps_in_range(taps, num_layers: int) -> bool:
    """Taps must be outputs of layers 0..L-2: the last layer's output is read after the final norm by HF's
    `hidden_states` (training) but before it by the engine (decoding), so a drafter tapping it would decode
    on other features than it was trained on."""
    return all(0 <= i <= num_layers - 2 for i in taps)


def fitted_embeddings(drafter: "Eagle3Drafter", taps, target, who: str) -> nn.Module:
    """The table the drafter embeds tokens with (its own, else the target's), once the drafter is checked
    to fit the target (`who` starts the error line)."""
    spec, cfg = drafter.spec, target.config
    layers = cfg.num_hidden_layers
    if spec.target_hidden_size != cfg.hidden_size or spec.vocab_size != cfg.vocab_size or len(taps) != 3 \
            or not taps_in_range(taps, layers):
        raise ConfigError(f"{who} does not fit this target (hidden {spec.target_hidden_size} vs {cfg.hidden_size}, "
                          f"vocab {spec.vocab_size} vs {cfg.vocab_size}, layers {list(taps)}: three of "
                          f"0..{layers - 2})")
    own = drafter.embed_tokens
    if own is None and spec.hidden_size != cfg.hidden_size:
        raise ConfigError(f"{who} is {spec.hidden_size} wide and has no embed_tokens of its own; the target's are "
                          f"{cfg.hidden_size} wide")
    return own if own is not None else target.model.get_input_embeddings()


@dataclass
class Eagle3Spec:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_linear_factor: float = 1.0  # rope_scaling {"type": "linear", "factor": f}
    max_position_embeddings: int = 2048
    aux_layer_ids: list[int] = field(default_factory=list)  # output-of-layer ids; [] = default_aux_layer_ids
    norm_before_residual: bool = False  # vLLM / speculators variant: the residual is hidden_norm(g), not g

    @classmethod
    def from_config(cls, cfg: dict, where: str = "config.json") -> "Eagle3Spec":
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
            kind = rope.get("rope_type", rope.get("type", "default"))
            if kind not in ("default", "linear"):
                raise ConfigError(f"{where}: rope type {kind!r} is not supported (default or linear)")
            # SpecForge variants this drafter does not implement; each would load and read out wrongly
            if cfg.get("norm_output", True) is False or cfg.get("fc_norm"):
                raise ConfigError(f"{where}: SpecForge's norm_output=false / fc_norm variants are not supported")
            eagle = cfg.get("eagle_config") or {}
            layer_ids = eagle.get("eagle_aux_hidden_state_layer_ids", cfg.get("eagle_aux_hidden_state_layer_ids"))
            if layer_ids and int(layer_ids[0]) >= 2:  # vLLM / EAGLE ids name a layer's input: ours - 1
                layer_ids = [int(i) - 1 for i in layer_ids]  # (SGLang's rule: decided on the first id)
            return cls(
                hidden_size=hidden, intermediate_size=int(cfg["intermediate_size"]), num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads", heads)), vocab_size=int(cfg["vocab_size"]),
                draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
                target_hidden_size=int(cfg.get("target_hidden_size") or hidden),
                head_dim=int(cfg.get("head_dim") or hidden // heads), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                rope_linear_factor=float(rope.get("factor", 1.0)) if kind == "linear" else 1.0,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                aux_layer_ids=[int(i) for i in layer_ids] if layer_ids else [],
                norm_before_residual=bool(cfg.get("norm_before_residual", False)))
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(f"{where}: not an EAGLE-3 draft config ({type(err).__name__}: {err})") from None

    def layer_ids(self, num_target_layers: int) -> list[int]:
        return list(self.aux_layer_ids) or default_aux_layer_ids(num_target_layers)

    def to_config(self) -> dict:
        """config.json in the published (SpecForge / SGLang) form."""
        out = {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        }
        if self.rope_linear_factor != 1.0:
            out["rope_scaling"] = {"type": "linear", "factor": self.rope_linear_factor}
        if self.norm_before_residual:
            out["norm_before_residual"] = True
        if self.aux_layer_ids:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": self.aux_layer_ids, "use_aux_hidden_state": True}
        return out

    def describe(self) -> dict:
        return asdict(self)


class Attention(nn.Module):
    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        width, d = 2 * spec.hidden_size, spec.head_dim
        self.heads, self.kv_heads, self.head_dim = spec.num_attention_heads, spec.num_key_value_heads, d
        self.q_proj = nn.Linear(width, self.heads * d, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, spec.hidden_size, bias=False)

    def forward(self, x, cos, sin, past_k, past_v, mask, write_at: int | None = None):
        """x [n, 2H]; mask [n, m + n] bool or None (all visible). `write_at` None: past K/V [kv_heads, m, d],
        and the K/V returned are the past rows followed by this block's (a new tensor: training, whose
        autograd needs it, and the tests' step-by-step references). `write_at` m: past K/V are buffers
        (`Eagle3Cache`) whose first m rows are the past; this block's K/V are written at rows [m, m + n) in
        place, attention reads rows [0, m + n), and the buffers are returned. Returns the attention output
        [n, H] and the K/V."""
        n = len(x)
        q = rotate(self.q_proj(x).view(n, self.heads, self.head_dim).transpose(0, 1), cos, sin)
        k = rotate(self.k_proj(x).view(n, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        if write_at is None:
            keys, values = torch.cat([past_k, k], dim=1), torch.cat([past_v, v], dim=1)
            seen_k, seen_v = keys, values
        else:
            past_k[:, write_at:write_at + n].copy_(k)
            past_v[:, write_at:write_at + n].copy_(v)
            keys, values = past_k, past_v
            seen_k, seen_v = past_k[:, :write_at + n], past_v[:, :write_at + n]
        attn_mask = None if mask is None else mask[None, None]
        out = grouped_attention(q[None], seen_k[None], seen_v[None], attn_mask)
        return self.o_proj(out[0].transpose(0, 1).reshape(n, -1)), keys, values


class MidLayer(nn.Module):
    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class Eagle3Cache:
    """Per-prompt K/V of the rows computed from target features: the first `length` rows of buffers
    [kv_heads, capacity + scratch, d]. `extend` writes new rows in place (no copy of the cache per step); the
    last `scratch` rows are the rows a tree's levels or a chain's drafts write, overwritten every step. The
    buffers keep their shape while they fit, so a graph captured on them reads them in place: the length is
    also kept on the device (`length_t`). A cache that has to grow gets new buffers of twice the capacity
    (`take_moved` says so once, for the replayer to drop the graphs that read the old ones); `clear` keeps them
    for the next prompt unless they are over four times what it needs (and over 4 * MIN_CAPACITY rows)."""

    MIN_CAPACITY = 256

    def __init__(self, like: torch.Tensor, kv_heads: int, head_dim: int):
        self.buffer_k = like.new_zeros(kv_heads, 0, head_dim)
        self.buffer_v = like.new_zeros(kv_heads, 0, head_dim)
        self.length, self.scratch, self.moved = 0, 0, False
        self.length_t = torch.zeros((), dtype=torch.long, device=like.device)

    @property
    def capacity(self) -> int:
        return self.buffer_k.shape[1] - self.scratch

    @property
    def keys(self) -> torch.Tensor:
        return self.buffer_k[:, :self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.buffer_v[:, :self.length]

    def clear(self, rows_expected: int = 0) -> None:
        """Empty, for the next prompt, with room for the rows it is expected to need (`rows_expected`: its
        prompt and new tokens), so that the buffers need not grow (and a captured graph need not be captured
        again) mid-prompt. Buffers over four times that are dropped for smaller ones: a long prompt must not
        leave every later pass attending over (masked) rows it will never use."""
        self.set_length(0)
        if rows_expected > 0 and self.capacity > 4 * max(rows_expected, self.MIN_CAPACITY):
            shape = (self.buffer_k.shape[0], self.scratch, self.buffer_k.shape[2])  # no room: `reserve` makes it
            self.buffer_k, self.buffer_v = self.buffer_k.new_zeros(shape), self.buffer_v.new_zeros(shape)
            self.moved = True
        self.reserve(rows_expected)

    def take_moved(self) -> bool:
        """Whether the buffers were replaced since the last call (graphs on the old ones are to be dropped)."""
        moved, self.moved = self.moved, False
        return moved

    def set_length(self, length: int) -> None:
        self.length = length
        self.length_t.fill_(length)  # a fill on the device, no host read

    def reserve(self, rows: int, scratch: int | None = None, keep: int = 0) -> None:
        """Room for `rows` more cached rows, and `scratch` expansion rows (None: as many as now). New buffers
        keep the cache's rows and the `keep` rows after them (a chain's fed tail)."""
        need, scratch, keep = self.length + rows, self.scratch if scratch is None else scratch, max(keep, 0)
        if need <= self.capacity and scratch == self.scratch:
            return
        capacity = self.capacity if need <= self.capacity else max(need, 2 * self.capacity, self.MIN_CAPACITY)
        kept = max(0, min(self.length + keep, self.capacity, capacity))
        for name in ("buffer_k", "buffer_v"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], capacity + scratch, old.shape[2])
            new[:, :kept] = old[:, :kept]
            setattr(self, name, new)
        self.scratch, self.moved = scratch, True


class Eagle3Drafter(nn.Module):
    def __init__(self, spec: Eagle3Spec, with_embeddings: bool = False):
        super().__init__()
        self.spec = spec
        self.fc = nn.Linear(3 * spec.target_hidden_size, spec.hidden_size, bias=False)
        self.midlayer = MidLayer(spec)
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        same_vocab = spec.draft_vocab_size == spec.vocab_size
        self.register_buffer("t2d", torch.full((spec.vocab_size,), same_vocab, dtype=torch.bool))
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size) if with_embeddings else None
        inv_freq = 1.0 / spec.rope_theta ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = (positions.float() / self.spec.rope_linear_factor)[:, None] * self.inv_freq.to(positions.device)[None]
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def step(self, embeds, hidden, positions, past_k, past_v, mask=None, write_at: int | None = None):
        """One pass of the layer over n rows: embeds [n, H] of the input tokens, hidden [n, H] (`g`:
        fc(features) or a parent's `h`). Returns h [n, H] (pre-norm) and the K/V [kv_heads, m + n, d]
        of the past rows followed by these rows' (the next pass's past: no caller concatenates again).
        With `write_at`, past K/V are buffers written in place at that row and returned whole
        (`Attention.forward`)."""
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        cos, sin = self.rope(positions, hidden.dtype)
        attn, keys, values = layer.self_attn(x, cos, sin, past_k, past_v, mask, write_at)
        h = (normed if self.spec.norm_before_residual else hidden) + attn
        return h + layer.mlp(layer.post_attention_layernorm(h)), keys, values

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (float32) of pre-norm states."""
        return self.lm_head(self.norm(h)).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def new_cache(self) -> Eagle3Cache:
        return Eagle3Cache(self.lm_head.weight, self.spec.num_key_value_heads, self.spec.head_dim)

    @torch.inference_mode()
    def extend(self, cache: Eagle3Cache, features: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """Append rows built from target features [n, 3*H_t] of the tokens at positions [m, m + n) and the
        embeddings of the tokens after them; returns their h [n, H] (the last row drafts the next token)."""
        m, n = cache.length, len(features)
        g = self.fc(features.to(self.fc.weight.dtype))
        if n == 0:
            return g
        positions = torch.arange(m, m + n, device=g.device)
        mask = None
        if n > 1:  # causal inside the new rows, all of the cache visible
            mask = torch.ones(n, m + n, dtype=torch.bool, device=g.device).tril(m)
        cache.reserve(n)
        h, _, _ = self.step(next_embeds.to(g.dtype), g, positions, cache.buffer_k, cache.buffer_v, mask, write_at=m)
        cache.set_length(m + n)
        return h


# ----------------------------------------------------------------------------------- checkpoints
VLLM_NAMES = {"layers.0.": "midlayer.", "draft_id_to_target_id": "d2t"}


def canonical_names(state: dict) -> dict:
    out = {}
    for name, tensor in state.items():
        for theirs, ours in VLLM_NAMES.items():
            if name.startswith(theirs):
                name = ours + name[len(theirs):]
        out[name.removeprefix("model.")] = tensor
    return out


def read_tensors(folder: Path) -> dict:
    files = sorted(folder.glob("*.safetensors"))
    state: dict = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            state.update(load_file(f))
    elif (folder / "pytorch_model.bin").is_file():  # the official EAGLE release
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ConfigError(f"EAGLE-3 checkpoint {folder}: no *.safetensors or pytorch_model.bin")
    return canonical_names(state)


def load_eagle3(location: str, device=None, dtype=None) -> Eagle3Drafter:
    folder = resolve_location(location)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"EAGLE-3 checkpoint {folder}: no config.json")
    spec = Eagle3Spec.from_config(json.loads(config_path.read_text()), str(config_path))
    state = read_tensors(folder)
    model = Eagle3Drafter(spec, with_embeddings="embed_tokens.weight" in state)
    if spec.draft_vocab_size == spec.vocab_size:  # EAGLE drops the mapping when the vocabularies agree
        state.setdefault("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        state.setdefault("t2d", torch.ones(spec.vocab_size, dtype=torch.bool))
    if "d2t" in state and "t2d" not in state:  # vLLM reads d2t only; t2d is the set of ids it maps to
        t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
        t2d[torch.arange(len(state["d2t"])) + state["d2t"].long()] = True
        state["t2d"] = t2d
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ConfigError(f"EAGLE-3 checkpoint {folder}: tensor names do not match the EAGLE-3 layout "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, tensor in model.state_dict().items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ConfigError(f"EAGLE-3 checkpoint {folder}: {name} has shape {tuple(state[name].shape)}, "
                              f"config.json implies {tuple(tensor.shape)}")
    model.load_state_dict({k: v.to(torch.long) if k == "d2t" else v.to(torch.bool) if k == "t2d" else v
                           for k, v in state.items()})
    return cast_weights(model, dtype).to(device=device).eval()  # d2t / t2d and inv_freq keep their types


def save_eagle3(model: Eagle3Drafter, folder: Path, dtype=torch.bfloat16) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: (v if not v.is_floating_point() else v.to(dtype)).detach().to("cpu").contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(model.spec.to_config(), indent=2))


def vocab_mapping(token_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t / t2d from target-token counts over the training answers (EAGLE traineagle3 `scandata`): the
    `draft_vocab_size` most frequent ids, sorted ascending; d2t[i] = used[i] - i, t2d marks them."""
    used = torch.topk(token_counts.float(), draft_vocab_size, sorted=False).indices.sort().values
    t2d = torch.zeros(len(token_counts), dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(draft_vocab_size), t2d
