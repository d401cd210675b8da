"""Host/device transfers and clocks (decoding/engine/transfer.py)."""

import time
from types import SimpleNamespace

import torch

from decoding.engine import loop
from decoding.engine.transfer import goes_through_pinned_memory, synchronize, to_device, to_host


def test_to_host_packs_ints_and_floats_in_one_copy():
    ids, values = to_host(torch.tensor([[3, 4]]), torch.tensor([0.5, -1.25]))
    assert ids == [3, 4] and all(isinstance(i, int) for i in ids) and values == [0.5, -1.25]


def test_to_host_packs_token_ids_in_one_copy_without_a_float_round_trip():
    """Integer ids alone are concatenated as they are (no float64 conversion): the values above 2**53 that a
    float64 would round come back exact, each part in its own list, in order."""
    big = 2**53 + 1
    first, second, third = to_host(torch.tensor([[3, big]]), torch.tensor([], dtype=torch.long), torch.tensor([7]))
    assert (first, second, third) == ([3, big], [], [7])
    ids, flags = to_host(torch.tensor([1, 2]), torch.tensor([True, False]))  # mixed dtypes: the packed path
    assert (ids, flags) == ([1, 2], [1, 0]) and all(type(v) is int for v in ids + flags)


def test_only_host_data_bound_for_a_gpu_goes_through_pinned_memory():
    """Only dense CPU tensors can be pinned: a mask built on the GPU (TargetModel.forward's chain mask for
    a sliding layer that returns its recorded past) crashed every drafter method on Gemma 3 on an H200
    ("cannot pin 'CUDABoolType'")."""
    import numpy as np

    cuda = torch.device("cuda")
    assert all(goes_through_pinned_memory(data, cuda) for data in ([1, 2], np.array([1, 2]), torch.ones(2)))
    assert not goes_through_pinned_memory(torch.ones(2, 2, dtype=torch.bool, device="meta"), cuda)  # on a device
    assert not goes_through_pinned_memory([1, 2], torch.device("cpu"))
    on_device = torch.ones(2, 2, dtype=torch.bool, device="meta")
    moved = to_device(on_device, "meta", torch.bool)
    assert moved.device.type == "meta" and moved.dtype == torch.bool


def test_synchronize_waits_for_the_given_cuda_device_only(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(device))
    synchronize("cpu")
    synchronize(torch.device("cuda", 1))
    assert seen == [torch.device("cuda", 1)]  # that device, not the current one


def test_the_prefill_clock_waits_for_the_device(monkeypatch, tiny_target):
    """prefill_s and wall_s are read after a synchronize of the target's device (on a GPU the prefill's
    kernels are still queued when the host reaches the clock: nothing has read their output)."""
    from decoding.methods.ar import AR, ARConfig

    events = []
    monkeypatch.setattr(loop, "synchronize", lambda device: events.append(("sync", torch.device(device))))
    real_clock, real_prefill = time.perf_counter, tiny_target.prefill
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: events.append(("clock",)) or real_clock()))
    monkeypatch.setattr(tiny_target, "prefill", lambda *a, **k: events.append(("prefill",)) or real_prefill(*a, **k))
    method = AR(ARConfig())
    method.setup(tiny_target)
    state = loop.generate(method, tiny_target, [5, 6, 7], max_new_tokens=2)
    assert state.stats.prefill_s > 0
    kinds = [e[0] for e in events]
    prefill = kinds.index("prefill")
    after = kinds[prefill:]
    # prefill, then a sync, then the clock read of prefill_s; and the last clock read (wall_s) follows a sync
    assert after.index("sync") < after.index("clock")
    assert max(i for i, k in enumerate(kinds) if k == "sync") < max(i for i, k in enumerate(kinds) if k == "clock")
    assert all(e[1] == tiny_target.output_device for e in events if e[0] == "sync")
