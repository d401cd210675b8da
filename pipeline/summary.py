"""Run-level metrics from per-example rows, with speedup and match_rate against the AR reference."""

from __future__ import annotations

import statistics

from pipeline.tasks import QUALITY_METRIC, aggregate_quality

SUM_KEYS = ("new_tokens", "wall_s", "prefill_s", "draft_s", "verify_s", "other_s", "target_forwards", "num_steps",
            "num_drafts", "num_draft_tokens", "num_accepted_tokens")


def totals(rows: list[dict]) -> dict:
    out = {k: sum(r[k] for r in rows) for k in SUM_KEYS}
    # rows written before cost weighting existed count every pass as a full one
    out["target_forward_cost"] = sum(r.get("target_forward_cost", r["target_forwards"]) for r in rows)
    per_pos: list[int] = []
    extra: dict = {}
    for r in rows:
        for i, v in enumerate(r["num_accepted_tokens_per_pos"]):
            per_pos.extend([0] * (i + 1 - len(per_pos)))
            per_pos[i] += v
        for k, v in r.get("extra", {}).items():
            extra[k] = extra.get(k, 0) + v
    out["num_accepted_tokens_per_pos"] = per_pos
    out["extra"] = extra
    steps = out["num_steps"]
    out["tokens_per_s"] = out["new_tokens"] / out["wall_s"] if out["wall_s"] else 0.0
    out["tau"] = (out["num_accepted_tokens"] + steps) / steps if steps else 0.0
    cost = out["target_forward_cost"]
    out["decoding_efficiency"] = out["new_tokens"] / cost if cost else 0.0  # cost-weighted (decoding/engine/metrics.py)
    # acceptance rate per draft position: accepted at depth d / steps that drafted (vLLM's view)
    out["acceptance_per_pos"] = [v / out["num_drafts"] for v in per_pos] if out["num_drafts"] else []
    # share of drafted tokens that did not end up in the output (VIA-SD's headline comparison)
    drafted = out["num_draft_tokens"]
    out["rejection_rate"] = 1 - out["num_accepted_tokens"] / drafted if drafted else None
    # share of drafted bigrams another branch of the same step also drafted (methods that draft
    # several branches log it per step: decoding.drafting.ngram_pool.record_redundancy)
    bigrams = extra.get("draft_bigrams", 0)
    out["draft_redundancy"] = extra.get("draft_bigrams_duplicated", 0) / bigrams if bigrams else None
    return out


def summarize(cfg, method, examples, rows: list[dict], reference: list[dict] | None) -> dict:
    summary = {
        "experiment": cfg.experiment_name, "method": method.name, "model": cfg.model.name, "task": cfg.task.name,
        "temperature": cfg.temperature, "lossless": method.lossless, "num_prompts": len(rows),
        **totals(rows),
    }
    by_id = {ex.id: ex for ex in examples}
    done_examples = [by_id[r["id"]] for r in rows]
    summary["quality"] = aggregate_quality(cfg.task.name, done_examples, [r["outputs"] for r in rows],
                                           [r["quality"] for r in rows])
    summary["quality_metric"] = QUALITY_METRIC.get(cfg.task.name)
    if any("category" in r for r in rows):
        summary["by_category"] = by_category(rows, reference if method.name != "ar" else rows)
    if method.name == "ar":
        summary.update(speedup=1.0, ar_tokens_per_s=summary["tokens_per_s"], match_rate=1.0, match_ties=0,
                       match_divergences=0)
    elif reference:
        greedy = cfg.temperature == 0
        summary.update(compare_to_reference(rows, reference, check_match=method.lossless and greedy,
                                            check_agreement=not method.lossless and greedy))
        summary.update(repeat_spread(rows, reference))
        ref_examples = [by_id[r["id"]] for r in reference if r["id"] in by_id]
        summary["ar_quality"] = aggregate_quality(cfg.task.name, ref_examples, [r["outputs"] for r in reference],
                                                  [r["quality"] for r in reference])
    return summary


