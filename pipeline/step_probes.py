"""What a decoding step costs the host, measured around any method on any device (the zoo's models, or a real
target): `host_overhead` (time outside the network passes, with `ForwardTimer`; torch calls per step with
`HostOpCounter`), `host_reads` (device->host reads per step, by the rule `host_reads_in`) and `device_syncs`
(a CUDA device's own count of what the host waited for). Used by `benchmarks/bench_host_overhead.py`,
`benchmarks/gpu_smoke.py` and tests/decoding/test_host_syncs.py, test_host_work.py."""

from __future__ import annotations

from pathlib import Path

import torch

from decoding.engine.target import TargetModel
from decoding.engine.transfer import synchronize


class ForwardTimer:
    """Times every neural-network forward (target and drafter wrappers, the block drafter's pass)
    while active, synchronising the device around each, so `wall - forward_s` is the host's own
    work: the engine's and the method's Python plus their small tensor operations."""

    def __init__(self, device, clock=None):
        import time

        self.device = torch.device(device)
        # on a CPU, the process's CPU time: robust to other tenants of a shared machine (one thread);
        # on a GPU, wall time (the host waits for the device inside the synchronised forwards)
        self.clock = clock or (time.process_time if self.device.type == "cpu" else time.perf_counter)
        self.forward_s = 0.0
        self.depth = 0

    def _sync(self) -> None:
        synchronize(self.device)

    def wrap(self, fn):
        import functools

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self.depth:  # a pass inside a pass (EAGLE-3's extend runs its step) is counted once
                return fn(*args, **kwargs)
            self._sync()
            self.depth += 1
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.forward_s += self.clock() - t0
                self.depth -= 1

        return timed

    def _passes(self) -> list[tuple[type, str]]:
        """The network passes: the target's forward (eager, or a static one's graph replay), the block
        drafter's pass and its lm_head, the EAGLE-3 drafter's layer, its feature fc (`extend`) and its head
        (`logits`)."""
        from decoding.drafting.dflash_drafter import DFlashDrafter
        from decoding.drafting.eagle3_drafter import Eagle3Drafter
        from decoding.methods.block_draft import BlockDraftMethod

        return [(TargetModel, "_run"), (TargetModel, "_replay"), (DFlashDrafter, "forward"),
                (BlockDraftMethod, "head_logits"), (Eagle3Drafter, "step"), (Eagle3Drafter, "extend"),
                (Eagle3Drafter, "logits")]

    def __enter__(self) -> "ForwardTimer":
        self._saved = [(owner, name, owner.__dict__[name]) for owner, name in self._passes()]
        for owner, name, fn in self._saved:
            setattr(owner, name, self.wrap(fn))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, fn in self._saved:
            setattr(owner, name, fn)


class HostOpCounter(torch.overrides.TorchFunctionMode):
    """Counts the torch-level calls made from Python outside the timed network passes, once `counting` is
    set: functions, tensor methods and attribute reads (`.shape`, `.device`, indexing), as
    `__torch_function__` sees them. Most are dispatches (on a GPU often a kernel launch); attribute reads
    are not. The count does not move with the machine's load, except for methods whose budget comes
    from a timed cost profile (CaDDTree, cost-aware DominoTree)."""

    def __init__(self):
        super().__init__()
        self.timer, self.counting, self.calls = None, False, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.counting and self.timer is not None and self.timer.depth == 0:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def host_overhead(method, target: TargetModel, prompts: list[list[int]], max_new_tokens: int,
                  temperature: float = 0.0, seed: int = 0, count_ops: bool = False) -> dict:
    """Per decoding step: total time, time in network forwards and host time (total - forwards), in
    ms, over `prompts` (the first step and the prefill are excluded). Clock: ForwardTimer's.
    `count_ops`: also `host_ops`, the torch calls per step outside the passes (HostOpCounter; the
    counting itself slows the run, so its times are not comparable with a run without it)."""
    import contextlib

    from decoding.engine.loop import generate

    generate(method, target, prompts[0], max_new_tokens=min(8, max_new_tokens), temperature=temperature)  # warm-up
    wall = fwd = 0.0
    steps = tokens = all_steps = 0
    outputs, tau_steps, tau_accepted, drafted = [], 0, 0, 0
    counter = HostOpCounter() if count_ops else None
    counted_calls = 0  # of the prompts measured (a prompt of one step is not)
    for i, prompt in enumerate(prompts):
        timer = ForwardTimer(target.device)
        marks = {}

        def started(state, marks=marks, timer=timer):
            marks.setdefault("t0", timer.clock())
            marks.setdefault("f0", timer.forward_s)
            if counter is not None:
                counter.counting = True

        if counter is not None:
            counter.timer, counter.counting, counter.calls = timer, False, 0
        with timer, (counter if counter is not None else contextlib.nullcontext()):
            state = generate(method, target, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                             seed=seed + i, on_step=started)
            end = timer.clock()
        if counter is not None:
            counter.counting = False
        outputs.append(state.new_tokens)
        tau_steps += state.stats.num_steps
        tau_accepted += state.stats.num_accepted_tokens
        drafted += state.stats.num_draft_tokens
        # the first step's callback marks the start: step 1 is excluded, steps 2.. are measured
        measured = state.stats.num_steps - 1
        if measured <= 0:
            continue
        wall += end - marks["t0"]
        fwd += timer.forward_s - marks["f0"]
        steps += measured
        counted_calls += counter.calls if counter is not None else 0
        all_steps += state.stats.num_steps
        tokens += state.stats.new_tokens
    steps = max(steps, 1)
    out = {"steps": steps, "wall_ms": 1000 * wall / steps, "forward_ms": 1000 * fwd / steps,
           "host_ms": 1000 * (wall - fwd) / steps, "tokens_per_step": tokens / max(1, all_steps),
           "tau": (tau_accepted + tau_steps) / max(1, tau_steps),
           "draft_tokens_per_step": drafted / max(1, tau_steps),  # a tree method's nodes per tree
           "outputs": outputs}
    if counter is not None:
        out["host_ops"] = counted_calls / steps
    return out


