"""Moving small things between the host and the device, at most once each way per step.

- `to_host`: several device tensors as Python lists in ONE device->host copy (on a GPU, a sync);
- `synchronize`: before a clock read that must include the device's work (a step ends in a host
  read, which synchronises anyway; the prefill need not);
- `to_device`: host data (token ids, row indices) as a device tensor without stalling the GPU: a
  blocking host->device copy waits for every kernel already queued (PyTorch synchronises the
  stream after it), so on CUDA the data goes through pinned memory with `non_blocking=True`.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(data, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    device = torch.device(device)
    if not goes_through_pinned_memory(data, device):
        return torch.as_tensor(data, dtype=dtype).to(device)
    return torch.as_tensor(data, dtype=dtype).pin_memory().to(device, non_blocking=True)


def goes_through_pinned_memory(data, device: torch.device) -> bool:
    """Host data bound for a GPU. A tensor already on a device (e.g. a mask built there) is not host
    data: only dense CPU tensors can be pinned, so pinning it raises (seen on an H200)."""
    on_device = isinstance(data, torch.Tensor) and data.device.type != "cpu"
    return device.type == "cuda" and not on_device


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA), so a host clock read after it counts that work."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_host(*tensors: torch.Tensor) -> list[list]:
    """Several small device tensors as Python lists with ONE device->host copy (a host sync on a GPU).
    Integer tensors come back as ints, floating ones as floats; each is flattened. Ints are exact at any size
    when every tensor is int64 (token ids), below 2**53 when dtypes are mixed (they meet in float64)."""
    if not tensors:
        return []
    if len(tensors) == 1:  # no packing needed: one copy as it is
        values = tensors[0].reshape(-1).tolist()
        return [list(map(int, values)) if tensors[0].dtype == torch.bool else values]
    flats = [t.reshape(-1) for t in tensors]
    lengths = [flat.shape[0] for flat in flats]
    if all(t.dtype == torch.long for t in tensors):  # token ids only (argmax rows, top-k ids): no conversion
        return split_by(torch.cat(flats).tolist(), lengths)
    # the first one in float64 makes torch.cat promote the others to it: one conversion, one copy; numpy
    # then turns each part back into ints or floats faster than Python's int() per value
    values = torch.cat([flats[0].to(torch.float64), *flats[1:]]).numpy(force=True)  # detached, on the host
    return [part.tolist() if t.dtype.is_floating_point or t.dtype.is_complex else part.astype(np.int64).tolist()
            for t, part in zip(tensors, split_by(values, lengths))]


def split_by(values, lengths: list[int]) -> list:
    """`values` (a list or an array) cut into consecutive parts of these lengths."""
    parts, start = [], 0
    for n in lengths:
        parts.append(values[start:start + n])
        start += n
    return parts