def by_category(rows: list[dict], reference: list[dict] | None) -> dict:
    """Spec-Bench's breakdown: per category, the prompts, tokens/s, τ and speedup against AR's rows of
    the same prompts."""
    out = {}
    for category in sorted({r.get("category") for r in rows if r.get("category") is not None}):
        mine = [r for r in rows if r.get("category") == category]
        sums = totals(mine)
        entry = {"num_prompts": len(mine), "tokens_per_s": sums["tokens_per_s"], "tau": sums["tau"]}
        if reference:
            entry.update({k: v for k, v in compare_to_reference(mine, reference, check_match=False).items()
                          if k in ("speedup", "ar_tokens_per_s")})
        out[category] = entry
    return out


def compare_to_reference(rows: list[dict], reference: list[dict], check_match: bool,
                         check_agreement: bool = False) -> dict:
    """Speedup over the examples both runs finished: ratio of aggregate tokens/s (Spec-Bench). A lossless
    method at T=0: the share of prompts equal to AR. A lossy one at T=0: `ar_prefix_agreement`, the mean
    share of AR's tokens (all turns, in order) it reproduced before it first left them: a quality measure
    for tasks without a scorer (MT-Bench), and next to the task metric for the others."""
    ref = {r["id"]: r for r in reference}
    both = [r for r in rows if r["id"] in ref]
    if not both:
        return {}
    mine, theirs = totals(both), totals([ref[r["id"]] for r in both])
    out = {"ar_tokens_per_s": theirs["tokens_per_s"],
           "speedup": mine["tokens_per_s"] / theirs["tokens_per_s"] if theirs["tokens_per_s"] else 0.0}
    if check_match:
        matches = [r["output_ids"] == ref[r["id"]]["output_ids"] for r in both]
        out["match_rate"] = sum(matches) / len(matches)
        out["mismatched_ids"] = [r["id"] for r, m in zip(both, matches) if not m]
    if check_agreement:
        out["ar_prefix_agreement"] = sum(prefix_agreement(r["output_ids"], ref[r["id"]]["output_ids"])
                                         for r in both) / len(both)
    return out


def prefix_agreement(turns: list[list[int]], ar_turns: list[list[int]]) -> float:
    from decoding.engine.ties import first_difference

    mine, ar = [t for turn in turns for t in turn], [t for turn in ar_turns for t in turn]
    j = first_difference(ar, mine)
    return 1.0 if j is None else j / max(len(ar), 1)


def repeat_spread(rows: list[dict], reference: list[dict]) -> dict:
    """With repeats: the speedup of each repeat (its rows against AR's rows of the same repeat) and
    their mean ± sample std, as Spec-Bench reports it; nothing for a single pass."""
    from pipeline.tasks.loaders import repeat_of

    passes = sorted({repeat_of(r["id"]) for r in rows})
    if len(passes) < 2:
        return {}
    speedups = []
    for p in passes:
        ratio = compare_to_reference([r for r in rows if repeat_of(r["id"]) == p], reference, check_match=False)
        if "speedup" in ratio:
            speedups.append(ratio["speedup"])
    if len(speedups) < 2:
        return {}
    return {"repeats": len(speedups), "speedup_per_repeat": speedups, "speedup_mean": statistics.mean(speedups),
            "speedup_std": statistics.stdev(speedups)}


def tie_counts(diagnosis: list[dict]) -> dict:
    """Of the mismatching prompts (pipeline.generation.diagnose_mismatches): how many first diverge
    at a numeric near-tie, how many really diverge, and the ids of the latter."""
    return {"match_ties": sum(d["kind"] == "tie" for d in diagnosis),
            "match_divergences": sum(d["kind"] == "divergence" for d in diagnosis),
            "divergent_ids": [d.get("id") for d in diagnosis if d["kind"] == "divergence"]}


def add_tie_diagnosis(summary: dict, diagnosis: list[dict]) -> None:
    summary["mismatch_diagnosis"] = diagnosis
    summary.update(tie_counts(diagnosis))
