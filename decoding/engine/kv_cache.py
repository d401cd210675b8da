"""The target's KV cache: transformers' DynamicCache, with the full-attention layers a wrapper runs
keeping their keys and values in one shared buffer that grows, instead of one tensor per layer.

Why: a step of a tree method cuts the cache back to the accepted rows and, when the accepted path
is not the block's leading rows, moves those rows down. With transformers' DynamicLayer both are a
few tensor operations per layer (slices, a gather and a copy each for keys and values), and its
`update` concatenates each forward's rows onto the whole layer: from 6 to 36 layers, a DDTree step
went from 90 to 219 torch calls outside the passes, AR from 27 to 87
(`benchmarks/bench_host_overhead.py --count-ops --layers 36`; docs/gpu-bf16.md). Here:
- a forward writes only its new rows into the buffer (which grows by half when full);
- cutting the cache sets an integer per layer;
- moving accepted rows is one gather and one copy for all the buffer's layers at once
  (`KVBuffer.move_rows`), whatever the model's depth.

`BufferedLayer` is a DynamicLayer (transformers' masks, lengths and types read it as one) whose keys
and values are views of its slot of the buffer. Sliding-window layers (Gemma 2/3, Mistral) keep
transformers' own layer, handled by decoding/engine/attention_layout.py, one by one as before, except under the
static forward, whose buffer holds every layer's keys (a sliding layer's mask then hides those past its window). Under
a device_map there is one buffer per device; a layer whose keys do not match its buffer's shape or
dtype (different head sizes) gets a buffer of its own.

Memory: the buffer is sized at the prefill for the prompt, the answer (where the caller says how
long: the target in `generate`, a drafter in its `begin`) and HEADROOM rows more, so it rarely
grows; a growth holds the old and the new buffer at once (2.5x the cache for a moment, where
DynamicLayer's concatenation holds the cache plus one layer).

Static writes (the CUDA-graph forward of decoding/engine/static_forward.py): while `KVBuffer.write_slots` is
set, a layer's update writes the block's rows into those slots (a device tensor, so a graph can replay it at
any prefix) and returns its whole slot, every row of capacity (a sliding layer: its window's and the block's
columns, `window_columns`), and the mask hides the rows past the block. Its length is then set by the caller,
outside the graph. Such a buffer is zero-filled (`zeroed`): a hidden row is multiplied by a zero weight, and
uninitialised memory may hold NaN, which a zero weight does not cancel.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

MIN_CAPACITY = 256  # rows allocated at least, so short runs never grow the buffer
HEADROOM = 256  # rows a prefill adds to what its caller expects: a block of draft rows, or tokens nobody announced


class KVBuffer:
    """Keys [slots, batch, heads, capacity, head_dim] and values (their own head_dim) of `slots`
    layers; allocated by the first write, grown by half (at least to what a write needs)."""

    def __init__(self, slots: int, min_capacity: int = MIN_CAPACITY, zeroed: bool = False):
        self.slots, self.min_capacity, self.zeroed = slots, min_capacity, zeroed
        self.write_slots: torch.Tensor | None = None  # set during a static forward: the block rows' slots
        self.window_columns: torch.Tensor | None = None  # and the columns its sliding layers read (None: all)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.capacity = 0  # rows per slot
        self.generation = 0  # bumped when the tensors are (re)allocated: the layers' slot views are then stale

    def fits(self, keys: torch.Tensor, values: torch.Tensor) -> bool:
        if self.keys is None:
            return True
        return (keys.shape[:2] == self.keys.shape[1:3] and keys.shape[-1] == self.keys.shape[-1]
                and values.shape[-1] == self.values.shape[-1] and keys.dtype == self.keys.dtype
                and keys.device == self.keys.device)

    def reserve(self, keys: torch.Tensor, values: torch.Tensor, end: int) -> None:
        """Room for `end` rows in every slot (allocated like `keys`/`values` on the first call)."""
        if self.keys is not None and end <= self.capacity:
            return
        self.generation += 1
        if self.keys is None:
            self.capacity = max(end, self.min_capacity)
            shape = (self.slots, *keys.shape[:2], self.capacity)
            self.keys = self._new(keys, *shape, keys.shape[-1])
            self.values = self._new(values, *shape, values.shape[-1])
        else:
            old, self.capacity = self.capacity, max(end, self.capacity + self.capacity // 2)
            grown_keys = self._new(self.keys, *self.keys.shape[:3], self.capacity, self.keys.shape[-1])
            grown_values = self._new(self.values, *self.values.shape[:3], self.capacity, self.values.shape[-1])
            grown_keys[:, :, :, :old] = self.keys
            grown_values[:, :, :, :old] = self.values
            self.keys, self.values = grown_keys, grown_values

    def _new(self, like: torch.Tensor, *shape: int) -> torch.Tensor:
        return like.new_zeros(*shape) if self.zeroed else like.new_empty(*shape)

    def move_rows(self, rows: torch.Tensor, start: int) -> None:
        """Every slot's rows `rows` (positions, increasing, each >= start + its index) to start, start + 1, ...:
        one gather and one copy for keys, the same for values."""
        if self.keys is None:
            return
        end = start + len(rows)
        rows = rows.to(self.keys.device)
        self.keys[:, :, :, start:end] = self.keys.index_select(3, rows)
        self.values[:, :, :, start:end] = self.values.index_select(3, rows)


class BufferedLayer(DynamicLayer):
    """A layer whose keys and values are its slot of a KVBuffer, `length` rows long (a full-attention layer; under
    the static forward a sliding one too, keeping every key).
    It keeps views of its slot ([batch, heads, capacity, head_dim]) so that a forward's update is two
    row writes and two prefix views, about what DynamicLayer's two concatenations cost on the host."""

    def __init__(self, buffer: KVBuffer, slot: int, sliding: bool = False):
        self.buffer, self.slot, self.length, self.sliding = buffer, slot, 0, sliding
        self._views_of, self._slot_keys, self._slot_values = None, None, None
        super().__init__()

    def _slot_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of this layer's slot, remade when the buffer is another one or was reallocated."""
        if self._views_of != (self.buffer, self.buffer.generation):
            self._views_of = (self.buffer, self.buffer.generation)
            self._slot_keys, self._slot_values = self.buffer.keys[self.slot], self.buffer.values[self.slot]
        return self._slot_keys, self._slot_values

    @property
    def keys(self) -> torch.Tensor | None:
        return self._slot_views()[0][:, :, :self.length] if self.is_initialized else None

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        # transformers assigns None when it resets a layer and a prefix of the keys when it crops one
        if value is not None:
            self._assign(value, is_keys=True)

    @property
    def values(self) -> torch.Tensor | None:
        return self._slot_views()[1][:, :, :self.length] if self.is_initialized else None

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        if value is not None:
            self._assign(value, is_keys=False)

    def _assign(self, value: torch.Tensor, is_keys: bool) -> None:
        """transformers assigns keys, then values (a crop: leading views of both). The keys set the
        length; values that are a view of the stored ones are already in place."""
        stored = self.keys if is_keys else self.values
        if stored is not None and value.data_ptr() == stored.data_ptr():
            if is_keys:
                self.length = min(value.shape[-2], self.length)
            return
        if not self.is_initialized:
            raise ValueError("BufferedLayer: assign keys to a layer only after its first update")
        self.buffer.reserve(value, value, value.shape[-2])
        self._slot_views()[0 if is_keys else 1][:, :, :value.shape[-2]] = value
        if is_keys:
            self.length = value.shape[-2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        if not self.buffer.fits(key_states, value_states):  # another device or shape: a buffer of its own
            self.buffer, self.slot = KVBuffer(1, self.buffer.min_capacity), 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.buffer.write_slots
        if slots is not None:  # a static forward: no host bookkeeping here, a graph replays none
            keys, values = self._slot_views()
            keys.index_copy_(2, slots, key_states)
            values.index_copy_(2, slots, value_states)
            columns = self.buffer.window_columns
            if self.sliding and columns is not None:  # the window's keys only, not all capacity's
                return keys.index_select(2, columns), values.index_select(2, columns)
            return keys, values
        start, end = self.length, self.length + key_states.shape[-2]
        self.buffer.reserve(key_states, value_states, end)
        keys, values = self._slot_views()
        keys[:, :, start:end] = key_states
        values[:, :, start:end] = value_states
        self.length = end
        return keys[:, :, :end], values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False

    def offload(self):
        raise NotImplementedError("BufferedLayer: the engine's KV buffer cannot be offloaded (build the cache "
                                  "without offloading)")

    prefetch = offload


def buffered_cache(config, layers: tuple[int, ...], shared_layers: set[int], devices: dict | None = None,
                   min_capacity: int | None = None,
                   reuse: KVBuffer | None = None) -> tuple[DynamicCache, list[BufferedLayer]]:
    """transformers' DynamicCache for `config`, whose layers among `layers` that are in `shared_layers` (the
    full-attention ones; every layer for the static forward, sliding ones included, which then keep every key)
    share one KVBuffer per device (`devices`: layer -> the device its weights are on, under a device_map; the
    others, and layers this wrapper never runs, stay as transformers makes them). `min_capacity`:
    rows allocated at first (default MIN_CAPACITY), e.g. the prompt plus the tokens to generate.
    `reuse`: the buffer of every shared layer (one device), kept from an earlier cache: its tensors stay
    the same, as a CUDA graph that reads them needs."""
    cache = DynamicCache(config=config)
    capacity = max(MIN_CAPACITY, min_capacity or 0)
    shared = [i for i in layers if i in shared_layers and type(cache.layers[i]) in (DynamicLayer,
                                                                                     DynamicSlidingWindowLayer)]
    device_of = {i: (devices or {}).get(i) for i in shared}
    per_device = {d: [i for i in shared if device_of[i] == d] for d in dict.fromkeys(device_of.values())}
    if reuse is not None and (len(per_device) > 1 or reuse.slots != len(shared)):
        raise ValueError(f"a reused KV buffer of {reuse.slots} slots on one device cannot hold {len(shared)} "
                         f"layers on {len(per_device)} devices")
    buffered = []
    for members in per_device.values():
        buffer = reuse or KVBuffer(len(members), capacity)
        for slot, i in enumerate(members):
            cache.layers[i] = BufferedLayer(buffer, slot, sliding=type(cache.layers[i]) is DynamicSlidingWindowLayer)
            buffered.append(cache.layers[i])
    return cache, buffered
