"""Per-layer-type attention, read from the model's config and cache: which decoder layers attend to
the whole context and which to a sliding window (Gemma 2/3, Qwen2 with its window on, Mistral),
the mask each type needs for a block of tree/aux rows, and the sliding layers' cache bookkeeping.

transformers 5 gives a hybrid model one mask per layer type (a dict keyed by layer type) and a
DynamicSlidingWindowLayer per sliding layer, which keeps only the last `window - 1` keys and counts
every token it has seen (`cumulative_length`). We keep that memory bound and follow its rules:

- a sliding layer keeps recording past keys until we cut it (`activate_past_recording`), so the
  rows of a rejected draft can be dropped without having evicted the window's oldest keys;
- in a forward, a sliding layer returns its last min(cached, window - 1) keys, then the block's;
  a block row at position q sees a key at position k when q - window < k (the sliding overlay of
  transformers' masking_utils), on top of the tree/aux visibility;
- a sliding layer's stored key i sits at position `cumulative_length - stored + i` (`offset`), so
  compaction and truncation index through it, then cut the layer back to `window - 1` keys.

transformers before 5.25 (5.17, the GPU image's) differs in two ways, both handled here: it gives one
kwargs dict for every layer type, and a recording sliding layer returns *every* key it holds, not
the last `window - 1`; so after several forwards without a cut (a drafter's one-row passes) a row
would attend past its window unless the mask covers those keys too (`returns_recorded_past`,
`TargetModel._sliding_keys`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicSlidingWindowLayer, get_layer_types_and_kwargs

FULL, SLIDING = "full_attention", "sliding_attention"


class UnsupportedArchitecture(ValueError):
    """A layer type the engine does not handle (one line for the user)."""


@dataclass(frozen=True)
class AttentionLayout:
    types: tuple[str, ...]  # per decoder layer: FULL or SLIDING
    windows: dict[str, int | None]  # per layer type: its sliding window (None: the whole context)

    @classmethod
    def of(cls, config) -> "AttentionLayout":
        config = config.get_text_config(decoder=True)  # as DynamicCache reads it
        types, kwargs = get_layer_types_and_kwargs(config)
        unknown = sorted(set(types) - {FULL, SLIDING})
        if unknown:
            raise UnsupportedArchitecture(f"{config.model_type}: layer type(s) {', '.join(unknown)} are not supported "
                                          f"by the decoding engine (it handles {FULL} and {SLIDING})")
        if isinstance(kwargs, dict):  # transformers older than 5.25 (5.17 seen): one kwargs dict for every layer
            kwargs = [kwargs] * len(types)
        windows: dict[str, int | None] = {FULL: None}
        sizes = {int(kw["sliding_window"]) for t, kw in zip(types, kwargs) if t == SLIDING}
        if len(sizes) > 1:
            raise UnsupportedArchitecture(f"{config.model_type}: sliding layers with different windows {sorted(sizes)} "
                                          "are not supported by the decoding engine")
        if sizes:
            windows[SLIDING] = sizes.pop()
        return cls(tuple(types), {t: windows[t] for t in dict.fromkeys(types)})

    @property
    def is_uniform(self) -> bool:
        return len(self.windows) == 1

    def masks(self, visible: torch.Tensor, positions: torch.Tensor, prefix_len: int, dtype: torch.dtype,
              sliding_keys: int | None = None):
        """The additive masks of a block after `prefix_len` cached tokens: one [1, 1, n, keys] float
        tensor for a model with one layer type, else {layer type: mask}. `visible` [n, n] bool says
        which block rows each row attends to; `positions` [n] are the rows' absolute positions;
        `sliding_keys`: how many cached keys a sliding layer returns in front of the block (default
        min(prefix_len, window - 1); more where the layer returns its recorded past).
        Always float: a boolean 4D mask is silently wrong under eager attention in transformers 5."""
        return self.as_given({t: self._mask(visible, positions, prefix_len, w, dtype, sliding_keys)
                              for t, w in self.windows.items()})

    def as_given(self, masks: dict):
        """{layer type: mask} as the model's forward takes it: the one tensor for a model of one layer type (the
        forwards of one-type models, LLaMA or Mistral, take no dict), else the dict of this model's types."""
        return masks[self.types[0]] if self.is_uniform else {t: masks[t] for t in self.windows}

    @staticmethod
    def _mask(visible, positions, prefix_len: int, window: int | None, dtype, sliding_keys: int | None) -> torch.Tensor:
        n = visible.shape[0]
        if window is None:
            cached = prefix_len
        else:
            cached = min(prefix_len, window - 1) if sliding_keys is None else sliding_keys
        blocked = torch.finfo(dtype).min
        mask = torch.zeros(1, 1, n, cached + n, dtype=dtype, device=visible.device)
        mask[0, 0, :, cached:].masked_fill_(visible.logical_not(), blocked)  # a view: the block's own columns
        if window is not None:
            key_positions = torch.cat([torch.arange(prefix_len - cached, prefix_len, device=positions.device),
                                       positions])
            mask[0, 0].masked_fill_(outside_window(key_positions, positions, window), blocked)
        return mask

    @staticmethod
    def mask_for(masks, layer_type: str):
        """The mask one layer gets from `masks()`'s result (a tensor serves every layer)."""
        return masks[layer_type] if isinstance(masks, dict) else masks


