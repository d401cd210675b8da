"""One wrapper around the target model, shared by every method.

Cache convention: the KV cache holds every committed token except the last one (the *root*, the
token the next forward starts from). A forward appends rows for a block of tokens; `keep_rows`
then compacts the cache to the prefix plus the rows that were accepted.

Layer skipping: a wrapper can own a subset of the decoder layers (`layers=`: an early-exit drafter
is the first k layers, a slim self-drafter the layers a routing mask keeps); it then runs embed ->
those layers -> final norm -> lm_head with the model's own modules and its own cache (an early
exit may put a trained `exit_head` before the final norm, decoding/drafting/exit_head.py). A single
forward can also run a subset of the wrapper's layers (`active_layers=`, the slim verifier of
VIA-SD): such a pass only reads the cache, its block KV is dropped afterwards, because the KV of a
layer fed by a slimmed residual stream is not the full model's KV (a later full pass recomputes it).

Sliding-window attention (Gemma 2/3, Qwen2 with its window on, Mistral): the model's layer types and its sliding
layers' caches are handled in one place, decoding/engine/attention_layout.py (masks per layer type, the
window applied to the block rows' positions, sliding caches compacted and cut like the others);
the layer-subset path gives each layer its type's mask and rotary embedding and repeats what the model's
own forward does around its stack (embedding multiplier, logit scale, soft-cap: decoding/engine/readout.py).

CUDA graphs (`graphs=`, `model.cuda_graph`): on a GPU, a full-model block forward of up to
static_forward.MAX_ROWS rows is replayed from a CUDA graph at fixed shapes (decoding/engine/static_forward.py);
the prefill, layer subsets and longer blocks stay eager. Its KV buffer holds every layer, a sliding one too (with
every key: the masks hide those past the window, `_sliding_keys`).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from decoding.engine import attention_layout, cuda_graph, kv_cache, static_forward
from decoding.engine.attention_layout import AttentionLayout
from decoding.engine.cuda_graph import GraphReplayer
from decoding.engine.kv_cache import BufferedLayer, KVBuffer, buffered_cache
from decoding.engine.readout import Readout
from decoding.engine.static_forward import StaticBlock
from decoding.engine.transfer import to_device
from decoding.engine.tree import TokenTree
from pipeline.errors import ConfigError


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [n, V], float32
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer id -> [n, H] (output of that decoder layer)
    # taps of the committed tokens re-run in front of the block (the engine's pending catch-up), in order
    pending_hidden: dict[int, torch.Tensor] = field(default_factory=dict)


def cache_argument(params, fallback: str) -> str:
    """The name under which a forward (of a model or a decoder layer) takes the KV cache, by its signature."""
    return next((name for name in ("cache", "past_key_values") if name in params), fallback)


class TargetModel:
    """Prefill, block/tree forwards with a custom mask, hidden-state taps, KV compaction."""

    def __init__(self, model: torch.nn.Module, tokenizer=None, layers=None, exit_head: torch.nn.Module | None = None,
                 kv_buffer: bool = True, graphs: GraphReplayer | None = None):
        """`kv_buffer=False`: transformers' plain DynamicCache instead of the shared KV buffer
        (decoding/engine/kv_cache.py); benchmarks/bench_kv_cache.py compares the two. `graphs`: replays
        the block forwards from CUDA graphs where it is enabled (decoding/engine/static_forward.py)."""
        self.model = model.eval()
        self.exit_head = exit_head  # applied to the last layer's output, before the final norm
        self.tokenizer = tokenizer
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.packed_linears = 0  # linear layers packed for oneDNN (decoding/engine/packed_linear.py; set by the loader)
        self.num_layers = self.config.num_hidden_layers
        # The decoder layers this wrapper runs (all of them for the target; a subset for a drafter
        # made from the target's own layers, which then keeps its own cache).
        self.layers: tuple[int, ...] = tuple(range(self.num_layers)) if layers is None else tuple(sorted(set(layers)))
        if not self.layers or not all(0 <= i < self.num_layers for i in self.layers):
            raise ValueError(f"layers must be a non-empty subset of 0..{self.num_layers - 1}, got {layers}")
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.2x renamed past_key_values -> cache and dropped cache_position.
        self._cache_kw = cache_argument(params, fallback="past_key_values")
        self._pass_cache_position = "cache_position" in params
        # the same rename in the decoder layers, which the layer-subset path calls directly (their **kwargs
        # would swallow a wrongly named cache: no KV written, no error); a layer naming neither: the model's name
        decoder = getattr(getattr(model, "model", None), "layers", None)
        layer_params = inspect.signature(decoder[0].forward).parameters if decoder else {}
        # where each of this wrapper's layers keeps its weights (a device_map spreads them): one KV buffer per device
        self._layer_devices = {i: next(decoder[i].parameters()).device for i in self.layers} if decoder else {}
        if exit_head is not None and self._layer_devices:  # it reads the last layer's output, on that layer's device
            self.exit_head = exit_head.to(self._layer_devices[self.layers[-1]])
        # every device its weights sit on: the layers', and the embedding's and LM head's, which a device_map may put
        # elsewhere (CUDA graphs need one; a cost curve measured on one is not a split target's)
        ends = [w.device for m in (model.get_input_embeddings(), model.get_output_embeddings())
                if (w := getattr(m, "weight", None)) is not None]
        self.devices = frozenset({*self._layer_devices.values(), *ends})
        self._layer_cache_kw = cache_argument(layer_params, fallback=self._cache_kw)
        self.layout = AttentionLayout.of(self.config)  # the decoder layers' attention types and windows
        self._full_layers = {i for i, t in enumerate(self.layout.types) if t == attention_layout.FULL}
        # one of this wrapper's sliding layers (they are cut in step), read where transformers < 5.25
        # returns a sliding layer's recorded past: the masks must then cover those keys
        self._sliding_layer = next((i for i in self.layers if self.layout.types[i] == attention_layout.SLIDING), None)
        rotary = getattr(getattr(model, "model", None), "rotary_emb", None)  # the layer-subset path's RoPE
        self._rotary_per_type = rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters
        # what the model's forward does around its stack (embedding multiplier, logit scale, soft-cap): the
        # layer-subset path repeats it, checked against the model's own forward at its first use
        self.readout = Readout.of(self.config)
        self.context_limit: int | None = getattr(self.config, "max_position_embeddings", None)
        self.kv_buffer = kv_buffer
        self.cache: DynamicCache | None = None
        # the cache's layers in the KV buffer (decoding/engine/kv_cache.py): the full-attention ones; every layer under
        # the static forward
        self._buffered: list[BufferedLayer] = []
        # decode-time passes through this wrapper's weights (prefill excluded): the raw count, and the
        # cost-weighted count in full-model units (a pass over k of the model's L layers counts k/L)
        self.num_forwards = 0
        self.forward_cost = 0.0
        self.graphs = graphs if graphs is not None and graphs.enabled and self.is_full and exit_head is None else None
        self._static_buffer: KVBuffer | None = None  # the graphs' KV buffer, kept from prompt to prompt
        self._columns: torch.Tensor | None = None  # arange(capacity) on the device: slots and row picks
        self._graphed_generation: int | None = None  # the buffer allocation the graphs read
        if self.graphs is not None:
            why = static_forward.check_static(model, set(self.devices), kv_buffer)
            if why:
                raise ConfigError(f"{graphs.what}=true: {self.config.model_type} cannot be replayed from CUDA graphs: "
                                  f"{why}; set {graphs.what}=false")

    def sibling_graphs(self, device) -> GraphReplayer | None:
        """A replayer of its own for another model run beside this one (a separate drafter) on `device`, or None
        (no graphs here, or a device without them)."""
        if self.graphs is None:
            return None
        graphs = cuda_graph.graphs_for(device, True, self.graphs.what, self.graphs.emulate)
        return graphs if graphs.enabled else None

    # ------------------------------------------------------------------ cache
    def reset(self, rows_expected: int = 0) -> None:
        """A new, empty cache; `rows_expected` (the prompt plus the tokens to generate) sizes its KV buffer,
        which otherwise grows by half when full (a copy, during which old and new buffers coexist)."""
        if self.graphs is not None:  # one buffer for every prompt: the graphs read its tensors
            need, buffer = static_forward.capacity_for(rows_expected), self._static_buffer
            # every replay attends over the whole buffer: one left at 4x the size this prompt needs (after a long
            # prompt, or CaDDTree's cost profile up to 8192 rows of context) is rebuilt to size, graphs anew (4x, not
            # 2x: prompts of mixed lengths, e.g. 2048- and 4096-row buffers in turn, must not recapture every time)
            too_small = buffer is None or buffer.capacity < rows_expected + static_forward.MAX_ROWS
            if too_small or buffer.capacity >= 4 * need:
                self.graphs.forget()  # they hold the old buffer's tensors
                self._graphed_generation = None
                # every layer, a sliding one too (it keeps every key: its static mask applies the window)
                self._static_buffer = KVBuffer(len(self.layers), need, zeroed=True)
            self.cache, self._buffered = buffered_cache(self.config, self.layers, set(self.layers),
                                                        self._layer_devices, reuse=self._static_buffer)
        elif self.kv_buffer:
            self.cache, self._buffered = buffered_cache(self.config, self.layers, self._full_layers,
                                                        self._layer_devices, rows_expected)
        else:
            self.cache, self._buffered = DynamicCache(config=self.config), []
        attention_layout.record_past(self.cache)
        self.num_forwards = 0
        self.forward_cost = 0.0

    @property
    def output_device(self) -> torch.device:
        """Where every forward's logits and taps come out: the input device. Under a device_map split over
        GPUs, accelerate's hook on the whole model returns its outputs there (the lm_head may sit on the
        last GPU); the paths that call the head or the layers themselves move theirs to it, so the sampler,
        the acceptance and the drafters see one device whichever path ran."""
        return self.device

    @property
    def cache_len(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length(self.layers[0])

    @property
    def is_full(self) -> bool:
        return len(self.layers) == self.num_layers

    @torch.inference_mode()
    def keep_rows(self, prefix_len: int, rows: list[int]) -> None:
        """Keep cache[:prefix_len] plus block rows `rows` (relative to prefix_len, increasing), dropping the rest.

        Our own gather: DynamicCache.crop(0) is a no-op in transformers 5 and crop() cannot drop
        non-contiguous rows of a tree. Rows that already sit in place (the accepted path's leading
        run) are left alone; the others are copied down in place, then every layer is cut. The
        full-attention layers share one buffer, moved in one gather for all of them
        (decoding/engine/kv_cache.py); a sliding layer's rows are found through its offset.
        """
        moved = next((i for i, r in enumerate(rows) if r != i), len(rows))
        if moved < len(rows):
            kept = to_device([r + prefix_len for r in rows[moved:]], self.device)  # cache slots of a full layer
            start = prefix_len + moved
            for buffer in {id(layer.buffer): layer.buffer for layer in self._buffered}.values():
                buffer.move_rows(kept, start)
            indices = {}  # (offset, device) -> the kept rows' slots in such a layer
            for layer in self._unbuffered_cached():
                first = attention_layout.offset(layer)
                key = (first, layer.keys.device)  # a device_map spreads layers over devices
                if key not in indices:
                    indices[key] = kept.to(layer.keys.device) - first
                index = indices[key]
                lo, hi = start - first, start - first + len(rows) - moved
                layer.keys[:, :, lo:hi] = layer.keys.index_select(2, index)
                layer.values[:, :, lo:hi] = layer.values.index_select(2, index)
        self.truncate(prefix_len + len(rows))

    def truncate(self, length: int) -> None:
        """Keep the first `length` cached tokens of every layer (a sliding layer: the last
        window - 1 of them)."""
        for layer in self._buffered:
            if layer.length > length:
                layer.length = length
        for layer in self._unbuffered_cached():
            attention_layout.cut(layer, length)

    def can_cut_to(self, length: int) -> bool:
        """True when `truncate(length)` leaves what a fresh pass over the first `length` tokens would: always
        without sliding layers; with them, while each still holds the window - 1 keys before `length` (after
        a forward it holds them all until the next cut, which keeps only the last window - 1)."""
        return all(attention_layout.exact_cut(layer, length) for layer in self._unbuffered_cached())

    def snapshot(self) -> tuple:
        """A copy of the cache to come back to with `restore` (a copy: forwards write the KV buffer in place)."""
        if self.graphs is not None:
            raise ValueError("snapshot: the CUDA graphs read one KV buffer in place; build the wrapper without graphs")
        return copy.deepcopy((self.cache, self._buffered))

    def restore(self, snapshot: tuple) -> None:
        """The cache as `snapshot` took it (a fresh copy each time, so a snapshot can be restored again)."""
        if self.graphs is not None:
            raise ValueError("restore: the CUDA graphs read one KV buffer in place; build the wrapper without graphs")
        self.cache, self._buffered = copy.deepcopy(snapshot)

    def _unbuffered_cached(self):
        """The cache's layers outside the KV buffer that hold keys (sliding ones; all of them with kv_buffer=False)."""
        if len(self._buffered) == len(self.cache.layers):
            return []
        return [layer for layer in self.cache.layers if not isinstance(layer, BufferedLayer)
                and layer.keys is not None and layer.keys.numel() > 0]

    def _sliding_keys(self) -> int | None:
        """How many cached keys a sliding layer returns in front of the next block where it returns more than the
        window's: every key it keeps in the static forward's buffer, every recorded key with transformers < 5.25;
        None: the layout's default, min(prefix, window - 1)."""
        if self._sliding_layer is None:
            return None
        layer = self.cache.layers[self._sliding_layer]
        if not isinstance(layer, BufferedLayer) and not attention_layout.returns_recorded_past():
            return None
        keys = layer.keys
        return 0 if keys is None else keys.shape[-2]

    def _past_window(self, sliding_keys: int | None) -> bool:
        """True when the sliding layers will return keys beyond the window (every kept key in the static forward's
        buffer, the recorded past with transformers < 5.25): a block then needs our explicit mask, even one row or a
        plain chain."""
        return sliding_keys is not None and sliding_keys >= self.layout.windows[attention_layout.SLIDING]

    # ---------------------------------------------------------------- forward
    @torch.inference_mode()
    def prefill(self, ids: list[int], hidden_layers: tuple[int, ...] = (), rows_expected: int = 0) -> ForwardOutput:
        """Reset the cache and run `ids` through the model (all of them are cached). Logits come
        back for the last row only (no [n, V] matrix over the prompt); hidden taps for every row.
        `rows_expected`: the rows the cache will hold, as far as the caller knows (the prompt and the answer);
        the KV buffer gets HEADROOM more (`reset`)."""
        self.reset(max(rows_expected, len(ids)) + kv_cache.HEADROOM)
        if not ids:
            return ForwardOutput(torch.empty(0, self.config.vocab_size, device=self.output_device))
        tokens = torch.tensor(ids, device=self.device)
        out = self._run(tokens, torch.arange(len(ids), device=self.device), None, hidden_layers,
                        last_only=True, layers=self.layers)
        if self.graphs is not None and any(layer.buffer is not self._static_buffer for layer in self._buffered):
            raise ConfigError(f"{self.graphs.what}=true: {self.config.model_type} cannot be replayed from CUDA graphs: "
                              f"its layers' keys or values differ in shape (the graphs read one KV buffer holding "
                              f"every layer); set {self.graphs.what}=false")
        self.truncate(len(ids))  # sliding layers back to their window
        self.num_forwards, self.forward_cost = 0, 0.0
        return out

    @torch.inference_mode()
    def forward(
        self,
        tokens,
        depths,
        visible=None,
        hidden_layers: tuple[int, ...] = (),
        active_layers=None,
        last_only: bool = False,
    ) -> ForwardOutput:
        """Append a block after the cache. `tokens` and `depths` (offsets from the cache length:
        position = cache_len + depth) are device tensors, or host lists/arrays that reach the device
        as one copy; `visible` [n, n] bool (tensor or numpy) says which block rows each row attends
        to (None = plain causal chain, the cheapest case).

        `active_layers` (a subset of the wrapper's layers) runs only those decoder layers: a
        read-only pass whose block KV is dropped again, so the cache stays the full model's; it
        counts len(active_layers) / L of a full forward in `forward_cost`. `last_only` computes
        logits for the last row only."""
        prefix = self.cache_len
        if isinstance(tokens, torch.Tensor) and isinstance(depths, torch.Tensor):
            tokens, positions = tokens.to(self.device), depths.to(self.device) + prefix
        else:  # host rows: one packed host->device copy
            packed = np.asarray([tokens, depths], dtype=np.int64)
            packed[1] += prefix
            tokens, positions = to_device(packed, self.device)
        layers = self.layers if active_layers is None else tuple(sorted(set(active_layers)))
        if not set(layers) <= set(self.layers):
            raise ValueError(f"active_layers {layers} are not all layers of this wrapper")
        scratch = layers != self.layers
        self.num_forwards += 1
        self.forward_cost += len(layers) / self.num_layers
        if self._replayable(len(tokens), scratch):
            return self._run_static(tokens, positions, visible, prefix, hidden_layers, last_only)
        mask = None
        sliding_keys = self._sliding_keys()
        if visible is None and self._past_window(sliding_keys):  # the model's own mask would not cover them
            visible = torch.ones(len(tokens), len(tokens), dtype=torch.bool, device=self.device).tril()
        if visible is not None:
            mask = self.layout.masks(to_device(visible, self.device, torch.bool), positions, prefix, self.dtype,
                                     sliding_keys)
        out = self._run(tokens, positions, mask, hidden_layers, last_only, layers)
        if scratch:
            self.truncate(prefix)
        return out

    def _replayable(self, rows: int, scratch: bool) -> bool:
        return (self.graphs is not None and not scratch and 0 < rows <= static_forward.MAX_ROWS
                and self._static_buffer is not None and self._static_buffer.keys is not None)

    def _run_static(self, tokens, positions, visible, prefix: int, hidden_layers, last_only: bool) -> ForwardOutput:
        """The block through the graph of its bucket (decoding/engine/static_forward.py); outputs cloned."""
        buffer = self._static_buffer
        rows = static_forward.bucket(len(tokens))
        buffer.reserve(buffer.keys[0], buffer.values[0], prefix + rows)
        if buffer.generation != self._graphed_generation:  # grown (here or by an eager write): new tensors
            self.graphs.forget()  # every graph is captured again, none keeps the old buffer alive
            self._graphed_generation = buffer.generation
        if self._columns is None or len(self._columns) != buffer.capacity:
            self._columns = torch.arange(buffer.capacity, device=self.device)
        for layer in self._buffered:  # a prompt of one token has no prefill: its layers start here, on the host
            if not layer.is_initialized:
                layer.lazy_initialization(buffer.keys[0], buffer.values[0])
        if visible is not None:
            visible = to_device(visible, self.device, torch.bool)
        block = StaticBlock(tokens, positions, visible, prefix, buffer.capacity, self.dtype, self._columns,
                            last_only, self.layout.windows.get(attention_layout.SLIDING))
        taps = tuple(hidden_layers)
        name = f"target:{rows}" + (":last" if last_only else "") + (f":taps{list(taps)}" if taps else "")
        logits, *hidden = self._replay(name, block.inputs(), {"keys": buffer.keys, "values": buffer.values,
                                                              "taps": taps})
        for layer in self._buffered:
            layer.length = prefix + len(tokens)
        logits = logits.clone() if last_only else logits[:len(tokens)].clone()
        return ForwardOutput(logits, {i: h[:len(tokens)].clone() for i, h in zip(taps, hidden)})

    def _replay(self, name: str, inputs: dict, constants: dict):
        """The network pass of a static forward: its inputs copied in, the graph replayed (captured first)."""
        return self.graphs(name, self._static_pass, inputs, constants)

    def _static_pass(self, input_ids, position_ids, mask, sliding_mask, sliding_columns, slots, last_row, keys, values,
                     taps):
        """The captured function: the base model over the padded block, writing its KV to `slots` (sliding layers
        reading the keys at `sliding_columns`), then the LM head on every row or on `last_row`. `keys`/`values`
        (the buffer's) only key the graph."""
        buffer = self._static_buffer
        buffer.write_slots, buffer.window_columns = slots, sliding_columns
        masks = self.layout.as_given({attention_layout.FULL: mask, attention_layout.SLIDING: sliding_mask})
        try:
            out = self.model.model(input_ids=input_ids, position_ids=position_ids, attention_mask=masks,
                                   use_cache=True, output_hidden_states=bool(taps), **{self._cache_kw: self.cache})
        finally:
            buffer.write_slots = buffer.window_columns = None
        h = out.last_hidden_state[0]
        if last_row is not None:
            h = h.index_select(0, last_row)
        logits = self.readout.read(self.model.lm_head, h).to(self.device).float()
        return (logits, *(out.hidden_states[i + 1][0].to(self.device) for i in taps))

    def forward_tree(self, tree: TokenTree, hidden_layers: tuple[int, ...] = ()) -> ForwardOutput:
        return self.forward(tree.tokens, tree.depths, None if tree.is_chain else tree.ancestor_array(), hidden_layers)

    @torch.inference_mode()
    def _run(self, tokens, positions, mask, hidden_layers, last_only: bool = False, layers=None) -> ForwardOutput:
        if self.exit_head is not None or (layers is not None and len(layers) < self.num_layers):
            return self._run_layers(tokens, positions, mask, hidden_layers, last_only, layers)
        kwargs = {
            "input_ids": tokens[None],
            "position_ids": positions[None],
            "attention_mask": mask,
            self._cache_kw: self.cache,
            "use_cache": True,
            "output_hidden_states": bool(hidden_layers),
        }
        if self._pass_cache_position:
            start = self.cache_len
            kwargs["cache_position"] = torch.arange(start, start + len(tokens), device=self.device)
        if last_only:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        hidden = {}
        if hidden_layers:
            # hidden_states[0] is the embedding output; the output of decoder layer i is [i + 1].
            hidden = {i: out.hidden_states[i + 1][0].to(self.device) for i in hidden_layers}
        # to the input device: accelerate's hook on a device_map'd model does it, but not on an image-text
        # checkpoint's text part (pipeline/models.py text_causal_lm), whose hook sat on the whole checkpoint
        return ForwardOutput(out.logits[0].to(self.device).float(), hidden)

    @torch.inference_mode()
    def _run_layers(self, tokens, positions, mask, hidden_layers, last_only, layers) -> ForwardOutput:
        """The decoder stack with only `layers` (skipped layers pass the residual stream through
        and write no KV), built from the model's own modules: embeddings, rotary embedding (per
        layer type where the model has one per type), decoder layers (each with its type's mask,
        writing its KV to its own cache layer by its layer index), final norm, head, and the model's readout
        (decoding/engine/readout.py: embedding multiplier, logit scale, soft-cap)."""
        self.readout.check_once(self.model)  # once per model: a forward doing more than the readout knows is refused
        stack, head, types = self.model.model, self.model.lm_head, self.layout.types
        prefix = self.cache_len
        # plain causal chain after the cached prefix (one row needs no mask: forward() has built one where a sliding
        # layer returns keys past its window, and a prefill starts from an empty cache)
        if mask is None and len(tokens) > 1:
            n = len(tokens)
            chain = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            mask = self.layout.masks(chain, positions, prefix, self.dtype, self._sliding_keys())
        pos = positions[None]
        h = self.readout.embed(stack.embed_tokens(tokens[None]))
        if self._rotary_per_type:
            rope = {t: stack.rotary_emb(h, pos, t) for t in dict.fromkeys(types[i] for i in layers)}
        else:
            shared = stack.rotary_emb(h, pos)  # one rotary embedding for every layer type
            rope = {t: shared for t in set(types)}
        hidden = {}
        for i in layers:
            layer_mask = None if mask is None else AttentionLayout.mask_for(mask, types[i])
            h = stack.layers[i](h, attention_mask=layer_mask, position_ids=pos, use_cache=True,
                                position_embeddings=rope[types[i]], **{self._layer_cache_kw: self.cache})
            if i in hidden_layers:
                hidden[i] = h[0].to(self.device)  # a layer's device under a device_map
        if last_only:
            h = h[:, -1:]
        if self.exit_head is not None:
            h = self.exit_head(h)
        logits = self.readout.read(head, stack.norm(h))[0]
        return ForwardOutput(logits.to(self.device).float(), hidden)  # from the head's device under a device_map
