"""decoding/engine/cuda_graph.py on the CPU: the buffer bookkeeping of a graph replay, emulated (a CUDA graph
itself only runs on a GPU: benchmarks/gpu_smoke.py checks the capture there)."""

import contextlib
import logging

import pytest
import torch

from decoding.engine import cuda_graph
from decoding.engine.cuda_graph import GraphCaptureError, GraphReplayer, StaticGraph
from pipeline.errors import ConfigError


def scaled_sum(x, bias, weight, times):
    return (x @ weight) * times + (0 if bias is None else bias), x.sum()


def test_an_emulated_replay_computes_from_the_new_inputs_into_the_same_output_buffers():
    weight = torch.randn(3, 2)
    x1, x2 = torch.randn(4, 3), torch.randn(4, 3)
    graph = StaticGraph(scaled_sum, {"x": x1, "bias": None}, {"weight": weight, "times": 2}, emulate=True)
    first = graph({"x": x1, "bias": None})
    kept = first[0].clone()
    torch.testing.assert_close(kept, (x1 @ weight) * 2)
    second = graph({"x": x2, "bias": None})
    assert second[0] is first[0] and second[1] is first[1]  # the graph's own buffers, overwritten
    torch.testing.assert_close(first[0], (x2 @ weight) * 2)
    torch.testing.assert_close(second[1], x2.sum())
    assert not torch.equal(kept, first[0])  # what a caller did not keep is gone


def test_a_graph_fits_the_same_shapes_none_pattern_and_constants_only():
    weight = torch.randn(3, 2)
    graph = StaticGraph(scaled_sum, {"x": torch.randn(4, 3), "bias": None}, {"weight": weight, "times": 2},
                        emulate=True)
    assert graph.fits({"x": torch.randn(4, 3), "bias": None}, {"weight": weight, "times": 2})
    assert not graph.fits({"x": torch.randn(5, 3), "bias": None}, {"weight": weight, "times": 2})
    assert not graph.fits({"x": torch.randn(4, 3, dtype=torch.float64), "bias": None}, {"weight": weight, "times": 2})
    assert not graph.fits({"x": torch.randn(4, 3), "bias": torch.zeros(2)}, {"weight": weight, "times": 2})
    assert not graph.fits({"x": torch.randn(4, 3), "bias": None}, {"weight": weight, "times": 3})
    # the same values in another tensor: a real graph would still read the old memory
    assert not graph.fits({"x": torch.randn(4, 3), "bias": None}, {"weight": weight.clone(), "times": 2})
    assert not graph.fits({"x": torch.randn(4, 3)}, {"weight": weight, "times": 2})


def test_the_replayer_captures_once_per_name_and_shape_and_again_when_a_call_does_not_fit():
    weight = torch.randn(3, 2)
    replayer = GraphReplayer(True, "method.cuda_graph", emulate=True)
    for rows in (4, 4, 4, 6, 6, 4):
        x = torch.randn(rows, 3)
        out, _ = replayer("step", scaled_sum, {"x": x, "bias": None}, {"weight": weight, "times": 1})
        torch.testing.assert_close(out, x @ weight)
    assert replayer.captures == 3


def test_a_name_captured_again_and_again_gets_one_warning(caplog):
    replayer = GraphReplayer(True, "method.cuda_graph", emulate=True)
    weight = torch.randn(3, 2)
    with caplog.at_level(logging.WARNING):
        for rows in range(1, 2 * cuda_graph.RECAPTURE_WARNING):  # a new shape every call: a capture every call
            replayer("tree", scaled_sum, {"x": torch.randn(rows, 3), "bias": None}, {"weight": weight, "times": 1})
    lines = [r.getMessage() for r in caplog.records if r.name == cuda_graph.__name__]
    assert len(lines) == 1 and lines[0].startswith(f"tree: CUDA graph captured {cuda_graph.RECAPTURE_WARNING} times")


def test_a_disabled_replayer_runs_eagerly_and_returns_fresh_tensors():
    replayer = GraphReplayer(False, "method.cuda_graph")
    weight = torch.randn(3, 2)
    a = replayer("step", scaled_sum, {"x": torch.randn(4, 3), "bias": None}, {"weight": weight, "times": 1})
    b = replayer("step", scaled_sum, {"x": torch.randn(4, 3), "bias": None}, {"weight": weight, "times": 1})
    assert a[0] is not b[0] and replayer.captures == 0


