"""Autoregressive baseline: the empty draft. One target forward per token, same engine, same
stopping and sampling as every speculative method, so it is the reference for speedup and for
token-by-token equality."""

from __future__ import annotations

from dataclasses import dataclass

from decoding.engine.loop import Method


@dataclass
class ARConfig:
    _target_: str = "decoding.methods.ar.AR"
    name: str = "ar"


class AR(Method):
    name = "ar"
    # propose() of the base class is the root-only tree: verification then just samples (or
    # takes the argmax of) the target's next-token distribution.


CONFIG = ARConfig