def device_syncs(method, target: TargetModel, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0, top: int = 3) -> dict:
    """A CUDA target's count of what the host waited for: `torch.cuda.set_sync_debug_mode("warn")` warns at every
    synchronizing operation (a host read, a blocking copy, a data-shaped op), and the warnings of the second to the
    last decoding step are counted per step (not the first, nor what runs after the loop), with the `top` lines they
    came from (`folder/file:line` of the innermost Python frame: ours, transformers' or torch's). The CPU tests find
    such operations by rule (tests/decoding/test_host_work.py, test_host_syncs.py); this is the GPU's own count.
    Untimed: a warning costs host time."""
    import warnings

    from decoding.engine.loop import generate

    marks: list[int] = []  # warnings caught at the end of each step
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            state = generate(method, target, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                             on_step=lambda s: marks.append(len(caught)))
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    syncs = [w for w in caught[marks[0]:marks[-1]] if "synchroniz" in str(w.message)] if marks else []
    steps = max(state.stats.num_steps - 1, 1)
    per_step, sites = per_step_with_sites([site_of(w.filename, w.lineno) for w in syncs], steps, top)
    return {"syncs_per_step": per_step, "steps": steps, "sites": sites}


def site_of(filename: str, line: int) -> str:
    """`folder/file:line`, as the probes name where something happened."""
    return f"{'/'.join(Path(filename).parts[-2:])}:{line}"


def per_step_with_sites(sites: list[str], steps: int, top: int) -> tuple[float, dict[str, float]]:
    """Events per step, and the `top` sites they came from with their own per-step counts."""
    import collections

    counts = collections.Counter(sites).most_common(top)
    return round(len(sites) / steps, 2), {site: round(n / steps, 2) for site, n in counts}


# Tensor methods that read a tensor's data on the host: on a GPU each waits for the device. The last four read
# inside torch's own Python (`np.asarray(t)` calls `.numpy()`, an f-string or `repr` formats the values, `x in t`
# calls `.item()`), where a TorchFunctionMode is off: the outer call is what it sees.
HOST_READS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
              torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy,
              torch.Tensor.__array__, torch.Tensor.__format__, torch.Tensor.__repr__, torch.Tensor.__contains__)


def host_reads_in(func, args) -> int:
    """How many host reads a call that `__torch_function__` sees makes: one for HOST_READS; for `x[index]` and
    `x[index] = v`, one per 0-dim integer tensor in the index (indexing reads each in C++).
    Not seen: a read C++ makes of a 0-dim tensor passed where an operation takes a number (e.g. `narrow(0, t, 1)`),
    and any read inside a call already counted."""
    if func in HOST_READS:
        return 1
    if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return sum(isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point()
                   and i.dtype != torch.bool for i in index)
    return 0


TORCH_DIR = str(Path(torch.__file__).parent)


class HostReadCounter(torch.overrides.TorchFunctionMode):
    """Notes the line of every host read (`host_reads_in`) made from Python while active: the innermost frame
    outside torch (ours or transformers')."""

    def __init__(self):
        super().__init__()
        self.sites: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        reads = host_reads_in(func, args)
        if reads:
            import sys

            caller = sys._getframe(1)  # out of torch's Python (`__array__`, `__format__`, ... dispatch from there)
            while caller.f_back is not None and caller.f_code.co_filename.startswith(TORCH_DIR):
                caller = caller.f_back
            self.sites += [site_of(caller.f_code.co_filename, caller.f_lineno)] * reads
        return func(*args, **(kwargs or {}))


def host_reads(method, target: TargetModel, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
               seed: int = 0, top: int = 3) -> dict:
    """The device->host reads a generation makes, found by rule on any device (HostReadCounter): per decoding step
    as `device_syncs` counts a GPU's syncs (steps 2 to last, with the `top` lines they came from), and, in
    `all_reads` over `all_steps`, the whole generation's (prefill, first step and `finish` included)."""
    from decoding.engine.loop import generate

    counter, marks = HostReadCounter(), []
    with counter:
        state = generate(method, target, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                         on_step=lambda s: marks.append(len(counter.sites)))
    steps = max(state.stats.num_steps - 1, 1)
    per_step, sites = per_step_with_sites(counter.sites[marks[0]:marks[-1]] if marks else [], steps, top)
    return {"reads_per_step": per_step, "steps": steps, "sites": sites, "all_reads": len(counter.sites),
            "all_steps": state.stats.num_steps}
