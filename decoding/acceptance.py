"""Lossless acceptance of a verified token tree.

Both rules walk the tree from the root and return the accepted node path plus one bonus token
sampled from the target, so every step commits at least one token.

- `accept_greedy` (T = 0): follow the child whose token is the target's argmax.
- `accept_sampling` (T > 0): at each node, try the children in order with recursive rejection
  sampling. A deterministic child x (no draft distribution) is accepted with probability p(x);
  on rejection p(x) is zeroed and p renormalised (SpecInfer / Lookahead rule for one-hot drafts).
  A child sampled from a draft distribution q is accepted with min(1, p(x)/q(x)); on rejection
  p <- norm(max(p - q, 0)) and, since siblings are drawn from q without replacement, q(x) is
  zeroed and q renormalised (Leviathan et al. for a chain, recursive rejection sampling for
  several siblings). If no child is accepted the bonus token is drawn from the residual p.
  In both cases the emitted token is distributed exactly as the target's p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.tree import TokenTree


@dataclass
class Verdict:
    path: list[int]  # accepted node indices, starting with the root (0)
    bonus: int  # token sampled from the target at the last accepted node

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens (the root is not a draft)."""
        return len(self.path) - 1


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def accept_greedy(tree: TokenTree, logits: torch.Tensor) -> Verdict:
    best = logits[: len(tree)].argmax(-1).tolist()  # one host sync for the whole tree
    tokens, children = tree.tokens, tree.children
    node, path = 0, [0]
    while True:
        nxt = next((c for c in children[node] if tokens[c] == best[node]), None)
        if nxt is None:
            return Verdict(path, best[node])
        node = nxt
        path.append(node)


def accept_sampling(
    tree: TokenTree, logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> Verdict:
    return accept_against(tree, lambda node: target_probs(logits[node], temperature), generator)


def accept_against(tree: TokenTree, target_dist, generator: torch.Generator | None) -> Verdict:
    """Recursive rejection sampling against an arbitrary target distribution per node:
    `target_dist(node)` is the distribution the token after `node` must follow (the target model's
    softmax for lossless SD; a deferral rule's mixture π for speculative cascades). Each emitted
    token is distributed exactly as that target."""
    children = tree.children
    node, path = 0, [0]
    while True:
        p = target_dist(node)
        accepted, p = _try_children(tree, children[node], p, generator)
        if accepted is None:
            return Verdict(path, sample(p, generator))
        node = accepted
        path.append(node)


def _try_children(tree, kids, p, generator):
    q_group = None  # working copy of the shared draft distribution of sampled siblings
    for c in kids:
        x = tree.tokens[c]
        q_src = tree.draft_probs[c]
        u = float(torch.rand((), generator=generator))
        if q_src is None:  # deterministic proposal: one-hot q
            if u < float(p[x]):
                return c, p
            p = _renormalise(p.index_fill(0, torch.tensor([x], device=p.device), 0.0), p)
        else:
            if q_group is None:
                q_group = q_src.float().clone()
            qx = float(q_group[x])
            if qx > 0 and u < min(1.0, float(p[x]) / qx):
                return c, p
            p = _renormalise((p - q_group).clamp_min(0.0), p)
            q_group[x] = 0.0
            q_group = _renormalise(q_group, q_group)
    return None, p


def _renormalise(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = weights.sum()
    # A zero residual only happens when the rejected proposal had acceptance probability 1 up to
    # float error; keep the previous distribution instead of dividing by zero.
    return weights / total if total > 1e-12 else fallback
