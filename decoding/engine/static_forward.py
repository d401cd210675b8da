"""The target's block forward at fixed shapes, so that a CUDA graph can replay it (`model.cuda_graph`).

Why: on a GPU a forward of transformers' eager model is one Python call per op. The H200 run of 2026-12-04
(docs/gpu-bf16.md) measured 24-35 ms for every block size from 1 to 1024 rows of a 1.7B model, whose
arithmetic at 1024 rows is about 4 ms: the forward is bound by the host's launches, not by the GPU. Replayed
from a graph, a forward is one launch.

A graph replays fixed shapes and fixed memory, so a static forward differs from the eager one in three ways:
- rows: the block is padded to the next power of two (`bucket`, up to MAX_ROWS; longer blocks run eagerly).
  Padded rows hold token 0 at position 0 and see the cached prefix and themselves (in a chain, the rows before
  them too); no real row sees them;
- keys: a full-attention layer attends to its whole slot of the KV buffer (decoding/engine/kv_cache.py: reused
  across prompts, zero-filled), `capacity` rows, and the mask hides every row past the prefix that is not the
  block's. A sliding-window layer (Gemma 2/3, Mistral or Qwen2 with a window) keeps every key there too, not
  transformers' last window - 1 (a graph cannot follow a cache that drops keys), and attends to a fixed-width
  slice of them (`sliding_columns`: the window plus the padded block, gathered through a device index), its mask
  hiding the keys the window leaves out (by position, as transformers' sliding mask does). The block's rows are
  written to their slots through a device tensor (`slots`), so one graph serves every prefix length; the layers'
  lengths are set afterwards, on the host;
- mask: one additive float mask per layer type ([1, 1, rows, capacity]; a sliding layer's [1, 1, rows,
  min(capacity, window + rows)]), built on the device before the replay (a few ops).
The logits come from the base model's last hidden state, the LM head and what the model's forward does around
them (decoding/engine/readout.py: Granite's and Cohere's logit scales, Gemma 2's soft-cap), for `last_only` on
the last real row, picked by a device index, so every shape is the bucket's. Outputs are cloned: the next
replay overwrites them.

One graph per bucket and variant (last row only, hidden taps), captured on first use; a buffer that has to grow
(a longer prompt than any before) gets new tensors, so the graphs are dropped and captured again. Host state
stays out of the captured function: the layers' lengths and their initialisation are set on the host, since a
replay runs no Python. Which models: those whose causal-LM forward is their decoder stack (`model.model`) and
the readout of decoding/engine/readout.py (checked on one short forward, as for the layer-subset path), on one
device, without dynamic RoPE (it compares positions on the host), with the shared KV buffer, the full model
(not a layer subset): `check_static` says why not otherwise. Before 2026-12-07 only LLaMA, Mistral, Qwen2
and Qwen3 without a sliding window were replayed. A stack that reads a device value on the host fails at its
capture with one error line (cuda_graph.py); the two such reads known are refused up front: transformers' eager
MoE experts loop (`nonzero` on the routing) and LongRoPE in transformers 5.15-5.20 (an `if` on the positions;
Phi-3-128k, Phi-3.5, Phi-4-mini), found by running the rotary embedding once (`rope_reads_host`).
benchmarks/arch_probe.py --static runs every probed family's static pass on the meta device, where such a read
fails, to say which do.

Unverified on a GPU (this module was written on a machine without one, 2026-12-05): the CPU tests replay the
graphs by emulation (the same static shapes, padding, slots and masks, run eagerly) and compare with the eager
forward. Two things a real capture adds are checked without one: the captured function reads nothing on the
host (it runs on the meta device, where such a read fails) and dispatches the same ops with the same arguments
at every prefix (nothing frozen into a graph depends on it). The capture itself only a GPU shows
(benchmarks/gpu_smoke.py, `--graphed`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from decoding.engine.attention_layout import UnsupportedArchitecture, outside_window
from decoding.engine.readout import Readout

MAX_ROWS = 1024  # the largest block a graph holds; a larger one runs eagerly (CaDDTree's 1024-node tree: 1025 rows)
CAPACITY_STEP = 1024  # a reused KV buffer is sized in these steps, so a slightly longer prompt does not regrow it


def bucket(rows: int) -> int:
    """The padded row count: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