def test_a_failed_capture_is_one_error_line_naming_the_operation_and_the_option(monkeypatch):
    """Not a fallback to eager: after a broken capture PyTorch's allocator still counts a capture under way."""
    def refuse(*args, **kwargs):
        raise GraphCaptureError("RuntimeError: operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graph, "StaticGraph", refuse)
    replayer = GraphReplayer(True, "method.cuda_graph")
    with pytest.raises(ConfigError) as failed:
        replayer("chain:greedy", scaled_sum, {"x": torch.randn(4, 3), "bias": None},
                 {"weight": torch.randn(3, 2), "times": 1})
    assert str(failed.value) == ("method.cuda_graph=true: the CUDA graph of chain:greedy could not be captured "
                                 "(RuntimeError: operation not permitted when stream is capturing); "
                                 "set method.cuda_graph=false")


def test_graphs_are_used_on_a_gpu_only_and_where_enabled():
    assert not cuda_graph.graphs_for(torch.device("cpu"), True, "method.cuda_graph").enabled
    assert not cuda_graph.graphs_for(torch.device("cuda"), False, "method.cuda_graph").enabled
    assert cuda_graph.graphs_for(torch.device("cuda"), True, "method.cuda_graph").enabled  # no GPU needed to ask
    emulated = cuda_graph.graphs_for(torch.device("cpu"), True, "model.cuda_graph", emulate=True)  # the CPU tests'
    assert emulated.enabled and emulated.emulate
    assert not cuda_graph.graphs_for(torch.device("cpu"), False, "model.cuda_graph", emulate=True).enabled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_a_host_read_inside_the_function_is_a_capture_error_and_the_stream_is_restored():
    def reads_the_host(x):
        return x * float(x.sum())

    stream = torch.cuda.current_stream()
    with pytest.raises(GraphCaptureError):
        StaticGraph(reads_the_host, {"x": torch.randn(4, device="cuda")}, {})
    assert torch.cuda.current_stream() == stream


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_a_captured_graph_replays_on_the_gpu():
    weight = torch.randn(3, 2, device="cuda")
    replayer = GraphReplayer(True, "method.cuda_graph")
    for _ in range(3):
        x = torch.randn(4, 3, device="cuda")
        out, total = replayer("step", scaled_sum, {"x": x, "bias": None}, {"weight": weight, "times": 2})
        torch.testing.assert_close(out, (x @ weight) * 2)
        torch.testing.assert_close(total, x.sum())
    assert replayer.captures == 1


class FakeCapture:
    """Stands in for torch.cuda's stream and graph objects, so the capture's error handling runs on a CPU."""

    def __init__(self):
        self.began = self.ended = 0

    def install(self, monkeypatch) -> None:
        fake = self

        class Graph:
            def capture_begin(self):
                fake.began += 1

            def capture_end(self):
                fake.ended += 1

        class Stream:
            def wait_stream(self, other):
                pass

            def synchronize(self):
                pass

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())


@pytest.mark.parametrize("raised, expected", [(RuntimeError("operation not permitted when stream is capturing"),
                                               GraphCaptureError),
                                              (TypeError("only while capturing"), GraphCaptureError),
                                              (KeyboardInterrupt(), KeyboardInterrupt)])
def test_a_function_failing_inside_the_capture_always_ends_it(monkeypatch, raised, expected):
    """Whatever the function raises while capturing (its eager warm-up passed), the capture is ended before the
    error goes up: one left open keeps PyTorch's allocator routing the stream's allocations to the graph's pool.
    An interrupt goes up as itself, not as a capture error."""
    capture = FakeCapture()
    capture.install(monkeypatch)
    calls = []

    def fails_the_second_time(x):
        calls.append(1)
        if len(calls) == 2:  # the first call is the warm-up outside the graph
            raise raised
        return x + 1

    with pytest.raises(expected):
        cuda_graph._capture(fails_the_second_time, {"x": torch.zeros(2)})
    assert (capture.began, capture.ended) == (1, 1)
