"""CaDDTree's cost model and cost-aware stopping rule.

Cv(n, ctx): seconds of one target forward over the root + n draft nodes with `ctx` tokens cached,
profiled on this machine (median of repeats) on a grid of node counts and context lengths, fitted
per context length by monotone + convex least squares (our own fit: slopes parametrised as a
non-negative start plus non-negative increments, solved by bounded least squares), interpolated
linearly in n and in ctx. As in the reference (n = 1..1024 profiled), the node grid reaches the
largest budget that can be admitted and nothing is extrapolated in n: the stopping rule never
admits a node beyond the profiled grid (on a GPU the curve is flat to a few hundred rows, so an
extrapolated line would let trees run to the cap). Beyond the profiled contexts Cv is clamped to
the nearest one, as the reference does. Cd: seconds of one drafting pass. Both are cached per
model + drafter + device + thread count under the user cache dir.

Stopping rule (CaDDTree): with Phi the sum of path probabilities already in the tree, add the next
best node (path probability delta) only while the surrogate throughput rises:
    (1 + Phi + delta) / (Cd + Cv(n + 1, ctx))  >  (1 + Phi) / (Cd + Cv(n, ctx)).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from decoding.engine.packed_linear import pack_like_target
from decoding.engine.transfer import synchronize

log = logging.getLogger(__name__)

STEADY_STATE_NEW_ROWS = 4  # context rows a drafting round projects: about the tokens committed per round


def fit_monotone_convex(xs, ys) -> np.ndarray:
    """Least-squares fit of a non-decreasing convex sequence to (xs, ys), xs increasing."""
    from scipy.optimize import lsq_linear

    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    n = len(xs)
    if n < 3:
        return np.maximum.accumulate(ys)
    gaps = np.diff(xs)
    # beta_i = a + sum_{j<i} gap_j * slope_j,  slope_j = s + sum_{k<=j, k>=1} d_k,  s, d >= 0
    design = np.zeros((n, n))
    design[:, 0] = 1.0
    for i in range(1, n):
        for j in range(i):
            design[i, 1] += gaps[j]  # s
            design[i, 2:j + 2] += gaps[j]  # d_1..d_j
    lower = np.r_[-np.inf, np.zeros(n - 1)]
    theta = lsq_linear(design, ys, bounds=(lower, np.full(n, np.inf))).x
    return design @ theta


@dataclass
class VerifyCostModel:
    node_counts: list[int]
    context_lengths: list[int]
    fitted: list[list[float]]  # [context][node count] seconds, monotone convex in n
    draft_s: float  # Cd

    @property
    def max_nodes(self) -> int:
        """The largest profiled node count: no tree grows beyond it."""
        return self.node_counts[-1]

    def verify_s(self, n: int, context: int) -> float:
        """Cv(n, ctx) for 0 <= n <= max_nodes."""
        if n > self.max_nodes:
            raise ValueError(f"Cv({n}, ·) is outside the profiled node counts (up to {self.max_nodes})")
        return float(self.verify_curve(context)[n])

    def verify_curve(self, context: int) -> np.ndarray:
        """Cv(n, ctx) for n = 0 .. max_nodes at one context: interpolated in n, and in context between
        the profiled lengths (clamped outside them)."""
        self._note_past_grid(context)
        return _interp_rows(context, self.context_lengths, self.per_context())

    def _note_past_grid(self, context: int) -> None:
        """Once per model: a context past the grid is priced as the last one (the reference clamps too),
        which underprices verification there and lets trees grow; the grid should reach the run's contexts."""
        if context > self.context_lengths[-1] and not getattr(self, "_warned_past_grid", False):
            self._warned_past_grid = True
            log.warning("context %d is past the last profiled one (%d): its verify cost is priced as there; "
                        "extend method.profile_context_lengths", context, self.context_lengths[-1])

    def per_context(self) -> np.ndarray:
        """[C, max_nodes + 1]: every profiled context's fitted curve interpolated at every node count
        (computed once; a tree's stopping rule then only blends two rows)."""
        if getattr(self, "_per_context", None) is None:
            n = np.arange(self.max_nodes + 1)
            self._per_context = np.stack([np.interp(n, self.node_counts, curve) for curve in self.fitted])
            self._rows = self._per_context.tolist()
        return self._per_context

    def curve_at(self, context: int):
        """Cv(·, ctx) as a function of n, blending the two profiled contexts around ctx (clamped
        outside them): what `verify_curve` gives, without building the whole curve per tree."""
        self.per_context()
        xs, rows = self.context_lengths, self._rows
        if context <= xs[0] or len(xs) == 1:
            return rows[0].__getitem__
        if context >= xs[-1]:
            self._note_past_grid(context)
            return rows[-1].__getitem__
        j = int(np.searchsorted(xs, context)) - 1
        w = (context - xs[j]) / (xs[j + 1] - xs[j])
        low, high = rows[j], rows[j + 1]
        return lambda n: (1 - w) * low[n] + w * high[n]

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


