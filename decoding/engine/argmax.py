"""`row_argmax`: `x.argmax(-1)`, exactly (the first index of each row's maximum, NaN counting as the
maximum), at the speed of a vectorised reduction on a CPU.

Why: PyTorch's CPU argmax is not vectorised, `amax` is (torch 2.13 on this AMD EPYC, one thread: argmax over a
40 x 49k block took 1.6 ms in fp32 and 7 ms in bf16, `bench_argmax.py`), so the greedy check of a verification
tree over a real vocabulary is a sizeable part of a step that a tree method pays and AR (one row) hardly
does. On a CPU a wide row is therefore split into blocks: `amax` per
block (vectorised), the first block holding the row's maximum (argmax over the few block maxima), and the
first index of the maximum within it. The result is argmax's: the first block holding the maximum contains
its first index. Other devices run plain argmax (one kernel; the result is the same).
`python benchmarks/bench_argmax.py` times both.
"""

from __future__ import annotations

import torch

BLOCK = 128  # entries per block (a one-off timing on this CPU: 64 and 32 were slower)
MIN_WIDTH = 4096  # narrower rows: plain argmax (at 512 entries the blocks' extra calls cost about what they save)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)` (int64, shape `x.shape[:-1]`), computed blockwise for wide rows on a CPU."""
    width = x.shape[-1]
    if x.device.type != "cpu" or width < MIN_WIDTH or x.numel() == 0:
        return x.argmax(-1)
    rows = x.reshape(-1, width)
    full = width // BLOCK * BLOCK
    peaks = rows[:, :full].reshape(rows.shape[0], -1, BLOCK).amax(-1)  # [R, blocks]
    if full < width:  # a shorter last block
        peaks = torch.cat([peaks, rows[:, full:].amax(-1, keepdim=True)], dim=1)
    start = peaks.argmax(-1) * BLOCK  # the first block holding the maximum (NaN: the first with a NaN)
    # the block's columns; a shorter last block repeats its last column, which cannot come first
    cols = (start[:, None] + torch.arange(BLOCK, device=x.device)).clamp_(max=width - 1)
    return (start + rows.gather(1, cols).argmax(-1)).reshape(x.shape[:-1])
