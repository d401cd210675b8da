"""VIA-SD: verification via intra-model routing (Xian et al., ICML 2026; no public code; this is
the reconstruction in research/viasd.md §1, marked [R] where a choice is ours).

A slim verifier q' = q_z (the target with the layers of a routing mask z skipped, found offline by
the DIMR search; shared weights, no extra memory) sits between the drafter p and the target q.
Per drafted block x_1..x_γ, one slim pass scores all drafts, then each position in order goes to
the cheapest zone that can settle it. `zones=note` (default), the note's three-zone step:
  A. q' accepts x by the speculative test against q' (x == argmax q' at T = 0; u < min(1, q'(x)/p(x)))
     -> x is kept ("direct");
  B. else, if q' is confident (max q' >= τ_slim), q' regenerates the token (argmax q', or a draw from
     norm(max(0, q' - p))) and the block ends ("slim"); so wherever zone B is open the token is
     distributed exactly as q' (speculative sampling against q');
  C. else the full verifier q verifies x_i..x_γ in one forward (the engine's SD step); at T > 0 x_i is
     verified against norm(max(0, p - q')), the distribution it has given that q' rejected it, so the
     token zone C emits is q's draw [R: the note's pseudo-code passes p].
`zones=gated` [R], the reconstruction used before 2026-12-05 (its tables say so): zone A's test runs only
where q' is confident, and a tier before it keeps x without a test when p and q' agree with high
confidence (both pick x and min(p(x), q'(x)) >= τ_agree; or TV / KL(p || q') <= τ_agree). At T > 0 that
tier keeps x with probability 1 where the test would keep it with q'(x)/p(x), so its tokens are not
distributed as q'; with thresholds above 1 every token escalates and it reproduces `sd` token for token.
If every draft is settled without q, the bonus token comes from q' at position γ+1 [R].
Tokens settled without q have no full-model KV: the next full pass re-runs them first (the engine's
pending-token catch-up), so the target's cache always equals a fresh prefill.
Lossy (zones A-B do not sample from q).
Ablations: `middle=random` (random mask with the same skip count), `middle=model` (an independent
smaller model as the middle tier)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from decoding.drafting.drafter import Drafter, DrafterConfig, build_drafter
from decoding.engine.argmax import row_argmax
from decoding.engine.loop import (DecodeState, Method, Proposal, commit, committed_drafts, forward_proposal,
                                  verify)
from decoding.drafting.routing import kept_layers, load_mask, random_mask
from decoding.engine.sampling import probabilities
from decoding.engine.transfer import to_device, to_host
from decoding.engine.target import TargetModel
from decoding.engine.tree import TokenTree
from pipeline.errors import ConfigError, check_choice, check_range
from pipeline.models import ModelConfig


@dataclass
class VIASDConfig:
    _target_: str = "decoding.methods.via_sd.VIASD"
    name: str = "via_sd"
    mask: str = "smollm2-135m-dimr"  # routing mask z by name (decoding/drafting/routing.py); conf/method/via_sd.yaml: the target's <model>-dimr
    middle: str = "slim"  # slim (the paper's routed q_z) | random (ablation: random z, same skip count) | model
    random_seed: int = 0  # middle=random: seed of the random mask
    middle_model: Optional[ModelConfig] = None  # middle=model: an independent smaller model (ablation)
    zones: str = "note"  # note: research/viasd.md's three-zone step | gated: the earlier reconstruction [R]
    # zones=gated's untested tier [R]: confidence (min(p(x), q'(x)) >= τ_agree) | tv | kl (distance <= τ_agree);
    # unset: confidence and 0.7 (the paper's three-zone thresholds are not public); zones=note has no such tier
    agreement: Optional[str] = None
    agree_threshold: Optional[float] = None
    slim_threshold: float = 0.5  # τ_slim: q' settles the token when max q' >= τ_slim [R]

    def __post_init__(self) -> None:
        check_choice("method.middle", self.middle, ("slim", "random", "model"))
        check_choice("method.zones", self.zones, ("note", "gated"))
        if self.zones == "note" and (self.agreement, self.agree_threshold) != (None, None):
            raise ConfigError("method.agreement and method.agree_threshold set zones=gated's untested tier; "
                              "with method.zones=note every kept draft is tested against q' (set method.zones=gated)")
        if self.zones == "gated":
            self.agreement = "confidence" if self.agreement is None else self.agreement
            self.agree_threshold = 0.7 if self.agree_threshold is None else self.agree_threshold
            check_choice("method.agreement", self.agreement, ("confidence", "tv", "kl"))
            check_range("method.agree_threshold", self.agree_threshold, 0.0)
        check_range("method.slim_threshold", self.slim_threshold, 0.0)
        if self.middle == "model" and self.middle_model is None:
            raise ConfigError("method.middle=model needs method.middle_model (a model config)")


DIRECT, SLIM, FULL = "direct", "slim", "full"


class VIASD(Method):
    name = "via_sd"
    lossless = False
    uses_drafter = True

    def setup(self, target: TargetModel) -> None:
        cfg = self.config
        drafter_cfg = self.drafter_config or DrafterConfig()
        if drafter_cfg.gamma_policy != "fixed":  # its steps end at three tiers, not one verify: no (α, c) model
            raise ConfigError(f"drafter.gamma_policy={drafter_cfg.gamma_policy} is for sd and spec_cascade; "
                              f"method=via_sd drafts drafter.gamma={drafter_cfg.gamma} tokens a step: set drafter.gamma_policy=fixed")
        # drafter=eagle3 reads target features; tokens tiers 1-2 settle get theirs at the next full pass
        # (the pending catch-up) and are fed on the drafter's own states until then (eagle3_chain.py)
        self.drafter = build_drafter(drafter_cfg, target)
        self.gamma = drafter_cfg.gamma
        self.middle_model: Drafter | None = None
        if cfg.middle == "model":
            self.middle_model = build_drafter(DrafterConfig(kind="model", model=cfg.middle_model), target)
            return
        skip = load_mask(cfg.mask, target.num_layers)
        if cfg.middle == "random":
            skip = random_mask(target.num_layers, len(skip), cfg.random_seed)
        self.slim_layers = kept_layers(skip, target.num_layers)

    def begin(self, state: DecodeState) -> None:
        self.drafter.begin(state.sequence, len(state.sequence) + state.max_new_tokens)
        if self.middle_model is not None:
            self.middle_model.begin(state.sequence)

    def prefill_hidden_layers(self) -> tuple[int, ...]:
        return self.drafter.hidden_layers  # a feature drafter (EAGLE-3) reads target layers; others none

    def on_prefill(self, state: DecodeState, output) -> None:
        self.drafter.on_prefill(output, state.prompt_ids)

    def middle_logits(self, state: DecodeState, chain: TokenTree) -> torch.Tensor:
        """q' at the root and after each draft: one read-only slim pass over the target's cache."""
        if self.middle_model is not None:
            return self.middle_model.score(state.sequence, chain.tokens[1:])
        return forward_proposal(state.target, Proposal(chain), state.pending, active_layers=self.slim_layers).logits

    def plan(self, state: DecodeState, drafts: list[int], p: torch.Tensor, s: torch.Tensor) -> dict[str, list]:
        """Every position's zone at once on the device, read back with one host copy: p [γ, V] drafter,
        s [γ + 1, V] slim verifier q'. Per position i (draft x): `keep` (x is kept without q; `direct`: its
        counter is settled_direct, zone A's in zones=note, the untested tier's in zones=gated), else
        `regenerate` (q' is confident: its token `regen` ends the block), else the full verifier takes over;
        `bonus`: q''s token after the last draft. The test against q' is x == argmax q' at T = 0 and u < min(1, q'(x)/p(x))."""
        cfg, sampler = self.config, state.sampler.stream("via_sd").for_device(s.device)
        p = p.to(s.device)
        gamma = len(drafts)
        x = to_device(drafts, s.device)[:, None]
        s_drafts = s[:gamma]
        px, sx = p.gather(1, x)[:, 0], s_drafts.gather(1, x)[:, 0]
        s_top = row_argmax(s)
        picks_x = s_top[:gamma] == x[:, 0]
        confident = s_drafts.amax(-1) >= cfg.slim_threshold  # amax: ~9x cheaper than max().values on a CPU
        if state.greedy:
            passes, regen, bonus = picks_x, s_top[:gamma], s_top[gamma:]
        else:
            passes = sampler.uniform(gamma) * px.clamp_min(1e-30) < sx  # u < min(1, q'(x) / p(x))
            residual = (s_drafts - p).clamp_min(0)
            has_residual = residual.sum(-1) > 1e-12
            # the regenerated tokens and the bonus in one call (on a CPU the same uniforms, in order, as two)
            drawn = sampler.categorical(torch.cat([torch.where(has_residual[:, None], residual, s_drafts), s[gamma:]]))
            regen = torch.where(has_residual, drawn[:gamma], s_top[:gamma])
            bonus = drawn[gamma:]
        if cfg.zones == "note":
            keep, regenerate = passes, ~passes & confident
            direct = keep
        else:
            direct = picks_x & self._agree(p, s_drafts, px, sx)
            keep, regenerate = direct | (confident & passes), ~direct & confident & ~passes
        names = ("keep", "direct", "regenerate", "regen", "bonus")
        return dict(zip(names, to_host(keep, direct, regenerate, regen, bonus)))

    def _agree(self, p, s_drafts, px, sx) -> torch.Tensor:
        """zones=gated's untested tier: p and q' agree with high confidence."""
        cfg = self.config
        if cfg.agreement == "confidence":
            return torch.minimum(px, sx) >= cfg.agree_threshold
        if cfg.agreement == "tv":
            return (p - s_drafts).clamp_min(0).sum(-1) <= cfg.agree_threshold
        return (p * (p.clamp_min(1e-12).log() - s_drafts.clamp_min(1e-12).log())).sum(-1) <= cfg.agree_threshold

    def step(self, state: DecodeState) -> None:
        t0 = time.perf_counter()
        drafts, p = self.drafter.draft(state.sequence, self.gamma, state.temperature, state.sampler)
        t1 = time.perf_counter()
        if not drafts:  # nothing drafted (a feature drafter before its first row): the full target's own step
            return self._escalate(state, drafts, p, 0, [], [], t0, t1)
        chain = TokenTree.chain(state.root, drafts, list(p))
        s = probabilities(self.middle_logits(state, chain), state.temperature)
        state.stats.add_extra("slim_forwards" if self.middle_model is None else "middle_forwards", 1)
        plan = self.plan(state, drafts, p, s)
        settled: list[int] = []  # drafts kept without the full model
        tiers: list[str] = []  # the counter each of them goes to (DIRECT or SLIM)
        for i, x in enumerate(drafts):
            if plan["keep"][i]:
                settled.append(x)
                tiers.append(DIRECT if plan["direct"][i] else SLIM)
            elif plan["regenerate"][i]:  # q' rejects x and is confident: its own token ends the block
                return self._finish(state, len(drafts), settled, tiers, plan["regen"][i], t0, t1)
            else:
                if self.config.zones == "note" and not state.greedy:
                    p = self.zone_c_rows(p, s, i)
                return self._escalate(state, drafts, p, i, settled, tiers, t0, t1)
        return self._finish(state, len(drafts), settled, tiers, plan["bonus"][0], t0, t1)

    @staticmethod
    def zone_c_rows(p: torch.Tensor, s: torch.Tensor, i: int) -> torch.Tensor:
        """The drafts' distributions for the full verifier from position i (zones=note, T > 0). x_i reached
        zone C because it failed the test against q' (zone B's gate does not depend on x), so it is
        distributed as norm(max(0, p_i - q'_i)), not p_i; verifying it against that row makes the token
        zone C emits exactly q's draw [R: the note passes p_i]. Later drafts were never tested: p."""
        row = (p[i] - s[i].to(p.device)).clamp_min(0)
        total = row.sum()
        # all zero only where p = q' (then no draft fails the test, unless p(x_i) = 0): p itself, no host read
        row = torch.where(total > 1e-12, row / total.clamp_min(1e-30), p[i])
        return torch.cat([p[:i], row[None], p[i + 1:]])

    def finish(self, state: DecodeState) -> None:
        self.drafter.record(state.stats)  # a middle model's passes are `middle_forwards`, one per block

    @staticmethod
    def _count_tiers(state, tiers: list[str], n_committed: int) -> None:
        for tier in tiers[:n_committed]:
            state.stats.add_extra(f"settled_{tier}", 1)

    def _finish(self, state, drafted, settled, tiers, last, t0, t1) -> None:
        """The block ends without the full model: the drafts kept, then q''s own token (regenerated or bonus)."""
        committed = commit(state, settled + [last])
        self._count_tiers(state, tiers + [SLIM], len(committed))
        accepted = committed_drafts(len(settled), committed)
        state.stats.record_step(num_draft_tokens=drafted, num_accepted=accepted,
                                accepted_depths=list(range(1, accepted + 1)))
        state.stats.add_time(draft=t1 - t0, verify=time.perf_counter() - t1)

    def _escalate(self, state, drafts, p, i, settled, tiers, t0, t1) -> None:
        """Zone C from position i: commit what zones A-B settled, then the engine's SD step verifies
        x_i..x_γ with the full target (re-running the pending tokens first)."""
        committed = commit(state, settled)
        self._count_tiers(state, tiers, len(committed))
        accepted = committed_drafts(len(committed), committed)  # a stop or the limit among them: no bonus follows
        if not state.done:
            proposal = Proposal(TokenTree.chain(state.root, drafts[i:], None if state.greedy else list(p[i:])),
                                hidden_layers=self.drafter.hidden_layers)
            result = verify(state, proposal, record=False)
            self.drafter.observe(result, state.sequence)
            accepted = committed_drafts(len(committed) + result.verdict.num_accepted, committed + result.committed)
            state.stats.add_extra("settled_full", len(result.committed))
        state.stats.add_extra("escalations", 1)
        # an empty draft (a feature drafter before its first row) drafted nothing: no phantom rejections
        state.stats.record_step(num_draft_tokens=len(drafts), num_accepted=accepted,
                                accepted_depths=list(range(1, accepted + 1)))
        state.stats.add_time(draft=t1 - t0, verify=time.perf_counter() - t1)


CONFIG = VIASDConfig
