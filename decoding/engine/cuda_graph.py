"""Replaying a fixed-shape drafting step from a CUDA graph: for the loops whose cost on a GPU is the launch
of hundreds of tiny kernels, not their arithmetic (DominoTree's tree, ~15 kernels per depth; the Domino chain,
~14 per drafted position).

`StaticGraph(fn, inputs, constants)` captures `fn(**inputs, **constants)` once. `inputs` are the tensors that
change from call to call: the graph reads static copies of them, and every call copies the new values in
before it replays. `constants` (weights, ints) are read in place. The outputs are the graph's own buffers,
so the next call overwrites them; a caller keeps what it needs before it calls again.

`fits(inputs, constants)` says whether a call can reuse the graph: the same input names, shapes and dtypes
(None where None), and the same constants (tensors by identity, other values by equality). Tensors compare
by identity because the graph reads their memory in place: a method passes its head's own weight tensors
every round, never fresh views of them.

`GraphReplayer` keeps a method's graphs by name. It captures a graph on first use and again only when a call
does not fit; a name captured RECAPTURE_WARNING times gets one warning line (a capture every round would be a
bug: each costs a sync). A failed capture is one error line (`ConfigError`) naming the operation that broke it
and the option that turns graphs off. It does not fall back to eager: after a broken capture PyTorch's caching
allocator still counts a capture under way, so the process is not clean.

A CUDA graph runs only on a GPU. With `emulate=True`, a graph is "replayed" on any device by running `fn`
eagerly on the static copies and copying its results into the static outputs. That is the same buffer
bookkeeping as a real replay, including outputs the next call overwrites, so the CPU tests check that
bookkeeping; they cannot check the capture itself (benchmarks/gpu_smoke.py does, on a GPU).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)


RECAPTURE_WARNING = 4  # captures of one name after which a line says so (a capture per round would be a bug)


class GraphCaptureError(RuntimeError):
    """A CUDA graph could not capture the function (an op that syncs or is not capturable)."""


class StaticGraph:
    def __init__(self, fn: Callable, inputs: dict, constants: dict, emulate: bool = False):
        self.fn, self.constants, self.emulate = fn, dict(constants), emulate
        self.inputs = {name: None if a is None else a.clone() for name, a in inputs.items()}
        if emulate:
            self.out = _clone(fn(**self.inputs, **self.constants))
            return
        # on CUDA `out` is the graph's memory, unwritten until the first replay (GraphReplayer replays at once)
        device = next(a for a in self.inputs.values() if a is not None).device
        with torch.cuda.device(device):  # the tensors' GPU, not the current one (cuda:N, a device_map)
            self.graph, self.out = _capture(fn, {**self.inputs, **self.constants})
        self.device = device

    def fits(self, inputs: dict, constants: dict) -> bool:
        if inputs.keys() != self.inputs.keys() or constants.keys() != self.constants.keys():
            return False
        for name, value in inputs.items():
            static = self.inputs[name]
            if (value is None) != (static is None):
                return False
            if value is not None and (value.shape != static.shape or value.dtype != static.dtype
                                      or value.device != static.device):
                return False
        return all(_same_constant(value, self.constants[name]) for name, value in constants.items())

    def __call__(self, inputs: dict):
        for name, value in inputs.items():
            if value is not None:
                self.inputs[name].copy_(value)
        if self.emulate:
            _copy_into(self.out, self.fn(**self.inputs, **self.constants))
        else:
            with torch.cuda.device(self.device):
                self.graph.replay()
        return self.out


def _capture(fn: Callable, arguments: dict):
    """(graph, outputs) of fn(**arguments) captured on a side stream of the current device. By hand, not with
    `torch.cuda.graph`: that context ends the capture before it restores the stream, so a function that fails
    mid-capture would leave the process on the capture stream; here the stream context is the outer one and
    the capture is always ended. Also, `torch.cuda.graph` captures on one stream made on whichever GPU was
    current at the first capture, where this uses a stream of the tensors' own GPU."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(**arguments)  # warm-up outside the graph (lazy library handles, workspaces); its errors are fn's own
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        try:
            out = fn(**arguments)
        except BaseException as error:  # an operation a graph cannot hold (a host read, a sync), or an interrupt
            try:
                graph.capture_end()  # always: a capture left open keeps the allocator routing to its pool
            except RuntimeError:
                pass  # the capture was already broken by `error`, which names the operation
            if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: not the function's fault
                raise
            # fn ran eagerly just before (the warm-up), so what fails only while capturing is the capture's
            raise GraphCaptureError(_first_line(error)) from error
        try:
            graph.capture_end()
        except RuntimeError as error:  # invalidated from outside the function (e.g. work on another stream)
            raise GraphCaptureError(_first_line(error)) from error
    torch.cuda.current_stream().wait_stream(stream)
    return graph, out


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


class GraphReplayer:
    """A method's captured graphs, by name (one per step function and branch it takes, e.g. the Domino chain at
    T = 0 and at T > 0). `enabled` False: every call runs `fn` eagerly. `what` names the option that turns it
    off, in the error line of a failed capture."""

    def __init__(self, enabled: bool, what: str, emulate: bool = False):
        self.enabled, self.what, self.emulate = enabled, what, emulate
        self.graphs: dict[str, StaticGraph] = {}
        self._captures_of: dict[str, int] = {}  # per name since `forget`: one captured again and again is a bug
        self._captures = 0

    def forget(self) -> None:
        """Drop every graph (they read tensors that are being replaced): each is captured anew on its next use,
        which the warning of repeated captures does not count against it (`captures` does)."""
        self.graphs.clear()
        self._captures_of.clear()

    @property
    def captures(self) -> int:
        """Graphs captured so far, every name together."""
        return self._captures

    def __call__(self, name: str, fn: Callable, inputs: dict, constants: dict):
        if not self.enabled:
            return fn(**inputs, **constants)
        graph = self.graphs.get(name)
        if graph is None or not graph.fits(inputs, constants):
            try:
                graph = self.graphs[name] = StaticGraph(fn, inputs, constants, self.emulate)
            except GraphCaptureError as error:
                # not a fallback to eager: after a broken capture PyTorch's allocator still counts a capture
                # under way (its pool is never released, empty_cache fails), so the process is not clean
                raise ConfigError(f"{self.what}=true: the CUDA graph of {name} could not be captured ({error}); "
                                  f"set {self.what}=false") from error
            self._captures_of[name] = self._captures_of.get(name, 0) + 1
            self._captures += 1
            if self._captures_of[name] == RECAPTURE_WARNING:
                log.warning("%s: CUDA graph captured %d times: its inputs' shapes or its weights change between "
                            "calls, so every capture costs a sync and buys nothing", name, RECAPTURE_WARNING)
        return graph(inputs)


def graphs_for(device: torch.device, enabled: bool, what: str, emulate: bool = False) -> GraphReplayer:
    """A method's replayer: graphs where `enabled` and `device` is a GPU (any device with `emulate`), else
    every call eager."""
    return GraphReplayer(enabled and (emulate or torch.device(device).type == "cuda"), what, emulate)


def _same_constant(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return a == b


def _clone(out):
    return tuple(_clone(o) for o in out) if isinstance(out, tuple) else out.clone()


def _copy_into(static, fresh) -> None:
    if isinstance(static, tuple):
        for s, f in zip(static, fresh):
            _copy_into(s, f)
    else:
        static.copy_(fresh)