def check_static(model, devices: set, kv_buffer: bool) -> str | None:
    """Why a target cannot run static forwards (None: it can)."""
    config = model.config
    if not (hasattr(model, "model") and hasattr(model, "lm_head")):
        return f"the static pass calls a decoder stack (`model`) and an `lm_head`, which {type(model).__name__} lacks"
    if "dynamic" in rope_types(model):
        return "its dynamic RoPE compares positions on the host"
    if len(devices) > 1:  # before anything below runs the model
        return "its layers, embedding and LM head are spread over several devices (device_map)"
    if "longrope" in rope_types(model) and rope_reads_host(model):
        return ("its LongRoPE picks the long or short factors on the host (an `if` on the positions, as in "
                "transformers 5.15-5.20); transformers 5.21 or newer picks them on the device")
    if getattr(config, "_experts_implementation", None) == "eager" and type(model)._can_set_experts_implementation():
        return ("its MoE experts run transformers' eager loop, which finds the routed experts on the host (nonzero); "
                "load it with experts_implementation='grouped_mm' or 'batched_mm'")
    if not kv_buffer:
        return "it runs without the shared KV buffer (kv_buffer=False)"
    try:  # the static pass computes the logits as the layer-subset path does: the same check (one short forward)
        Readout.of(config).check_once(model, user="the static pass (model.cuda_graph)")
    except UnsupportedArchitecture as error:
        return str(error).removeprefix(f"{config.model_type}: ")  # the caller's line names the model type
    return None


def rope_types(model) -> set:
    """The RoPE types a model runs with: its config's and its rotary embedding's (Gemma 3 keeps one per layer type,
    in a dict keyed by the type)."""
    config = model.config
    found = set()
    for given in (getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None),
                  getattr(getattr(model.model, "rotary_emb", None), "rope_type", None)):
        for value in (given.values() if isinstance(given, dict) and not {"rope_type", "type"} & given.keys()
                      else [given]):
            found.add(value.get("rope_type", value.get("type")) if isinstance(value, dict) else value)
    return found - {None}


class _HostReads(TorchDispatchMode):
    """Counts the device values read on the host (`.item()`, a tensor in an `if`: aten._local_scalar_dense)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def rope_reads_host(model) -> bool:
    """Whether the model's rotary embedding reads a position on the host, which a CUDA graph cannot hold: run once
    on two positions (transformers' LongRoPE did up to 5.20, whatever the positions). A call that fails before any
    read (another signature) is no read: the capture then says."""
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is None:
        return False
    weight = model.get_input_embeddings().weight
    positions = torch.arange(2, device=weight.device)[None]
    reads = _HostReads()
    try:
        with torch.no_grad(), reads:
            rotary(weight[:2][None], positions)
    except Exception:  # another signature, or a read that fails where it happens (the meta device): counted first
        pass
    return reads.count > 0


def capacity_for(rows: int) -> int:
    """A reused buffer's rows for `rows` expected ones, with room for the largest padded block after them."""
    return -(-(rows + MAX_ROWS) // CAPACITY_STEP) * CAPACITY_STEP


class StaticBlock:
    """The device tensors of one static forward, built from a block (tokens and positions on the device,
    `visible` [n, n] bool on the device or None for a causal chain). `window`: the sliding layers' window (None:
    the model has none); their mask is the full one over `sliding_columns` only, the keys outside the window
    hidden too."""

    def __init__(self, tokens, positions, visible, prefix: int, capacity: int, dtype, columns: torch.Tensor,
                 last_only: bool, window: int | None = None):
        n = len(tokens)
        self.rows, self.padded = n, bucket(n)
        pad = self.padded - n
        self.input_ids = F.pad(tokens, (0, pad))[None]
        self.position_ids = F.pad(positions, (0, pad))[None]
        blocked = torch.finfo(dtype).min
        mask = torch.full((self.padded, capacity), blocked, dtype=dtype, device=tokens.device)
        mask[:, :prefix] = 0
        if visible is None:
            seen = torch.ones(self.padded, self.padded, dtype=torch.bool, device=tokens.device).tril()
        else:
            seen = F.pad(visible, (0, pad, 0, pad))
            seen[n:, n:].diagonal().fill_(True)  # a padded row sees itself: no row of the softmax is all-masked
        mask[:, prefix:prefix + self.padded].masked_fill_(seen, 0)
        self.mask = mask[None, None]
        self.sliding_mask = self.sliding_columns = None
        if window is not None:
            # a sliding layer reads the window's columns only (`sliding_columns`): its first key's column up to the
            # block's last; a fixed width per bucket, so one graph serves every prefix
            width = min(capacity, window + self.padded)
            start = max(prefix - window, 0)  # + width <= capacity: the buffer holds prefix + padded rows
            self.sliding_columns = columns[start:start + width]
            # the prefix's keys sit at their positions, the block's at its rows' (past the block: hidden anyway)
            key_positions = self.sliding_columns.clone()
            key_positions[prefix - start:prefix - start + self.padded] = self.position_ids[0]
            outside = outside_window(key_positions, self.position_ids[0], window)  # never a row's own key
            self.sliding_mask = mask[:, start:start + width].masked_fill(outside, blocked)[None, None]
        self.slots = columns[prefix:prefix + self.padded]  # the block rows' cache slots
        self.last_row = columns[n - 1:n] if last_only else None

    def inputs(self) -> dict:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "mask": self.mask,
                "sliding_mask": self.sliding_mask, "sliding_columns": self.sliding_columns, "slots": self.slots,
                "last_row": self.last_row}
