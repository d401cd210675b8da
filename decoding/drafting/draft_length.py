"""The draft length γ of a drafter-verifier step (sd, spec_cascade; EAGLE-3's chain as `method.chain_policy`): fixed
(`drafter.gamma`), or the γ that
Leviathan et al. (ICML 2023, section 3.5 "Choosing γ") show maximises the expected speedup, from this
generation's own measurements (`drafter.gamma_policy=optimal`).

Their model: a step runs γ drafter passes, each costing c target forwards, then one target forward, and each
draft is accepted independently with probability α. A step then yields (1 - α^(γ+1)) / (1 - α) tokens, so the
speedup over AR is (1 - α^(γ+1)) / ((1 - α)(γc + 1)), and they pick the γ that maximises it for a drafter-target
pair (their Figure 3). Here α and c are measured while the generation runs and γ is chosen again every step:
- α: accepted drafts / (accepted drafts + rejections) over the steps so far (the truncated-geometric estimate:
  a step whose drafts all pass has no rejection, so steps of different γ pool exactly);
- c: the drafter's seconds per drafted token over the verify's seconds per step, from the step clocks the engine
  keeps (`GenerationStats.draft_s`, `verify_s`), or `drafter.draft_cost` where given.
Before `WARMUP_STEPS` steps, γ is `drafter.gamma`. Our departures, for a drafter on a CPU or a small GPU model:
the paper's c is a ratio measured once; ours spreads over the drafts the drafter's catch-up on the tokens it has
not seen (EAGLE-3's extend pass, a separate model's bonus token) and counts the acceptance's work in the verify,
and the verify is taken to cost the same for every γ (a GPU's flat curve; on a CPU in bf16 it stays flat up to
about 12 rows, docs/methods/eagle3.md). Any γ keeps the method lossless; but a measured c makes γ depend on the
clock, so at T > 0 a run's draws (not their distribution) change from run to run: set `drafter.draft_cost` for
seed-exact runs.
"""

from __future__ import annotations

WARMUP_STEPS = 4  # steps at drafter.gamma before the estimates drive γ (one step's α says little)
ALPHA_CAP = 0.99  # a run of full acceptances would make α = 1, where the formula has no finite optimum


def expected_speedup(gamma: int, alpha: float, cost: float) -> float:
    """Leviathan et al.'s expected walltime improvement factor (their Theorem 3.8)."""
    tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * cost + 1)


def best_gamma(alpha: float, cost: float, max_gamma: int) -> int:
    """The γ in 1..max_gamma of the highest expected speedup (the shortest of equals)."""
    alpha = min(max(alpha, 0.0), ALPHA_CAP)
    return max(range(1, max_gamma + 1), key=lambda g: (expected_speedup(g, alpha, cost), -g))


class DraftLength:
    """γ for each step of one generation: `next(stats)` before the step's draft, reading what the engine's
    `GenerationStats` recorded of the steps before it."""

    def __init__(self, gamma: int, policy: str = "fixed", max_gamma: int = 8, draft_cost: float | None = None):
        self.gamma, self.policy, self.max_gamma, self.draft_cost = gamma, policy, max_gamma, draft_cost
        self.reset()

    def reset(self) -> None:
        """A new generation: its own estimates."""
        self.accepted = self.rejections = self.steps = 0
        self._seen = (0, 0, 0)  # stats' (steps, drafted, accepted) at the last call
        self.alpha: float | None = None
        self.cost: float | None = None

    def next(self, stats) -> int:
        if self.policy == "fixed":
            return self.gamma
        self._update(stats)
        if self.steps < WARMUP_STEPS or not stats.num_draft_tokens or not stats.verify_s:
            return self.gamma
        self.alpha = self.accepted / (self.accepted + self.rejections) if self.rejections else ALPHA_CAP
        self.cost = self.draft_cost if self.draft_cost is not None else \
            (stats.draft_s / stats.num_draft_tokens) / (stats.verify_s / stats.num_steps)
        return best_gamma(self.alpha, self.cost, self.max_gamma)

    def _update(self, stats) -> None:
        """Take in the step recorded since the last call (one: a method drafts once per step)."""
        steps, drafted, accepted = stats.num_steps, stats.num_draft_tokens, stats.num_accepted_tokens
        if steps > self._seen[0]:
            new_drafts, new_accepted = drafted - self._seen[1], accepted - self._seen[2]
            self.accepted += new_accepted
            self.rejections += int(new_accepted < new_drafts)
            self.steps += 1
        self._seen = (steps, drafted, accepted)

    def record(self, stats) -> None:
        """The counts α was estimated from (`summary.json` extras: α over the run = draft_accepted /
        (draft_accepted + draft_rejections)); the mean γ is num_draft_tokens / num_drafts. The generation's last
        step is left out, as in the estimates: a stop token or the length limit may cut its accepted drafts."""
        if self.policy != "fixed":
            stats.add_extra("draft_accepted", self.accepted)
            stats.add_extra("draft_rejections", self.rejections)