def _interp_rows(x: float, xs: list[int], rows: np.ndarray) -> np.ndarray:
    """Linear interpolation between the rows of `rows` [len(xs), N] at x, clamped outside xs."""
    if x <= xs[0]:
        return rows[0]
    if x >= xs[-1]:
        return rows[-1]
    j = int(np.searchsorted(xs, x)) - 1
    w = (x - xs[j]) / (xs[j + 1] - xs[j])
    return (1 - w) * rows[j] + w * rows[j + 1]


class CostAwareStop:
    """CaDDTree's admission rule: node by node for `build_best_first(admit=...)` (`__call__`), or on a
    whole best-first order for `build_marginal_tree` (`admitted`)."""

    def __init__(self, model: VerifyCostModel, context: int):
        self.model, self.context = model, context
        self.phi = 0.0
        self.verify = model.curve_at(context)  # Cv(n, ctx)
        self.theta = 1.0 / (model.draft_s + self.verify(0))

    def admitted(self, scores: np.ndarray) -> int:
        """How many of a tree's node scores, best first, the rule admits: what calling it node by node
        would give (the marginal builder applies it to the whole best-first order at once)."""
        n = min(len(scores), self.model.max_nodes)
        delta = np.exp(scores[:n])
        phi_before = np.cumsum(np.concatenate([[self.phi], delta]))[:-1]  # summed in the order __call__ sums
        # (1 + phi) + delta, grouped as in __call__: on a flat curve the rule turns on the last bit of it
        theta = ((1.0 + phi_before) + delta) / (self.model.draft_s + self.model.verify_curve(self.context)[1:n + 1])
        falls = np.flatnonzero(np.diff(np.concatenate([[self.theta], theta])) <= 0)
        return int(falls[0]) if len(falls) else n

    def __call__(self, n: int, score: float) -> bool:
        if n + 1 > self.model.max_nodes:  # never admit a node the profile does not cover
            return False
        delta = math.exp(score)
        theta_new = (1.0 + self.phi + delta) / (self.model.draft_s + self.verify(n + 1))
        if theta_new <= self.theta:
            return False
        self.phi += delta
        self.theta = theta_new
        return True


def admissible_node_grid(max_budget: int) -> list[int]:
    """0, 1, 2, 4, ... up to and including `max_budget`: the default profiling grid."""
    grid = [0]
    while grid[-1] < max_budget:
        grid.append(min(max(1, grid[-1] * 2), max_budget))
    return grid


def check_profile_grid(cfg, budget_name: str = "method.max_budget") -> None:
    """Fill the default node grid; refuse one that does not cover the budget that can be admitted (`cfg.max_budget`,
    named `budget_name` in the error)."""
    from pipeline.errors import ConfigError

    if cfg.profile_node_counts is None:
        cfg.profile_node_counts = admissible_node_grid(cfg.max_budget)
    counts = list(cfg.profile_node_counts)
    if len(counts) < 2 or sorted(set(counts)) != counts:
        raise ConfigError("method.profile_node_counts must be increasing, at least two values")
    if counts[-1] < cfg.max_budget:
        raise ConfigError(f"method.profile_node_counts ends at {counts[-1]} but {budget_name}={cfg.max_budget}: "
                          "the cost model must be profiled up to the largest tree it may admit")
    contexts = cfg.profile_context_lengths
    if contexts is not None and (not contexts or sorted(set(contexts)) != list(contexts)):
        raise ConfigError("method.profile_context_lengths must be increasing, at least one value")


def profiled_contexts(cfg, device: torch.device) -> list[int]:
    """`method.profile_context_lengths`, or its default for the device: a GPU run reaches thousands of
    tokens (dominotree_table: 2048 new ones), and a context past the grid is priced as its last one."""
    if cfg.profile_context_lengths is not None:
        return list(cfg.profile_context_lengths)
    return list(range(0, 8193, 1024)) if torch.device(device).type == "cuda" else [64, 512, 1024]


