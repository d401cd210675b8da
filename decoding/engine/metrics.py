"""Per-generation counters with one schema for every method (names follow vLLM's spec-decode
metrics where they exist: num_drafts, num_draft_tokens, num_accepted_tokens, acceptance per
position)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    new_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    target_forwards: int = 0  # decode-time passes through the target (prefill excluded), full or partial
    target_forward_cost: float = 0.0  # the same passes in full-forward units: a pass over k of L layers counts k/L
    num_steps: int = 0  # verification steps
    num_drafts: int = 0  # steps that verified at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)  # by draft depth 1, 2, ...
    extra: dict = field(default_factory=dict)  # method-specific counters (tier shares, redundancy...)

    def record_step(self, num_draft_tokens: int, num_accepted: int, accepted_depths: list[int]) -> None:
        self.num_steps += 1
        self.num_drafts += int(num_draft_tokens > 0)
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for d in accepted_depths:
            while len(self.num_accepted_tokens_per_pos) < d:
                self.num_accepted_tokens_per_pos.append(0)
            self.num_accepted_tokens_per_pos[d - 1] += 1

    def add_time(self, draft: float = 0.0, verify: float = 0.0, other: float = 0.0) -> None:
        self.draft_s += draft
        self.verify_s += verify
        self.other_s += other

    def add_extra(self, key: str, value: float) -> None:
        self.extra[key] = self.extra.get(key, 0) + value

    @property
    def tau(self) -> float:
        """Mean accepted length: accepted draft tokens + 1 (the bonus) per verification step."""
        return (self.num_accepted_tokens + self.num_steps) / self.num_steps if self.num_steps else 0.0

    @property
    def decoding_efficiency(self) -> float:
        """New tokens per full-target forward's worth of target compute (cost-weighted: a slim pass
        over k of L layers counts k/L, so VIA-SD's slim verifier cannot look free). A self-speculative
        drafter's passes are counted apart, in extra["drafter_forward_cost"]."""
        return self.new_tokens / self.target_forward_cost if self.target_forward_cost else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tau=self.tau, decoding_efficiency=self.decoding_efficiency, tokens_per_s=self.tokens_per_s)
        return d

    def merge(self, other: "GenerationStats") -> None:
        """Add another generation's counters (e.g. the second MT-Bench turn) into this one."""
        for name in ("new_tokens", "wall_s", "prefill_s", "draft_s", "verify_s", "other_s", "target_forwards",
                     "target_forward_cost", "num_steps", "num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for i, v in enumerate(other.num_accepted_tokens_per_pos):
            if i < len(self.num_accepted_tokens_per_pos):
                self.num_accepted_tokens_per_pos[i] += v
            else:
                self.num_accepted_tokens_per_pos.append(v)
        for k, v in other.extra.items():
            self.add_extra(k, v)
