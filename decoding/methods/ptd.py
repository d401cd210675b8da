"""Progressive Tree Drafting (PTD; OpenReview iW4lyuOQ0J, no public code): drafting as a tree
search inside the target, in the same forward as verification. Reconstructed from the paper's
abstract and the issue (docs/methods/endogenous.md says where it departs); the data structures live in
`decoding/drafting/ptd_tree.py`.

One step, one forward:
1. seed: the draft forest holds `num_seeds` subtrees under the root. `stochastic`: random prompt
   tokens (controlled perturbations) fill free slots; `context`: for every new root, the tokens
   that followed it earlier in the text (most recent first) are planted, each replacing the oldest
   subtree, and random prompt tokens fill what is left;
2. verify: the pool's trie for the root is the verification tree (at most `verification_budget`
   nodes). With `graft`, it is grown best-first by joining pool subtrees that share a root token:
   a candidate path continues with the pool's subtree of its longest suffix (the recursive merge,
   so candidates reach `candidate_depth`); without it, the root's own trie, freshest branches first.
   The forest rides along as aux rows, each node seeing the root and its ancestors at position
   root + depth (the two trees do not see each other);
3. expand: every leaf gets its most probable next tokens as children (at most `width` per parent,
   the forest capped at `drafting_budget` nodes, first children first);
4. extract and merge: the subtree below every forest node is merged into the pool under that
   node's token (recursive trie union, at most `pool_size` branches per root, LRU); with
   `recycle`, so are the verification rows' top-`width` next tokens (the verification tree is
   part of the tree this forward grew), and with `context_subtrees` the committed text's
   continuations (our extension; the paper's context-derived items are the seeds of step 1);
5. prune: the depth window slides every subtree deeper than `depth` (keep the earliest-added
   child, drop the older branches). A full forest retires its oldest subtrees before it expands, so
   every forward grows it.
Verification is the engine's tree acceptance (greedy: follow the argmax child; sampling:
deterministic children tried in order, lossless), so output is exactly the target's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from decoding.engine.aux_rows import AuxRows
from decoding.engine.loop import DecodeState, Method, Proposal, StepResult
from decoding.drafting.ngram_pool import bigram_redundancy, candidate_tree, record_redundancy
from decoding.drafting.ptd_tree import DraftForest, TriePool, graft_tree
from decoding.engine.transfer import to_device
from pipeline.errors import check_choice, check_range

SEED_MODES = ("stochastic", "context")


@dataclass
class PTDConfig:
    _target_: str = "decoding.methods.ptd.PTD"
    name: str = "ptd"
    # No public code or reported defaults: these are the reconstruction's defaults, measured on
    # SmolLM2-135M (docs/methods/endogenous.md, PTD ablation); tuned values: ptd_tuned.
    width: int = 3  # issue #3 "width": max children per parent, highest probability first
    depth: int = 4  # issue #3 "depth threshold" of the sliding window (forest subtrees <= depth - 1 deep)
    num_seeds: int = 2  # issue #3 "number of seeds": subtrees in the draft forest
    seed_mode: str = "stochastic"  # issue #3 seeds: stochastic (random prompt tokens) | context
    pool_size: int = 8  # issue #3 "pool size per root": branches kept per root token (LRU)
    verification_budget: int = 32  # issue #3 "verification budget": candidate nodes per forward
    drafting_budget: int = 8  # issue #3 "drafting budget": draft-forest nodes per forward
    # Context subtrees, an extension of ours (off in ptd_forest; the paper's "context-derived" are seeds:
    # seed_mode=context): the committed text's continuation of every token (its next `depth` tokens) is
    # merged into the pool under that token.
    context_subtrees: bool = True
    # The verification tree is part of the grown tree: its rows' top-`width` next tokens are
    # extracted and merged into the pool under their node's token, like the forest's leaves.
    recycle: bool = True
    # Recursive merge at lookup: a candidate path is extended by the pool's subtree of its longest
    # suffix that has one, so subtrees sharing a root token join into one deeper trie per root
    # (false: the root's own trie only, the pool as stored).
    graft: bool = True
    candidate_depth: int = 8  # deepest grafted candidate (graft=true)
    seed: int = 0  # seeds the stochastic seeds

    def __post_init__(self) -> None:
        check_range("method.width", self.width, 1)
        check_range("method.depth", self.depth, 2)
        check_range("method.num_seeds", self.num_seeds, 1)
        check_choice("method.seed_mode", self.seed_mode, SEED_MODES)
        check_range("method.pool_size", self.pool_size, 1)
        check_range("method.verification_budget", self.verification_budget, 0)
        check_range("method.drafting_budget", self.drafting_budget, self.num_seeds)
        check_range("method.candidate_depth", self.candidate_depth, 1)


class PTD(Method):
    name = "ptd"

    def begin(self, state: DecodeState) -> None:
        self.rng = random.Random(self.config.seed)
        self.forest = DraftForest()
        self.pool = TriePool(self.config.pool_size)
        self.steps = 0
        if self.config.context_subtrees:
            with self.pool.batch():
                self.merge_context(state.sequence, len(state.sequence))

    def propose(self, state: DecodeState) -> Proposal:
        cfg = self.config
        self.plant_seeds(state)
        aux = AuxRows()
        for node, depth, anc in zip(self.forest.nodes, self.forest.depths(), self.forest.ancestors()):
            aux.add(node.token, depth, anc)  # forest index == aux row index
        if cfg.graft:
            tree = graft_tree(self.pool, state.root, cfg.verification_budget, cfg.candidate_depth)
        else:
            branches = [tokens for _, tokens in self.pool.branches(state.root)]
            tree = candidate_tree(state.root, branches, cfg.verification_budget)
        state.stats.add_extra("forward_rows", len(tree) + len(aux))
        return aux.proposal(tree, reads=lambda output: self.forward_reads(output, len(tree)))

    def plant_seeds(self, state: DecodeState) -> None:
        """Stochastic seeds fill free subtree slots once; context seeds are re-derived for every
        root (the tokens that followed it before), each fresh one replacing the oldest subtree."""
        cfg, forest = self.config, self.forest
        present = {forest.nodes[t].token for t in forest.tops()}
        if cfg.seed_mode == "context":
            seq = state.sequence
            fresh: list[int] = []
            for i in range(len(seq) - 2, -1, -1):  # most recent first
                if len(fresh) == cfg.num_seeds:
                    break
                if seq[i] == seq[-1] and seq[i + 1] not in present and seq[i + 1] not in fresh:
                    fresh.append(seq[i + 1])
            for tok in reversed(fresh):  # the most recent one ends up newest
                forest.add(tok, -1, self.steps)
            tops = sorted(forest.tops(), key=lambda t: (forest.nodes[t].birth, t))
            if len(tops) > cfg.num_seeds:
                forest.drop(set(tops[: len(tops) - cfg.num_seeds]))
        for _ in range(cfg.num_seeds - len(forest.tops())):
            forest.add(self.rng.choice(state.prompt_ids), -1, self.steps)

    def merge_context(self, seq: list[int], new: int) -> None:
        """Every token whose next `depth` tokens changed this step gets them merged as a chain."""
        n = self.config.depth
        for i in range(max(0, len(seq) - new - n - 1), len(seq) - 1):
            chain: dict = {}
            for tok in reversed(seq[i + 1:i + 1 + n]):
                chain = {tok: chain}
            self.pool.merge(seq[i], chain, self.steps)

    def observe(self, state: DecodeState, result: StepResult) -> None:
        with self.pool.batch():  # one LRU eviction per root and step
            self._observe(state, result)

    def _observe(self, state: DecodeState, result: StepResult) -> None:
        cfg = self.config
        self.steps += 1
        if cfg.context_subtrees:
            self.merge_context(state.sequence, len(result.committed))
        tree, forest = result.proposal.tree, self.forest
        recycled, edge_logp, proposals = self.read_forward(result)
        # (parent token, drafted token) of every row this forward grew; first the verification rows' own
        # top-`width` next tokens (recycle; empty without it)
        drafted = [(tok, t) for tok, nxt in zip(tree.tokens, recycled) for t in nxt]
        for tok, nxt in zip(tree.tokens, recycled):
            self.pool.merge_leaves(tok, nxt, self.steps)
        if len(forest):
            children = (n for n in forest.nodes if n.parent >= 0)
            for n, logp in zip(children, edge_logp):  # refresh each edge's probability under the new root
                n.logp = logp
            while len(forest) >= cfg.drafting_budget:
                # a full forest retires its oldest subtrees first (one retirement may free a single node, and
                # seeds may overfill it), so that this forward's rows still grow it; retiring only after a
                # forward that could not grow left every other forward's proposals unused
                kept = forest.retire({min(forest.tops(), key=lambda t: forest.nodes[t].birth)})
                proposals = {kept[leaf]: options for leaf, options in proposals.items() if leaf in kept}
            forest.expand(proposals, cfg.width, cfg.drafting_budget, self.steps)
            for i, n in enumerate(forest.nodes):  # extract: continuations of every node's token
                if n.children:
                    self.pool.merge(n.token, forest.subtree(i), self.steps)
            drafted += forest.edges()
            forest.slide(cfg.depth)
        # redundancy over everything this forward drafted: the recycled edges and the forest's
        record_redundancy(state.stats, *bigram_redundancy([], drafted))

    def forward_reads(self, output, n_tree: int) -> list[torch.Tensor]:
        """What this step needs from the forward (`Proposal.reads`: read to the host in the acceptance's copy,
        with one host->device index copy): every row's top-`width` next tokens (the tree rows' are recycled,
        the forest leaves' expand the forest, with their log-probabilities) and the forest edges'
        log-probabilities under the new root. Log-probabilities only for the forest's rows (one log-softmax
        over them, none over the tree rows)."""
        cfg, forest = self.config, self.forest
        n_forest, w = len(forest), cfg.width
        if not cfg.recycle and not n_forest:
            return []
        logits = output.logits[:n_tree + n_forest]
        top = torch.topk(logits, w, dim=-1)  # the most probable next tokens: log-softmax keeps the order
        reads = [top.indices]
        if n_forest:
            logp = torch.log_softmax(logits[n_tree:].float(), dim=-1)  # [F, V], one fused pass
            reads.append(logp.gather(1, top.indices[n_tree:]))  # the leaves' proposals
            kids = [n for n in forest.nodes if n.parent >= 0]
            if kids:  # each edge's entry of its parent's row, as flat indices into logp: one index op
                vocab = logp.shape[-1]
                flat = to_device([n.parent * vocab + n.token for n in kids], logits.device)
                reads.append(logp.view(-1).index_select(0, flat))
        return reads

    def read_forward(self, result: StepResult):
        """`forward_reads`' host values (`result.reads`) unpacked: (recycled tokens per tree row, edge
        log-probabilities in forest order, {leaf: [(token, logp)] best first})."""
        cfg, forest = self.config, self.forest
        n_tree, n_forest, w = len(result.proposal.tree), len(forest), cfg.width
        if not result.reads:
            return [], [], {}
        ids, *values = result.reads
        recycled = [ids[r * w:(r + 1) * w] for r in range(n_tree)] if cfg.recycle else []
        proposals, edges = {}, []
        if n_forest:
            leaf_values, *edges = values
            for leaf in forest.leaves():
                first = (n_tree + leaf) * w
                proposals[leaf] = list(zip(ids[first:first + w], leaf_values[leaf * w:(leaf + 1) * w]))
        return recycled, edges[0] if edges else [], proposals


CONFIG = PTDConfig
