"""Lossless acceptance of a verified token tree.

Both rules walk the tree from the root and return the accepted node path plus one bonus token
sampled from the target, so every step commits at least one token. Each needs one device->host
copy per step, whatever the tree's size.

- `accept_greedy` (T = 0): follow the child whose token is the target's argmax.
- `accept_sampling` / `accept_against` (T > 0), per node, with p the target distribution there:
  * deterministic children (no draft distribution: top-k trees, n-gram copies): draw y ~ p and
    follow the child whose token is y; if there is none, y is the bonus. This is the rule of the
    DDTree / DominoTree reference code, and the same distribution as trying the children in order
    with acceptance p(x), zeroing p(x) and renormalising on rejection (SpecInfer / Lookahead rule
    for one-hot drafts): child i is reached with probability p(x_i) either way;
  * one child x sampled from a draft q (a chain, Leviathan et al.): accept with min(1, p(x)/q(x)),
    else the bonus is drawn from norm(max(p - q, 0));
  * several siblings sampled from one q (without replacement): recursive rejection sampling, one
    child at a time (on rejection p <- norm(max(p - q, 0)), q(x) <- 0 and renormalised). No method
    drafts such trees by default; this path syncs per child.
  The draws of the first two cases are made at once on the device (y ~ p only at the nodes with
  deterministic children), and read with one host copy. Which uniforms a seed gives to which draw
  changed on 2026-12-05 (fewer draws), so T > 0 outputs of a seed differ from earlier commits; the
  distribution does not. (Later that day the two categorical draws became one call: the same
  uniforms on a CPU generator; on CUDA, another split of its stream.)
  In every case the emitted token is distributed exactly as the target's p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from decoding.engine.argmax import row_argmax
from decoding.engine.sampling import Sampler, probabilities
from decoding.engine.transfer import to_device, to_host
from decoding.engine.tree import TokenTree


@dataclass
class Verdict:
    path: list[int]  # accepted node indices, starting with the root (0)
    bonus: int  # token sampled from the target at the last accepted node
    # the host values of the tensors a rule was asked to read along (`also`), from the verdict's own copy
    reads: list[list] = field(default_factory=list)

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens (the root is not a draft)."""
        return len(self.path) - 1


def accept_greedy(tree: TokenTree, logits: torch.Tensor, also: Sequence[torch.Tensor] = ()) -> Verdict:
    """`also`: further device tensors to bring to the host in the same copy (`Verdict.reads`): what a method
    reads from the forward besides the verdict (loop.Proposal.reads), without a second sync."""
    best, *reads = to_host(row_argmax(logits[: len(tree)]), *also)  # one host sync for the whole tree
    tokens, children = tree.tokens, tree.children
    node, path = 0, [0]
    while True:
        nxt = next((c for c in children[node] if tokens[c] == best[node]), None)
        if nxt is None:
            return Verdict(path, best[node], reads)
        node = nxt
        path.append(node)


def accept_sampling(tree: TokenTree, logits: torch.Tensor, temperature: float, sampler: Sampler,
                    also: Sequence[torch.Tensor] = ()) -> Verdict:
    return accept_against(tree, probabilities(logits[: len(tree)], temperature), sampler, also)


DETERMINISTIC, SAMPLED_CHILD, SAMPLED_SIBLINGS = 0, 1, 2


def accept_against(tree: TokenTree, probs: torch.Tensor, sampler: Sampler,
                   also: Sequence[torch.Tensor] = ()) -> Verdict:
    """Lossless acceptance against per-node target distributions `probs` [n_tree, V] (rows need
    not be normalised): the target model's softmax for lossless decoding, a deferral rule's
    mixture π for speculative cascades. Each emitted token is distributed exactly as its row.
    `also`: as in `accept_greedy`, read in the same copy as the draws."""
    n, children, drafts = len(tree), tree.children, tree.draft_probs
    kinds = [_kind(children[i], drafts) for i in range(n)]
    chain_nodes = [i for i in range(n) if kinds[i] == SAMPLED_CHILD]
    if chain_nodes:
        # y ~ p only where a node's children are deterministic (a sampled chain: its leaf), not at every
        # node: a [n, V] float64 running sum is the largest piece of a step's host work on a CPU
        drawn_nodes = [i for i in range(n) if kinds[i] == DETERMINISTIC]
        kids = [children[i][0] for i in chain_nodes]
        index = to_device([*chain_nodes, *(tree.tokens[c] for c in kids), *drawn_nodes], probs.device)
        rows, tokens, drawn_rows = index.split((len(chain_nodes), len(kids), len(drawn_nodes)))
        p = probs.index_select(0, rows).float()
        p = p / p.sum(-1, keepdim=True)
        q = torch.stack([drafts[c] for c in kids]).to(p.device, torch.float32)  # one drafter: one device
        px = p.gather(1, tokens[:, None])[:, 0]
        qx = q.gather(1, tokens[:, None])[:, 0]
        accepted = sampler.uniform(len(kids)) * qx < px  # u < p(x)/q(x), without dividing by q(x) = 0
        residual = (p - q).clamp_min(0.0)
        # a zero residual only happens when acceptance had probability 1 up to float error
        residual = torch.where(residual.sum(-1, keepdim=True) > 1e-12, residual, p)
        # drawn_nodes is never empty: a finite tree has a leaf, whose (no) children are deterministic. One
        # categorical for the draws and the residuals (on a CPU the same uniforms, in order, as two calls)
        rows_to_draw = torch.cat([probs.index_select(0, drawn_rows), residual])  # cat widens, never rounds
        picked, flags, *reads = to_host(sampler.categorical(rows_to_draw), accepted, *also)
        draws, resampled = dict(zip(drawn_nodes, picked)), picked[len(drawn_nodes):]
    else:
        draws, *reads = to_host(sampler.categorical(probs[:n]), *also)  # y ~ p at every node
        flags = resampled = []
    chain_index = {node: j for j, node in enumerate(chain_nodes)}
    node, path = 0, [0]
    while True:
        kind = kinds[node]
        if kind == DETERMINISTIC:
            nxt = next((c for c in children[node] if tree.tokens[c] == draws[node]), None)
            if nxt is None:
                return Verdict(path, draws[node], reads)
        elif kind == SAMPLED_CHILD:
            j = chain_index[node]
            if not flags[j]:
                return Verdict(path, resampled[j], reads)
            nxt = children[node][0]
        else:
            nxt, residual_p = _try_sampled_siblings(tree, children[node], probs[node].float(), sampler)
            if nxt is None:
                return Verdict(path, int(sampler.categorical(residual_p)), reads)
        node = nxt
        path.append(node)


def _kind(kids: list[int], drafts) -> int:
    sampled = [drafts[c] is not None for c in kids]
    if not any(sampled):
        return DETERMINISTIC
    return SAMPLED_CHILD if len(kids) == 1 else SAMPLED_SIBLINGS


def _try_sampled_siblings(tree: TokenTree, kids: list[int], p: torch.Tensor, sampler: Sampler):
    """Recursive rejection sampling over siblings (deterministic ones: one-hot q). Syncs per child."""
    p = p / p.sum()
    q_group = None  # working copy of the shared draft distribution of sampled siblings
    for c in kids:
        x = tree.tokens[c]
        q_src = tree.draft_probs[c]
        u = float(sampler.uniform(()))
        if q_src is None:  # deterministic proposal: one-hot q
            if u < float(p[x]):
                return c, p
            zeroed = p.clone()
            zeroed[x] = 0.0
            p = _renormalise(zeroed, p)
        else:
            if q_group is None:
                q_group = q_src.to(p.device).float().clone()
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
