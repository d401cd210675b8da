"""Tell a floating-point near-tie from a real divergence when a lossless method's greedy output
differs from AR's.

In bf16 (or fp16) a multi-row verify forward rounds differently from AR's one-row step, so where
AR's top two logits nearly tie the method may pick the other one, and from there the outputs
differ although the method is correct (the DominoTree paper: lossless "except floating-point
tie-breaking"). For a mismatch we find the first differing position and recompute AR's logits
there (the committed prefix prefilled, then the one-row step AR makes); the margin is
logit(AR's token) - logit(method's token). A margin within `tolerance(dtype, top logit)` is a
numeric near-tie; a larger one is a real divergence (a bug, if the method claims losslessness).

The tolerance is relative to the top logit's magnitude, in units of the dtype's machine epsilon:
TIE_EPS x eps(dtype) x |top logit| (eps: 2**-7 bf16, 2**-10 fp16, 2**-23 fp32), i.e. 1/32 of |top|
in bf16. Measured on SmolLM2-135M in bf16 (docs/gpu-bf16.md, "bf16 and near-ties"): a 16-row verify moves the
top token's logit by up to 0.5 (2% of a top logit of ~24) relative to AR's one-row step, and the
93 mismatches of the bf16 endogenous benchmark had margins in [-0.25, 0.25] against tolerances of
0.19-1.14 there (benchmarks/tie_margins.py); a wrong token (a bug) sits several logits away. `ar_top` != `ar_token`
(the recomputed logits prefer the method's token) is itself a sign of a rounding-level tie.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

TIE_EPS = 4


def tolerance(dtype: torch.dtype, top_logit: float) -> float:
    """The largest margin still called a near-tie for a model computing in `dtype`."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps
    return TIE_EPS * eps * max(abs(top_logit), 1.0)


@dataclass
class Divergence:
    position: int  # index into the generated tokens of the first difference
    ar_token: int
    method_token: int
    margin: float  # AR's logit of its own token minus its logit of the method's token
    tolerance: float
    ar_top: int = -1  # argmax of the recomputed logits (normally ar_token)
    # one output is a strict prefix of the other (-1 for the missing token). Both runs stop at the same stop
    # ids and token limit, where the stop token is committed, so this cannot come from rounding: a bug
    ended_early: bool = False

    @property
    def kind(self) -> str:
        if self.ended_early:
            return "divergence"
        return "tie" if self.margin <= self.tolerance else "divergence"

    def to_dict(self) -> dict:
        return {**asdict(self), "kind": self.kind}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def diagnose(target, prompt_ids: list[int], ar_ids: list[int], method_ids: list[int],
             tolerance_override: float | None = None) -> Divergence | None:
    """Where and how `method_ids` leaves `ar_ids` (both generated after `prompt_ids`); None if equal.
    Where one output is a prefix of the other, the difference is at the end of the shorter one and is
    always a divergence (its margin is reported against the top logit, for the record)."""
    j = first_difference(ar_ids, method_ids)
    if j is None:
        return None
    ar_tok = ar_ids[j] if j < len(ar_ids) else -1
    method_tok = method_ids[j] if j < len(method_ids) else -1
    prefix = list(prompt_ids) + list(ar_ids[:j])
    target.prefill(prefix[:-1])
    logits = target.forward(torch.tensor(prefix[-1:]), torch.zeros(1, dtype=torch.long), None).logits[0].float()
    top = float(logits.max())
    # a missing token (one output ended earlier) is compared with the other output's token alone
    ar_value = float(logits[ar_tok]) if ar_tok >= 0 else top
    method_value = float(logits[method_tok]) if method_tok >= 0 else top
    tol = tolerance(target.dtype, top) if tolerance_override is None else tolerance_override
    return Divergence(j, ar_tok, method_tok, ar_value - method_value, tol, int(logits.argmax()),
                      ended_early=min(ar_tok, method_tok) < 0)
