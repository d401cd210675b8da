"""pipeline/summary.py: run totals from per-prompt rows."""

import pytest

from pipeline.summary import totals


def row(new_tokens, steps, drafted, accepted, extra=None):
    return {"new_tokens": new_tokens, "wall_s": 1.0, "prefill_s": 0.1, "draft_s": 0.2, "verify_s": 0.5,
            "other_s": 0.2, "target_forwards": steps + 1, "num_steps": steps, "num_drafts": steps,
            "num_draft_tokens": drafted, "num_accepted_tokens": accepted, "num_accepted_tokens_per_pos": [accepted],
            "extra": extra or {}}


def test_totals_sum_rows_and_derive_tau_rejection_and_redundancy():
    rows = [row(10, 5, 20, 5, {"draft_bigrams": 30, "draft_bigrams_duplicated": 6}),
            row(6, 3, 12, 3, {"draft_bigrams": 10, "draft_bigrams_duplicated": 4})]
    t = totals(rows)
    assert t["new_tokens"] == 16 and t["num_steps"] == 8
    assert t["tau"] == pytest.approx((8 + 8) / 8)
    assert t["rejection_rate"] == pytest.approx(1 - 8 / 32)
    assert t["draft_redundancy"] == pytest.approx(10 / 40)  # pooled over the run, not a mean of per-row shares
    assert t["extra"] == {"draft_bigrams": 40, "draft_bigrams_duplicated": 10}


def test_methods_without_branches_have_no_redundancy():
    t = totals([row(4, 4, 0, 0)])
    assert t["draft_redundancy"] is None and t["rejection_rate"] is None
