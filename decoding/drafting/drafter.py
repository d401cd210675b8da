"""Draft models for drafter-verifier methods (sd, spec_cascade, via_sd): an autoregressive model
with its own KV cache that follows the committed sequence.

Kinds (`drafter=` config group):
- `early_exit`: the target's first k decoder layers + its final norm and lm_head (no weight copy),
  optionally with a trained exit head in front of the norm (`head`: a tuned-lens translator,
  decoding/drafting/exit_head.py; `drafter=exit_head`);
- `slim`: the target with the layers of a routing mask skipped (self-speculative layer skipping);
- `model`: a separate small model that shares the target's tokenizer (qwen3-0.6b for qwen3-8b);
- `eagle3`: an EAGLE-3 checkpoint drafting a chain from the target's own features
  (decoding/drafting/eagle3_chain.py; sd and spec_cascade).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from decoding.drafting.draft_length import DraftLength
from decoding.engine.sampling import ChainDraws, Sampler
from decoding.engine.transfer import to_device, to_host
from decoding.drafting.routing import kept_layers, load_mask
from decoding.engine.target import TargetModel
from pipeline.errors import ConfigError, check_choice, check_range
from pipeline.models import ModelConfig

log = logging.getLogger(__name__)


@dataclass
class DrafterConfig:
    name: str = "early_exit"
    kind: str = "early_exit"  # early_exit | slim | model | eagle3
    gamma: int = 5  # draft length γ (Narasimhan et al. use 5; Leviathan et al. sweep 1-10)
    # fixed: γ = gamma every step | optimal: Leviathan et al.'s best γ for the α and drafter cost c this generation
    # measures, chosen again each step (sd, spec_cascade; decoding/drafting/draft_length.py)
    gamma_policy: str = "fixed"
    max_gamma: int = 8  # gamma_policy=optimal: γ in 1..max_gamma
    # gamma_policy=optimal: c, a drafted token's cost in verify steps; null = measured as the generation runs
    # (then γ follows the clock, and so do a T > 0 run's draws: set it for seed-exact runs)
    draft_cost: Optional[float] = None
    exit_layer: int = 6  # early_exit: run decoder layers [0, exit_layer) (LayerSkip's E)
    head: Optional[str] = None  # early_exit: a trained exit-head folder (python -m pipeline.train drafter=exit_head)
    mask: Optional[str] = None  # slim: routing-mask name (decoding/drafting/routing.py) or a path, e.g. the DIMR result
    model: Optional[ModelConfig] = None  # model: the separate draft model
    checkpoint: Optional[str] = None  # eagle3: folder or HF hub id of an EAGLE-3 checkpoint
    cuda_graph: bool = True  # eagle3: on CUDA, a draft's chain replays from one CUDA graph (eagle3_chain.py)

    def __post_init__(self) -> None:
        check_choice("drafter.kind", self.kind, ("early_exit", "slim", "model", "eagle3"))
        check_range("drafter.gamma", self.gamma, 1)
        check_choice("drafter.gamma_policy", self.gamma_policy, ("fixed", "optimal"))
        check_range("drafter.max_gamma", self.max_gamma, 1)
        if self.draft_cost is not None:
            check_range("drafter.draft_cost", self.draft_cost, 0.0)
        check_range("drafter.exit_layer", self.exit_layer, 1)
        if self.kind == "slim" and not self.mask:
            raise ConfigError("drafter.kind=slim needs drafter.mask (a routing-mask name or a path)")
        if self.head and self.kind != "early_exit":
            raise ConfigError(f"drafter.head is for drafter.kind=early_exit, not {self.kind}")
        if self.kind == "model" and self.model is None:
            raise ConfigError("drafter.kind=model needs drafter.model (a model config)")
        if self.kind == "eagle3" and not self.checkpoint:
            raise ConfigError("drafter=eagle3: no EAGLE-3 checkpoint is known for this model; set "
                              "drafter.checkpoint=<folder or HF hub id> (train one: python -m pipeline.train drafter=eagle3)")


def build_draft_length(cfg: DrafterConfig) -> DraftLength:
    return DraftLength(cfg.gamma, cfg.gamma_policy, cfg.max_gamma, cfg.draft_cost)


class Drafter:
    """Drafts γ tokens after the committed sequence, one forward per token. It remembers which
    tokens its cache holds, so after verification it keeps the agreeing prefix and re-runs only
    the tokens it has not seen (bonus / corrected tokens) in front of the next draft."""

    hidden_layers: tuple[int, ...] = ()  # target layers a feature drafter reads (EAGLE-3); none here

    def __init__(self, lm: TargetModel, shares_target: bool = False, extra_vocab: int = 0):
        self.lm = lm
        self.shares_target = shares_target  # made of the target's own layers (no weights of its own)
        self.cached: list[int] = []
        # rows the target's vocabulary has beyond the drafter's (same tokenizer, padded embeddings: e.g.
        # Qwen2.5-0.5B's 151936 for 7B's 152064): the drafter's logits get them at -inf, so q and p align.
        # The target could sample a padding row at T > 0 only if its training gave one mass, which trained
        # models do not; the drafter's embedding would then refuse that id
        self.extra_vocab = extra_vocab

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.extra_vocab:
            return logits
        return F.pad(logits, (0, self.extra_vocab), value=float("-inf"))

    def begin(self, sequence: list[int], rows_expected: int = 0) -> None:
        """`rows_expected`: the prompt and the answer, to size the drafter's KV buffer (TargetModel.prefill)."""
        self.lm.prefill(sequence[:-1], rows_expected=rows_expected)
        self.cached = list(sequence[:-1])

    def on_prefill(self, output, prompt_ids: list[int]) -> None:
        """The target's prefill output (a feature drafter reads its taps); this one follows tokens only."""

    def observe(self, result, sequence: list[int]) -> None:
        """A verified step and the committed sequence after it (a feature drafter reads the accepted rows' taps)."""

    def _catch_up(self, sequence: list[int]) -> list[int]:
        """Drop cached tokens that left the sequence; return the tokens still to feed (root incl.)."""
        m = 0
        limit = min(len(self.cached), len(sequence) - 1)
        while m < limit and self.cached[m] == sequence[m]:
            m += 1
        self.lm.truncate(m)
        del self.cached[m:]
        return sequence[m:]

    def draft(self, sequence: list[int], gamma: int, temperature: float,
              sampler: Sampler, need_dists: bool = True) -> tuple[list[int], torch.Tensor | None]:
        """γ draft tokens and the [γ, V] distributions they came from (softmax at T; at T=0 the
        tokens are the argmax and the distributions are taken at T=1, for rules that need them;
        `need_dists=False` at T=0 skips them and returns None). Each drafted token is fed back as a
        device tensor: one host copy per draft, not per token; at T > 0 the draft's uniforms are
        drawn at once, at T = 0 its distributions are one softmax after the loop."""
        fed = self._catch_up(sequence)
        device = self.lm.device
        sampler = sampler.for_device(self.lm.output_device)
        feed, depths = to_device(fed, device), torch.arange(len(fed), device=device)
        next_depth = torch.zeros(1, dtype=torch.long, device=device)  # a fed-back draft: one row after the cache
        draws, tokens = ChainDraws(sampler, gamma, temperature), []
        for _ in range(gamma):
            tokens.append(draws.pick(self._logits(self.lm.forward(feed, depths, None, last_only=True).logits[-1])))
            feed, depths = tokens[-1].view(1).to(device), next_depth
        drafted = to_host(torch.stack(tokens))[0]
        self.cached.extend(fed + drafted[:-1])  # the last draft is not fed yet
        return drafted, draws.distributions(need_dists)

    def record(self, stats) -> None:
        """The drafter's own passes of this generation; in target-forward units when its layers
        are the target's (early exit, slim), where k of L layers cost k/L of a target forward."""
        stats.add_extra("drafter_forwards", self.lm.num_forwards)
        if self.shares_target:
            stats.add_extra("drafter_forward_cost", self.lm.forward_cost)

    def score(self, sequence: list[int], drafts: list[int]) -> torch.Tensor:
        """Logits [len(drafts) + 1, V] of this model at the root and after each draft (used when a
        separate model is a middle verifier); the drafts' KV is dropped again."""
        feed = self._catch_up(sequence)
        n_new = len(feed) - 1
        rows = feed + drafts  # host lists: one packed host->device copy (two CPU tensors were two copies)
        out = self.lm.forward(rows, list(range(len(rows))), None)
        self.cached.extend(feed)
        self.lm.truncate(len(self.cached))
        return self._logits(out.logits[n_new:])


