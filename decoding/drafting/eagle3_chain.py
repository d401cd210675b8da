"""EAGLE-3 as the drafter of the drafter-verifier methods (`drafter=eagle3` for sd and spec_cascade):
γ tokens drafted one by one from the EAGLE-3 model, each fed back with its own h, sampled from its
distribution at T > 0 (scattered over the full vocabulary, zero outside the draft vocabulary) so
speculative sampling stays lossless.

Unlike the other drafters it reads the target's features: the method asks the target for the three
layers at prefill and in every verification (`hidden_layers`) and hands the verified rows over
(`on_prefill`, `observe`), exactly as `method=eagle3` keeps its cache (decoding/methods/eagle3.py).

VIA-SD commits tokens its slim tier settles without running the full target, so they have no target
features yet. The drafter then feeds them as it feeds its own drafts: each with the previous row's
h in place of the target feature (scratch rows, like a draft's). When the full target next runs, it
re-runs those tokens first (the engine's pending catch-up) and their taps (`pending_hidden`) replace
the scratch rows by target-fed ones, so the cache only ever holds rows built from target features.
"""

from __future__ import annotations

import torch

from decoding.drafting.eagle3_drafter import fitted_embeddings, load_eagle3
from decoding.engine import cuda_graph
from decoding.engine.sampling import ChainDraws, Sampler, probabilities
from decoding.engine.transfer import to_device, to_host


class Eagle3ChainDrafter:
    shares_target = False

    def __init__(self, location: str, target, graphs: bool = True):
        self.model = load_eagle3(location, device=target.device, dtype=target.dtype)
        spec, cfg = self.model.spec, target.config
        self.hidden_layers = tuple(spec.layer_ids(cfg.num_hidden_layers))
        self.embed = fitted_embeddings(self.model, self.hidden_layers, target, f"drafter=eagle3: {location}")
        self.target = target
        self.vocab_size = cfg.vocab_size
        self.draft_to_target = self.model.to_target_ids(torch.arange(spec.draft_vocab_size, device=target.device))
        self.passes = 0
        # on CUDA the chain replays from one CUDA graph per draft (`draft_chain`; drafter.cuda_graph)
        self.graphs = cuda_graph.graphs_for(self.model.lm_head.weight.device, graphs, "drafter.cuda_graph")
        self.cache = self.model.new_cache()  # its buffers are kept from prompt to prompt (so are the graphs)
        self.past_t = torch.zeros((), dtype=torch.long, device=target.device)  # rows before the chain's first

    def begin(self, sequence: list[int], rows_expected: int = 0) -> None:
        self.cache.clear(rows_expected)
        if self.cache.take_moved():  # resized for this prompt: the old buffers' graphs (and memory) go now
            self.graphs.forget()
        self.last_h = None  # h of the newest target-fed row: it drafts the token after the cache's last input
        self.tail = ([], None)  # (tokens fed on own states, in the buffer after the cache's rows; the h after them)

    def on_prefill(self, output, prompt_ids: list[int]) -> None:
        self.pending = (self._features(output.hidden, None), prompt_ids[1:])

    def observe(self, result, sequence: list[int]) -> None:
        """A verified step; `sequence`: every committed token after it."""
        rows = result.verdict.path[:len(result.committed)]
        features, next_tokens = self._features(result.output.hidden, rows), result.committed[:len(rows)]
        caught_up = result.output.pending_hidden
        if caught_up:  # tokens settled without the target, re-run in front of this block: theirs first
            n = len(next(iter(caught_up.values())))
            features = torch.cat([self._features(caught_up, None), features])
            next_tokens = sequence[self.cache.length + 1:self.cache.length + 1 + n] + next_tokens
        self.pending = (features, next_tokens)

    def _features(self, hidden: dict, rows) -> torch.Tensor:
        if not hidden:
            return torch.empty(0, 3 * self.model.spec.target_hidden_size, device=self.target.device,
                               dtype=self.target.dtype)
        feats = torch.cat([hidden[layer] for layer in self.hidden_layers], dim=-1)
        return feats if rows is None else feats.index_select(0, to_device(rows, feats.device))

    @torch.inference_mode()
    def draft(self, sequence: list[int], gamma: int, temperature: float, sampler: Sampler,
              need_dists: bool = True) -> tuple[list[int], torch.Tensor | None]:
        features, next_tokens = self.pending
        device = features.device
        if len(features):  # target-fed rows replace the tail's (written over them)
            self.last_h = self.model.extend(self.cache, features, self.embed(to_device(next_tokens, device)))[-1:]
            self.passes += 1
            self.pending = (features[:0], [])
            self.tail = ([], self.last_h)
        if self.last_h is None:  # a one-token prompt: nothing to draft from yet
            return [], torch.empty(0, self.vocab_size, device=device)
        tail = sequence[self.cache.length + 1:]
        fed = self.tail[0] if tail[:len(self.tail[0])] == self.tail[0] else []  # rows still valid after the cache
        self.cache.reserve(len(tail), scratch=max(gamma - 1, self.cache.scratch), keep=len(fed))
        if self.cache.take_moved():  # new buffers (the fed tail's rows copied along): graphs on the old ones go
            self.graphs.forget()
        h = self._tail(tail, device)
        self.past_t.fill_(self.cache.length + len(tail))
        sampled = temperature > 0
        inputs = {"h": h, "uniforms": sampler.for_device(device).uniform(gamma, torch.float64) if sampled else None}
        constants = {"keys": self.cache.buffer_k, "values": self.cache.buffer_v, "past": self.past_t,
                     "scratch_at": self.cache.capacity, "drafter": self.model, "embed": self.embed,
                     "draft_to_target": self.draft_to_target, "gamma": gamma, "temperature": temperature}
        if self.graphs.enabled:  # one graph per temperature and γ (each a constant of its graph)
            tokens, rows = self.graphs(f"eagle3_chain_T{temperature!r}_{gamma}", draft_chain, inputs, constants)
        else:
            tokens, rows = draft_chain(**inputs, **constants)
        self.passes += gamma - 1
        drafted = to_host(tokens)[0]  # before the next replay overwrites the graph's outputs
        # (the scatter below copies the rows out of the graph's buffer too)
        dists = rows if sampled else probabilities(rows, 1.0) if need_dists else None
        if dists is None:
            return drafted, None
        return drafted, dists.new_zeros(gamma, self.vocab_size).index_copy_(1, self.draft_to_target, dists)

    def _tail(self, tail: list[int], device) -> torch.Tensor:
        """Committed tokens past the target-fed rows (settled by a slim verifier) fed like drafts, on the
        drafter's own h, their rows written in the buffer after the cache's: the h after them. They stay there
        between drafts, so consecutive slim-settled blocks feed each token once; the target's features replace
        them when they arrive (`extend` writes over them)."""
        fed, h = self.tail
        if tail[:len(fed)] != fed:  # not an extension of what was fed (cannot happen between catch-ups)
            fed, h = [], self.last_h
        if len(tail) > len(fed):  # one copy of the new tokens and their positions, then one pass each
            start = self.cache.length + len(fed)
            embeds = self.embed(to_device(tail[len(fed):], device))
            positions = torch.arange(start, self.cache.length + len(tail), device=device)
            for i in range(len(embeds)):
                h, _, _ = self.model.step(embeds[i:i + 1], h, positions[i:i + 1], self.cache.buffer_k,
                                          self.cache.buffer_v, write_at=start + i)
                self.passes += 1
        self.tail = (list(tail), h)
        return h

    def record(self, stats) -> None:
        stats.add_extra("drafter_forwards", self.passes)
        self.passes = 0


