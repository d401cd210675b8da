"""Drafter models and draft-building blocks the methods share: autoregressive and layer-skipping
drafters, the DFlash/Domino block drafter and heads, best-first tree building, n-gram pools, PTD's
forest, the verify-cost model and routing masks."""
