"""What a GPU would pay for in the decoding loop and a CPU hides, found on the CPU: every method runs under a
`TorchFunctionMode` (`HostWorkFinder`) that reports, with the line of ours that did it,
- `host tensor`: a tensor factory called without a device (on a GPU: a host tensor, then a blocking copy or a
  device-mismatch error);
- `host data`: `torch.tensor`/`as_tensor`/`asarray`/`new_tensor` of Python or numpy data, whatever the device
  (a copy from pageable memory, which blocks); host data goes to the device through `to_device` (pinned,
  non-blocking), the one place allowed to do either;
- `data-shaped`: an operation whose output size depends on the data (a hidden sync no `.item()` shows);
- `upcast`: a half-precision tensor meeting a wider float one (a silent upcast of the activations);
- `host scalar`: `x[i] = <number>` for one element (on CUDA PyTorch makes the number a CPU tensor and copies it:
  a blocking copy, and an error inside a CUDA graph capture; `x[:1] = v` and `fill_` fill instead);
- `host read` inside a function a CUDA graph captures (`.item()`, `int(t)`, `.tolist()`, ...: the capture fails).
The read count per step outside graphs is test_host_syncs.py's."""

import numbers
import os
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

from decoding.engine import cuda_graph
from decoding.engine.loop import generate
from pipeline.step_probes import host_reads_in
from pipeline.zoo import METHODS, build_method, random_target

ROOT = Path(__file__).resolve().parents[2]
FACTORIES = (torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy, torch.zeros, torch.ones, torch.full,
             torch.empty, torch.empty_strided, torch.arange, torch.rand, torch.randn, torch.randint, torch.randperm,
             torch.eye, torch.linspace, torch.logspace, torch.scalar_tensor, torch.tril_indices, torch.triu_indices)
FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)
# torch.where counts in its one-argument form only, repeat_interleave without tensor repeats' output_size only
DATA_SHAPED = (torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere, torch.masked_select,
               torch.Tensor.masked_select, torch.unique, torch.Tensor.unique, torch.unique_consecutive,
               torch.Tensor.unique_consecutive, torch.bincount, torch.Tensor.bincount)
HALF = (torch.bfloat16, torch.float16)