def outside_window(key_positions: torch.Tensor, query_positions: torch.Tensor, window: int) -> torch.Tensor:
    """[queries, keys] bool: the keys a sliding layer's row does not see (a key at position k is in the window of a
    row at position q when q - window < k: the sliding overlay of transformers' masking_utils)."""
    return key_positions[None, :] <= query_positions[:, None] - window


# ------------------------------------------------------------------ cache layers
@functools.cache
def returns_recorded_past() -> bool:
    """Whether a recording sliding layer returns every key it holds (transformers < 5.25) instead of
    the last `window - 1` plus the block's: asked of the installed transformers' layer itself."""
    layer = DynamicSlidingWindowLayer(sliding_window=2)
    layer.activate_past_recording()
    kv = torch.zeros(1, 1, 3, 1)
    layer.update(kv, kv)  # three keys recorded, one more than the window keeps
    keys, _ = layer.update(kv[:, :, :1], kv[:, :, :1])
    return keys.shape[-2] > 2  # 5.25: window - 1 + 1 = 2


def record_past(cache) -> None:
    """Make every sliding layer keep its evicted keys until `cut` (so a rejected draft can be dropped)."""
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()


def offset(layer) -> int:
    """Position of the layer's first stored key (0 for a full-attention layer)."""
    if not getattr(layer, "is_sliding", False):
        return 0
    return layer.cumulative_length - layer.keys.shape[-2]


def exact_cut(layer, length: int) -> bool:
    """Whether `cut(layer, length)` leaves every key the next token can see: a sliding layer must still
    hold the window - 1 positions before `length` (it may have dropped older ones)."""
    if not getattr(layer, "is_sliding", False):
        return True
    return offset(layer) <= max(0, length - (layer.sliding_window - 1))


def cut(layer, length: int) -> None:
    """Keep the layer's keys of positions < `length`; a sliding layer then keeps only the last
    window - 1 of them (all the next token can see) and counts `length` tokens seen."""
    start = offset(layer)
    if not exact_cut(layer, length):
        raise ValueError(f"cannot cut a sliding layer to {length} tokens: it keeps positions from {start} on, "
                         f"fewer than the window before that length")
    if layer.keys.shape[-2] > length - start:
        layer.keys = layer.keys[:, :, : length - start]
        layer.values = layer.values[:, :, : length - start]
    if getattr(layer, "is_sliding", False):
        keep = layer.sliding_window - 1
        if layer.keys.shape[-2] > keep:
            layer.keys = layer.keys[:, :, -keep:]
            layer.values = layer.values[:, :, -keep:]
        layer.cumulative_length = length
