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
from decoding.engine.sampling import ChainDraws, Sampler
from decoding.engine.transfer import to_device, to_host
from pipeline.errors import ConfigError


class Eagle3ChainDrafter:
    shares_target = False

    def __init__(self, location: str, target):
        self.model = load_eagle3(location, device=target.device, dtype=target.dtype)
        spec, cfg = self.model.spec, target.config
        self.hidden_layers = tuple(spec.layer_ids(cfg.num_hidden_layers))
        self.embed = fitted_embeddings(self.model, self.hidden_layers, target, f"drafter=eagle3: {location}")
        self.target = target
        self.vocab_size = cfg.vocab_size
        self.draft_to_target = self.model.to_target_ids(torch.arange(spec.draft_vocab_size, device=target.device))
        self.passes = 0

    def begin(self, sequence: list[int], rows_expected: int = 0) -> None:  # no KV buffer: rows_expected unused
        self.cache = self.model.new_cache()
        self.last_h = None  # h of the newest target-fed row: it drafts the token after the cache's last input
        self.scratch = ([], None, None, None)  # (tail tokens fed on own states, their K/V after the cache's, h)

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
        if len(features):
            self.last_h = self.model.extend(self.cache, features, self.embed(to_device(next_tokens, device)))[-1:]
            self.passes += 1
            self.pending = (features[:0], [])
            self.scratch = ([], self.cache.keys, self.cache.values, self.last_h)
        if self.last_h is None:  # a one-token prompt: nothing to draft from yet
            return [], torch.empty(0, self.vocab_size, device=device)
        sampler = sampler.for_device(device)
        h, past_k, past_v = self._tail(sequence[self.cache.length + 1:], device)
        # draws over the draft vocabulary (as Drafter.draft's, ChainDraws), scattered to the target's once
        draws, tokens = ChainDraws(sampler, gamma, temperature), []
        positions = torch.arange(past_k.shape[1], past_k.shape[1] + gamma, device=device)  # the drafts' rows
        for i in range(gamma):
            picked = draws.pick(self.model.logits(h)[0])
            tokens.append(self.draft_to_target.index_select(0, picked.view(1)))
            if i + 1 < gamma:
                h, past_k, past_v = self.model.step(self.embed(tokens[-1]), h, positions[i:i + 1], past_k, past_v)
                self.passes += 1
        drafted = to_host(torch.cat(tokens))[0]
        dists = draws.distributions(need_dists)
        if dists is None:
            return drafted, None
        return drafted, dists.new_zeros(gamma, self.vocab_size).index_copy_(1, self.draft_to_target, dists)

    def _tail(self, tail: list[int], device):
        """Committed tokens past the target-fed rows (settled by a slim verifier) fed like drafts, on the
        drafter's own h: (h, K, V) after them. Their scratch rows are kept between drafts, so consecutive
        slim-settled blocks feed each token once; the target's features replace them when they arrive."""
        fed, past_k, past_v, h = self.scratch
        if tail[:len(fed)] != fed:  # not an extension of what was fed (cannot happen between catch-ups)
            fed, past_k, past_v, h = [], self.cache.keys, self.cache.values, self.last_h
        for tok in tail[len(fed):]:
            h, past_k, past_v = self.model.step(self.embed(to_device([tok], device)), h,
                                                torch.full((1,), past_k.shape[1], device=device), past_k, past_v)
            self.passes += 1
        self.scratch = (list(tail), past_k, past_v, h)
        return h, past_k, past_v

    def record(self, stats) -> None:
        stats.add_extra("drafter_forwards", self.passes)
        self.passes = 0