def tensors_in(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from tensors_in(value)


def builds_on_the_host(func, args, kwargs) -> bool:
    data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
    keeps_device = func in FROM_DATA and isinstance(data, torch.Tensor)
    return func in FACTORIES and kwargs.get("device") is None and not keeps_device


def copies_host_data(func, args, kwargs) -> bool:
    if func not in FROM_DATA:
        return False
    data = args[1] if func is torch.Tensor.new_tensor else (args[0] if args else kwargs.get("data", kwargs.get("obj")))
    return not isinstance(data, torch.Tensor)


def shape_depends_on_data(func, args, kwargs) -> bool:
    if func in DATA_SHAPED:
        return True
    if func is torch.where:
        return len(args) + len(kwargs) == 1
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        one_argument = func is torch.repeat_interleave and repeats is None  # repeat_interleave(t): t are repeats
        return (one_argument or isinstance(repeats, torch.Tensor)) and "output_size" not in kwargs
    if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return False


def promotes_half_precision(func, args, kwargs) -> bool:
    """0-dim tensors do not promote; writes (`copy_`, `x[...] = t`, in-place ops, `out=`) keep the destination's
    dtype."""
    name = getattr(func, "__name__", "")
    writes = func in (torch.Tensor.copy_, torch.Tensor.__setitem__) or "out" in kwargs
    if writes or (name.endswith("_") and not name.startswith("__")):
        return False
    dtypes = {t.dtype for t in tensors_in((*args, *kwargs.values())) if t.is_floating_point() and t.dim() > 0}
    return bool(dtypes & set(HALF)) and bool(dtypes - set(HALF))


def writes_a_host_scalar(func, args, kwargs) -> bool:
    """One element (ints and `...` only, as many ints as dimensions) set from a Python or numpy number: the
    0-dim destination has the value's shape, so PyTorch copies (`copy_`) where a wider one is filled."""
    if func is not torch.Tensor.__setitem__ or not isinstance(args[2], numbers.Number):
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    ints = [i for i in index if isinstance(i, numbers.Integral) and not isinstance(i, (bool, np.bool_))]
    return len(ints) + index.count(Ellipsis) == len(index) and len(ints) == args[0].dim()


class HostWorkFinder(torch.overrides.TorchFunctionMode):
    """Records, once `on`, the module docstring's kinds as `kind function file:line` at the innermost frame under
    the checkout (a call inside transformers is charged to our line that ran the model). `in_graph` > 0 while a
    function a CUDA graph captures runs (emulated)."""

    def __init__(self):
        super().__init__()
        self.on, self.in_graph, self.sites, self.graphs_run = False, 0, [], set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.on:
            for kind, found in (("host tensor", builds_on_the_host(func, args, kwargs)),
                                ("host data", copies_host_data(func, args, kwargs)),
                                ("data-shaped", shape_depends_on_data(func, args, kwargs)),
                                ("upcast", promotes_half_precision(func, args, kwargs)),
                                ("host scalar", writes_a_host_scalar(func, args, kwargs)),
                                ("host read", self.in_graph > 0 and host_reads_in(func, args))):
                if found:
                    self.record(kind, func)
        return func(*args, **kwargs)

    def record(self, kind, func):
        frames = [(os.path.realpath(f.filename), f) for f in reversed(traceback.extract_stack()[:-2])]
        path, site = next(((p, f) for p, f in frames if p.startswith(str(ROOT)) and "site-packages" not in p),
                          (None, None))
        if site is None or (kind in ("host tensor", "host data") and site.name == "to_device"
                            and path.endswith("transfer.py")):
            return
        self.sites.append(f"{kind} {func.__name__} {Path(path).relative_to(ROOT)}:{site.lineno}")

    def watch_graphs(self, monkeypatch) -> None:
        """Count an (emulated) CUDA graph's capture and replays as inside it, and note its function's name. The
        graph objects outlive a test (a target keeps its graphs), so the class is patched, not the functions."""
        finder, init, call = self, cuda_graph.StaticGraph.__init__, cuda_graph.StaticGraph.__call__

        def inside(fn, run):
            if finder.on:  # a graph of the steps watched, not only of the first
                finder.graphs_run.add(fn.__name__)
            finder.in_graph += 1
            try:
                return run()
            finally:
                finder.in_graph -= 1

        monkeypatch.setattr(cuda_graph.StaticGraph, "__init__", lambda graph, fn, inputs, constants, emulate=False:
                            inside(fn, lambda: init(graph, fn, inputs, constants, emulate)))
        monkeypatch.setattr(cuda_graph.StaticGraph, "__call__", lambda graph, inputs:
                            inside(graph.fn, lambda: call(graph, inputs)))


def host_work_in_the_loop(method, target, temperature, monkeypatch=None) -> HostWorkFinder:
    """The finder after a generation, on from the second decoding step on (the first may build what later steps
    reuse). `monkeypatch`: also watch the (emulated) CUDA graphs."""
    finder = HostWorkFinder()
    if monkeypatch is not None:
        finder.watch_graphs(monkeypatch)
    with finder:
        generate(method, target, [7, 30, 31, 32, 33, 34] * 4, max_new_tokens=24, temperature=temperature, seed=1,
                 on_step=lambda state: setattr(finder, "on", True))
    return finder


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return random_target("tiny"), tmp_path_factory.mktemp("zoo_host_work")


@pytest.fixture(scope="module")
def bf16_zoo(tmp_path_factory):
    return random_target("tiny", dtype=torch.bfloat16), tmp_path_factory.mktemp("zoo_host_work_bf16")


@pytest.fixture(scope="module")
def graphed_bf16_zoo(bf16_zoo):
    """The bf16 target as `model.cuda_graph=true` runs it on a GPU, its graphs emulated (replayed eagerly through
    static buffers, decoding/engine/cuda_graph.py)."""
    from decoding.engine.target import TargetModel

    target, folder = bf16_zoo
    return TargetModel(target.model, graphs=cuda_graph.GraphReplayer(True, "model.cuda_graph", emulate=True)), folder


HOT_METHODS = [m for m in METHODS if m != "dominotree_reference"]  # the reference builder is a test oracle


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", HOT_METHODS)
def test_the_decoding_loop_does_no_host_work_a_gpu_would_pay_for(name, temperature, dtype, zoo, bf16_zoo,
                                                                 monkeypatch):
    target, folder = zoo if dtype == "float32" else bf16_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    assert host_work_in_the_loop(build_method(name, target, folder), target, temperature).sites == []


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", HOT_METHODS)
def test_the_code_cuda_graphs_capture_does_no_host_work_either(name, temperature, graphed_bf16_zoo, monkeypatch):
    """The paths only a GPU takes: the target's static forward and the Domino chain's, DominoTree's and EAGLE-3's
    graphs, emulated, with host reads inside them reported too (they make a capture fail)."""
    target, folder = graphed_bf16_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what, emulate=False:
                        cuda_graph.GraphReplayer(enabled, what, emulate=True))
    finder = host_work_in_the_loop(build_method(name, target, folder), target, temperature, monkeypatch)
    assert finder.sites == []
    # what ran from graphs: the target's static forward, and the Domino chain's, DominoTree's and EAGLE-3's own
    own = {"domino": {"chain_picks"}, "dominotree": {"whole_tree"}, "eagle3": {"expand_tree"},
           "via_sd_eagle3": {"draft_chain"}}.get(name, set())
    assert finder.graphs_run == {"_static_pass", *own}