@torch.inference_mode()
def profile_verify_cost(target, node_counts: list[int], context_lengths: list[int], repeats: int,
                        draft_fn, draft_repeats: int = 5) -> VerifyCostModel:
    """Median forward time of root + n nodes at each context length, then the monotone convex fit;
    `draft_fn()` runs one drafting pass for Cd. The nodes form a chain (causal mask): the mask's
    shape does not change the cost of a dense forward, only the row count and context do."""
    gen = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    medians = []
    for context in context_lengths:
        target.prefill(torch.randint(100, vocab, (context,), generator=gen).tolist())
        row = []
        for n in node_counts:
            tokens = torch.randint(100, vocab, (n + 1,), generator=gen)
            depths = torch.arange(n + 1)
            visible = torch.tril(torch.ones(n + 1, n + 1, dtype=torch.bool))
            times = []
            for _ in range(repeats + 1):
                synchronize(target.output_device)  # nothing queued before the clock starts
                t0 = time.perf_counter()
                target.forward(tokens, depths, visible)
                synchronize(target.output_device)
                times.append(time.perf_counter() - t0)
                target.truncate(context)
            row.append(statistics.median(times[1:]))  # first call warms up
        medians.append(row)
    draft_times = []
    for _ in range(draft_repeats + 1):
        synchronize(target.output_device)
        t0 = time.perf_counter()
        draft_fn()
        synchronize(target.output_device)
        draft_times.append(time.perf_counter() - t0)
    fitted = [fit_monotone_convex(node_counts, row).tolist() for row in medians]
    return VerifyCostModel(list(node_counts), list(context_lengths), fitted, statistics.median(draft_times[1:]))


def profiled_cost_model(target, cfg, draft_fn, *, method, tag: str = "", shape: tuple = ()) -> VerifyCostModel:
    """The cost model of a `method`'s `cfg` (its `drafter`, `profile_node_counts`, `profile_context_lengths`,
    `profile_repeats`), profiled with `draft_fn` for Cd, or read from the cache: keyed by the machine, the
    profile grid and what else changes the draft's cost (`shape`; `tag` names the method kind in the key).
    The method's drafters are packed first where the target's linears are: Cd times the drafter that decodes."""
    pack_like_target(method, target)
    contexts = profiled_contexts(cfg, target.device)
    grid = json.dumps([list(cfg.profile_node_counts), contexts, cfg.profile_repeats, *shape])
    digest = hashlib.sha1(grid.encode()).hexdigest()[:10]
    key = machine_key(target, cfg.drafter) + (f"-{tag}" if tag else "") + "-" + digest
    return cached_cost_model(key, lambda: profile_verify_cost(
        target, list(cfg.profile_node_counts), contexts, cfg.profile_repeats, draft_fn))


def cached_cost_model(key: str, build) -> VerifyCostModel:
    """Load the cost model cached under `key`, or build, save and return it."""
    from pipeline.models import cache_root

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    path = cache_root() / "cost_models" / f"{safe}.json"
    if path.is_file():
        return VerifyCostModel(**json.loads(path.read_text()))
    model = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_json(), indent=2))
    return model


def machine_key(target, drafter_location: str | None = None) -> str:
    """What a measured cost curve depends on: model, drafter (None: a curve of the target alone), device (and
    how many a device_map spreads the weights over: each boundary adds a hop per forward), threads, dtype,
    attention kernel, whether the forwards replay CUDA graphs (a graphed curve lacks the launches that
    flatten an eager one) and whether the linear layers are packed (decoding/engine/packed_linear.py)."""
    device = torch.device(target.device)
    device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    device += f"-x{len(target.devices)}" if len(target.devices) > 1 else ""
    name = Path(str(getattr(target.config, "_name_or_path", "model"))).name
    params = sum(p.numel() for p in target.model.parameters())
    attn = getattr(target.config, "_attn_implementation", None) or "default"
    graphs = "-graphs" if getattr(target, "graphs", None) is not None else ""
    graphs += "-packed" if getattr(target, "packed_linears", 0) else ""  # oneDNN-packed linears: another curve
    drafter = f"-{Path(drafter_location).name}" if drafter_location is not None else ""
    return (f"{name}-{params}{drafter}-{device}-t{torch.get_num_threads()}-{target.dtype}"
            f"-{attn}{graphs}")
