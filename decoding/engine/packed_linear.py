"""Linear layers whose weights are laid out for oneDNN once, at load, instead of at every call (CPU).

Why: on a CPU, a bf16 `F.linear` runs oneDNN's matmul, which first reorders the weight into its blocked
layout, at every call; for the one to sixteen rows of a decoding step that costs as much as the product for a
large weight (the LM head). Measured on an AMD EPYC with `avx512_bf16`, 2 threads (2026-12-07, benchmarks/bench_packed_linear.py,
docs/gpu-bf16.md): SmolLM2-135M's LM head (49152 x 576) on one row takes 4.6 ms unpacked and 2.2 ms packed, a
576 -> 1536 projection 65 us and 45 us. The packed call runs the same oneDNN kernel: in bf16 its outputs are
bit-identical to `F.linear`'s for contiguous inputs, which are what the engine's layers pass
(tests/decoding/engine/test_packed_linear.py), so packing changes speed, not tokens; AR, the reference of every
speedup, is packed as well.

How: each `nn.Linear` instance of a loaded model (and of the drafters a method loads) is swapped for a
`PackedLinear`, as torch.ao's `quantize_dynamic` or IPEX's `optimize` swap modules; no transformers code is
changed. A `PackedLinear` keeps the original `weight` and `bias` parameters (tied embeddings, exit heads and
state dicts read what they read before), so the packed weights take their memory a second time
(`model.prepack_linear=false` turns packing off). A call that cannot use the packed weight (autograd or
autocast on, another dtype or device, inside torch.compile) runs `F.linear` on the original weight.

fp32: oneDNN's fp32 kernel is not MKL's, so packing would change fp32's rounding; `auto` packs bf16 only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def packing_available(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build can pack a CPU linear's weight of `dtype` for oneDNN."""
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight") or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(nn.Module):
    """An `nn.Linear` whose weight is also held in oneDNN's layout (`packed`, not a parameter or buffer)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        # the reorder's row hint (1) only picks a layout; every row count runs on it (the decoding steps' 1-64 rows)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.packed_dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.packed_dtype or x.device.type != "cpu" or torch.is_grad_enabled() \
                or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling():
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # any leading dims

    # the packed weight is an opaque oneDNN tensor, which neither deepcopy nor pickle can copy: a copy packs its
    # own from the copied weight. (The weights are not to be changed in place after packing: `packed` would not
    # follow; nothing in the project does.)
    def __getstate__(self):
        return {**super().__getstate__(), "packed": None}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, " \
               f"packed={self.packed_dtype}"


def pack_linears(module: nn.Module, dtype: torch.dtype) -> int:
    """Swaps every CPU `nn.Linear` of `module` (exactly that class, so no subclass with its own forward) whose
    weight is of `dtype` (the target's: a drafter's fp32 head next to a bf16 target keeps MKL's fp32 rounding) for
    a `PackedLinear`; returns how many. Packed ones are left as they are."""
    if not packing_available(dtype):
        return 0
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.device.type == "cpu" and child.weight.dtype == dtype:
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    return swapped


SMALL_CONTAINER = 64  # modules sit in attributes or short lists; longer containers are data (n-gram tables, pools)


def pack_held_linears(owner, dtype: torch.dtype) -> int:
    """`pack_linears` on every module `owner` holds: its attributes that are modules, and those of the engine's
    own objects it holds (a drafter wrapper, a TargetModel), also inside lists, tuples and dicts of at most
    SMALL_CONTAINER items. For a method after its `setup`: its drafters' linears are packed as the target's are."""
    swapped, seen, pending = 0, set(), [owner]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, nn.Module):
            swapped += pack_linears(item, dtype)
        elif isinstance(item, (list, tuple, dict)):
            if len(item) <= SMALL_CONTAINER:
                pending.extend(item.values() if isinstance(item, dict) else item)
        elif type(item).__module__.split(".")[0] == "decoding" and hasattr(item, "__dict__"):
            pending.extend(vars(item).values())
    return swapped


def pack_like_target(owner, target) -> int:
    """Packs the drafters `owner` (a method) holds as `target`'s linears are packed, and nothing when they are
    not: a drafter runs as the target does. Called on every method after its setup (pipeline/runner.py,
    pipeline/zoo.py) and, before a method times its drafter inside setup, by its cost profile
    (decoding/drafting/verify_cost.py): the profile must time the drafter it will decode with."""
    return pack_held_linears(owner, target.dtype) if getattr(target, "packed_linears", 0) else 0
