"""Host/device transfers and clocks (decoding/engine/transfer.py)."""

import torch

from decoding.engine import loop
from decoding.engine.transfer import synchronize, to_host


def test_to_host_packs_ints_and_floats_in_one_copy():
    ids, values = to_host(torch.tensor([[3, 4]]), torch.tensor([0.5, -1.25]))
    assert ids == [3, 4] and all(isinstance(i, int) for i in ids) and values == [0.5, -1.25]


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
    real_clock = loop.time.perf_counter
    monkeypatch.setattr(loop.time, "perf_counter", lambda: events.append(("clock",)) or real_clock())
    method = AR(ARConfig())
    method.setup(tiny_target)
    state = loop.generate(method, tiny_target, [5, 6, 7], max_new_tokens=2)
    assert state.stats.prefill_s > 0
    clocks = [i for i, e in enumerate(events) if e == ("clock",)]
    syncs = [i for i, e in enumerate(events) if e[0] == "sync"]
    # the generation's second clock read (prefill_s) and its last (wall_s) each follow a sync
    assert any(clocks[0] < s < clocks[1] for s in syncs) and syncs[-1] < clocks[-1]
    assert all(e[1] == tiny_target.device for e in events if e[0] == "sync")