def build_drafter(cfg: DrafterConfig, target: TargetModel) -> Drafter:
    if cfg.kind == "eagle3":
        from decoding.drafting.eagle3_chain import Eagle3ChainDrafter

        return Eagle3ChainDrafter(cfg.checkpoint, target, graphs=cfg.cuda_graph)
    if cfg.kind == "early_exit":
        if cfg.exit_layer >= target.num_layers:
            raise ConfigError(f"drafter.exit_layer={cfg.exit_layer} must be below the target's "
                              f"{target.num_layers} layers")
        head = None
        if cfg.head:
            from decoding.drafting.exit_head import load_exit_head

            head = load_exit_head(cfg.head, target, cfg.exit_layer)
        return Drafter(TargetModel(target.model, target.tokenizer, layers=range(cfg.exit_layer), exit_head=head,
                                   kv_buffer=target.kv_buffer), shares_target=True)
    if cfg.kind == "slim":
        skip = load_mask(cfg.mask, target.num_layers)
        return Drafter(TargetModel(target.model, target.tokenizer, layers=kept_layers(skip, target.num_layers),
                                   kv_buffer=target.kv_buffer), shares_target=True)
    from pipeline.models import load_model

    model, tokenizer = load_model(cfg.model)
    if target.tokenizer is not None and tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ConfigError(f"drafter model '{cfg.model.name}' does not share the target's tokenizer")
    extra = output_rows(target.model) - output_rows(model)
    if extra < 0:
        raise ConfigError(f"drafter model '{cfg.model.name}' has {output_rows(model)} output rows, more than the "
                          f"target's {output_rows(target.model)}: it could draft tokens the target has no row for")
    graphs = target.sibling_graphs(next(model.parameters()).device)
    try:
        return Drafter(TargetModel(model, tokenizer, kv_buffer=target.kv_buffer, graphs=graphs), extra_vocab=extra)
    except ConfigError as why:  # only a replayer can make it refuse: the target's graphs go on, the drafter's not
        if graphs is None:
            raise
        log.warning("drafter model '%s' runs without CUDA graphs: %s", cfg.model.name, why)
        return Drafter(TargetModel(model, tokenizer, kv_buffer=target.kv_buffer), extra_vocab=extra)


def output_rows(model) -> int:
    """The width of a model's logits (its lm_head's rows: config.vocab_size may differ from the tokenizer's)."""
    return model.get_output_embeddings().weight.shape[0]