# the settings the experiments and docs use besides the defaults (conf/method/*.yaml, conf/experiment/*.yaml)
VARIANTS = {
    "dflash sample_draft verify=rejection": ("dflash", dict(sample_draft=True, verify="rejection")),
    "domino verify=rejection": ("domino", dict(verify="rejection")),
    "domino_harness": ("domino", dict(candidate_pool=0, sample_draft=False)),
    "dominotree scoring=marginal": ("dominotree", dict(scoring="marginal")),
    "dominotree budget=cond_adaptive": ("dominotree", dict(budget="cond_adaptive")),
    "eagle3 tree=false": ("eagle3", dict(tree=False)),
    "via_sd zones=gated": ("via_sd", dict(zones="gated")),
    "via_sd middle=random": ("via_sd", dict(middle="random")),
    "spec_cascade rule=chow": ("spec_cascade", dict(rule="chow")),
    "pld_reference": ("pld", dict(match="reference")),
    "lookahead pool_from_prompt": ("lookahead", dict(pool_from_prompt=True)),
    "ptd graft=false seed_mode=stochastic": ("ptd", dict(graft=False, seed_mode="stochastic")),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_methods_other_settings_do_no_host_work_either(variant, temperature, bf16_zoo, monkeypatch):
    """On the bf16 model, which every kind of the finder covers (the upcast needs half precision)."""
    target, folder = bf16_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    name, overrides = VARIANTS[variant]
    method = build_method(name, target, folder, **overrides)
    assert host_work_in_the_loop(method, target, temperature).sites == []


def planted_lines(marker: str) -> dict[int, str]:
    """{line: what the finder must report there ("" for nothing)} of this file's lines tagged `# <marker>: ...`."""
    lines = Path(__file__).read_text().splitlines()
    tag = f"# {marker}:"
    return {n: line.split(tag, 1)[1].strip() for n, line in enumerate(lines, 1) if tag in line}


def test_the_finder_reports_each_planted_line_and_only_those(zoo, monkeypatch):
    target, folder = zoo
    method = build_method("ar", target, folder)
    real = method.propose
    device = target.device

    def propose(state):
        ids = torch.arange(4, device=device)  # planted: 
        halves = torch.ones(2, dtype=torch.bfloat16, device=device)  # planted: 
        torch.arange(3)  # planted: host tensor arange
        torch.tensor([1, 2], device=device)  # planted: host data tensor
        ids.new_tensor([1, 2])  # planted: host data new_tensor
        ids[ids > 1]  # planted: data-shaped __getitem__
        torch.nonzero(ids)  # planted: data-shaped nonzero
        torch.repeat_interleave(ids[:2])  # planted: data-shaped repeat_interleave
        torch.where(ids > 1, ids, 0)  # planted: 
        ids.repeat_interleave(2)  # planted: 
        halves + torch.ones(2, device=device)  # planted: upcast add
        halves + torch.ones(2, dtype=torch.float64, device=device)  # planted: upcast add
        halves + torch.ones((), device=device)  # planted: 
        halves.add_(torch.ones(2, device=device))  # planted: 
        ids[0] = 5  # planted: host scalar __setitem__
        ids[np.int64(1)] = 5  # planted: host scalar __setitem__
        ids[True] = 5  # planted: 
        ids[:1] = 5  # planted: 
        ids[1].fill_(5)  # planted: 
        int(ids[0])  # planted: 
        return real(state)

    method.propose = propose
    sites = host_work_in_the_loop(method, target, 0.0).sites
    here = "tests/decoding/test_host_work.py:"
    found = {(int(site.rsplit(":", 1)[1]), site.split(f" {here}")[0]) for site in sites}
    assert all(here in site for site in sites)
    assert found == {(n, what) for n, what in planted_lines("planted").items() if what}


def test_the_finder_reports_a_host_read_inside_a_captured_function_only(monkeypatch):
    def graphed(x):
        x.sum().item()  # in graph: host read item
        return x * 2

    finder = HostWorkFinder()
    finder.watch_graphs(monkeypatch)
    replayer = cuda_graph.GraphReplayer(True, "method.cuda_graph", emulate=True)
    x = torch.ones(3)
    with finder:
        finder.on = True
        replayer("double", graphed, {"x": x}, {})  # captures (runs it once), then replays (runs it again)
        x.sum().item()  # outside: test_host_syncs.py counts these
    lines = planted_lines("in graph")
    assert [(int(s.rsplit(":", 1)[1]), s.split(" tests/")[0]) for s in finder.sites] == [*lines.items()] * 2


def test_the_gpus_own_sync_count_counts_each_warned_sync_per_step_after_the_first(zoo, monkeypatch):
    """pipeline.step_probes.device_syncs (gpu_smoke's section 5) on the CPU: the CUDA debug mode is faked, and the
    method warns as that mode does at a synchronizing operation, once per step, from one line."""
    import warnings

    from pipeline.step_probes import device_syncs

    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    target, folder = zoo
    method = build_method("ar", target, folder)
    real = method.propose

    def propose(state):
        warnings.warn("called a synchronizing CUDA operation")  # sync: one per step
        warnings.warn("something else")  # not a sync
        return real(state)

    method.propose = propose
    counted = device_syncs(method, target, [7, 30, 31, 32], max_new_tokens=9)
    line = next(iter(planted_lines("sync")))
    assert counted == {"syncs_per_step": 1.0, "steps": 8, "sites": {f"decoding/test_host_work.py:{line}": 1.0}}
    assert modes == ["warn", 0]  # switched on for the run, then back