def draft_chain(h, uniforms, keys, values, past, scratch_at: int, drafter, embed, draft_to_target, gamma: int,
                temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """γ drafts after the buffer's first `past` rows (a device scalar) from their last h [1, H], at fixed shapes
    and with no host read (so a CUDA graph can hold it): each the argmax (T = 0) or an inverse-CDF draw with its
    uniform (T > 0) over the draft vocabulary (`ChainDraws`), fed back with its own h; draft i's row is written
    at scratch_at + i and sees the past and the drafts before it (the buffer's rows between `past` and
    `scratch_at` masked out). Returns the drafts' target ids [γ] and their rows [γ, V_draft]: the logits at
    T = 0, the distributions drawn from at T > 0."""
    device = h.device
    positions = past + torch.arange(gamma, device=device)
    passes = gamma - 1  # pass i's row (draft i fed back) sees the past, the drafts' rows before it and itself
    visible = torch.cat([(torch.arange(scratch_at, device=device) < past).expand(passes, scratch_at),
                         torch.ones(passes, passes, dtype=torch.bool, device=device).tril()], dim=1)
    draws, tokens = ChainDraws(None, gamma, temperature, uniforms), []
    for i in range(gamma):
        tokens.append(draft_to_target.index_select(0, draws.pick(drafter.logits(h)[0]).view(1)))
        if i < passes:
            h, _, _ = drafter.step(embed(tokens[-1]), h, positions[i:i + 1], keys, values,
                                   visible[i:i + 1, :scratch_at + i + 1], write_at=scratch_at + i)
    return torch.cat(tokens), torch.stack(draws.rows)
