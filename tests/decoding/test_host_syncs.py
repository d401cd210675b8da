"""Host work in the hot loop: device->host reads per decoding step are counted (each is a host-device
sync on a GPU), no tensor is built on the host after the prefill, and the engine's cache and prefill paths do
no whole-cache or whole-vocabulary work."""

import traceback
from pathlib import Path

import pytest
import torch

from decoding.engine.loop import generate
from pipeline.zoo import METHODS

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    from pipeline.zoo import random_target

    return random_target("tiny"), tmp_path_factory.mktemp("zoo_syncs")


def reads_per_step(method, target, temperature, monkeypatch) -> float:
    counter = {"n": 0}
    for name in READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, **kwargs):
            counter["n"] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    real_getitem = torch.Tensor.__getitem__

    def getitem(self, index):  # x[t] with a 0-dim integer tensor t reads t on the host (in C++)
        items = index if isinstance(index, tuple) else (index,)
        counter["n"] += sum(isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point()
                            and i.dtype != torch.bool for i in items)
        return real_getitem(self, index)

    monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
    prompt = [7, 30, 31, 32, 33, 34] * 4
    state = generate(method, target, prompt, max_new_tokens=24, temperature=temperature, seed=1)
    monkeypatch.undo()
    return counter["n"] / state.stats.num_steps


# device->host reads allowed per step: drafting (one copy of the drafted tokens) + acceptance (one) +
# what the method reads back from the forward (PTD: one). Before: Domino ~32 per step (per-position
# int(argmax) and a host tensor per token), PTD one per forest node, VIA-SD 4-6 per position,
# sampling acceptance 2-3 per child.
BOUNDS = {"ar": 1, "pld": 1, "lookahead": 2, "self_draft": 2, "ptd": 2, "sd": 2, "spec_cascade": 2, "via_sd": 3,
          "via_sd_eagle3": 3, "sd_slim": 2, "eagle3": 2,
          "dflash": 2, "ddtree": 2, "caddtree": 2, "domino": 2}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_device_to_host_reads_per_step_are_bounded(name, temperature, zoo, monkeypatch):
    from pipeline.zoo import build_method

    target, folder = zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    method = build_method(name, target, folder)
    assert reads_per_step(method, target, temperature, monkeypatch) <= BOUNDS[name] + 0.5  # + the odd warm-up read


def test_dominotree_reads_once_per_depth_not_per_node(zoo, monkeypatch):
    """The level builder reads the host once per depth it expands (the live lane count), plus the
    tree once: per step at most the deepest tree's depth + 1, plus drafting and acceptance."""
    from pipeline.zoo import build_method

    target, folder = zoo
    method = build_method("dominotree", target, folder)
    depths = []
    real = method.propose

    def propose(state):
        proposal = real(state)
        depths.append(max(proposal.tree.depths))
        return proposal

    method.propose = propose
    reads = reads_per_step(method, target, 0.0, monkeypatch)
    assert depths and reads <= max(depths) + 1 + 3
    assert reads < method.config.num_nodes  # the node-by-node builder read once per expanded node


def test_prefill_computes_logits_for_the_last_row_only_even_with_hidden_taps(tiny_llama):
    out = tiny_llama.prefill(list(range(10, 30)), hidden_layers=(0, 2))
    assert out.logits.shape == (1, tiny_llama.config.vocab_size)
    assert out.hidden[0].shape[0] == 20 and out.hidden[2].shape[0] == 20


def test_keep_rows_compacts_in_place_without_copying_a_layer(tiny_llama):
    from decoding.engine.tree import TokenTree

    target = tiny_llama
    target.prefill(list(range(10, 40)))
    target.forward_tree(TokenTree.from_sequences(40, [[41, 42], [43, 44, 45]]))
    before = [layer.keys.data_ptr() for layer in target.cache.layers]
    target.keep_rows(30, [0, 3, 4, 5])  # root + the second branch: rows move down, in place
    assert [layer.keys.data_ptr() for layer in target.cache.layers] == before
    assert target.cache_len == 34


def test_the_ptd_pool_walks_a_trie_only_to_evict(monkeypatch):
    from decoding.drafting.ptd_tree import TriePool

    walks = []
    real = TriePool.branches
    monkeypatch.setattr(TriePool, "branches", lambda self, root: walks.append(root) or real(self, root))
    pool = TriePool(cap=4)
    for step, tok in enumerate((1, 2, 3)):
        pool.merge(0, {tok: {}}, step)
    assert walks == []  # three branches under a cap of four: no walk
    with pool.batch():
        for step, tok in enumerate((4, 5, 6), start=3):
            pool.merge(0, {tok: {}}, step)
    assert walks == [0] and pool.leaves[0] == 4  # one eviction walk for the whole step


# Tensor factories that build on the CPU unless given a device: in the hot loop on a GPU each one is a
# host tensor, then a blocking copy or a device-mismatch error. Host data goes to the device through
# `to_device` (decoding/engine/transfer.py: pinned memory, non-blocking), the one place allowed to build one.
FACTORIES = (torch.tensor, torch.as_tensor, torch.from_numpy, torch.zeros, torch.ones, torch.full, torch.empty,
             torch.arange, torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye, torch.linspace,
             torch.scalar_tensor)
# Operations whose output size depends on the data: on a GPU the host waits for the device to learn the size
# (a hidden sync that no .item() shows). torch.where counts in its one-argument form only, repeat_interleave
# with tensor repeats and no output_size only, indexing with a boolean tensor always.
DATA_SHAPED = (torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere, torch.masked_select,
               torch.Tensor.masked_select, torch.unique, torch.Tensor.unique, torch.unique_consecutive,
               torch.Tensor.unique_consecutive, torch.bincount, torch.Tensor.bincount)


def tensors_in(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from tensors_in(value)


def promotes_half_precision(func, args, kwargs) -> bool:
    """A bf16/fp16 tensor meets a float32 one (0-dim ones aside: they do not promote): the result is float32,
    a silent upcast of the model's activations (twice the memory and bandwidth on a GPU). float64 meeting
    float32 is left out: the engine sums probabilities in float64 on purpose (sampling.py, to_host)."""
    if func in (torch.Tensor.copy_, torch.Tensor.__setitem__):  # writes cast to the destination's dtype
        return False
    dtypes = {t.dtype for t in tensors_in((*args, *kwargs.values())) if t.is_floating_point() and t.dim() > 0}
    return torch.float32 in dtypes and bool(dtypes & {torch.bfloat16, torch.float16})


def writes_a_host_scalar(func, args, kwargs) -> bool:
    """`x[i] = 0.0` (or `x[i, j] = v`) with a Python number on a CUDA tensor: PyTorch makes the number a CPU
    tensor and, the destination being one element of the same (0-dim) shape, copies it (`copy_`, from pageable
    memory: a blocking copy that waits for the stream, and an error inside a CUDA graph capture); `x[:1] = 0.0`
    or a wider destination fills instead (`fill_`, no copy)."""
    if func is not torch.Tensor.__setitem__ or not isinstance(args[2], (int, float, bool)):
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return len(index) == args[0].dim() and all(isinstance(i, int) for i in index)


def shape_depends_on_data(func, args, kwargs) -> bool:
    if func in DATA_SHAPED:
        return True
    if func is torch.where:
        return len(args) + len(kwargs) == 1
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
        return len(args) > 1 and isinstance(args[1], torch.Tensor) and "output_size" not in kwargs
    if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return False


class HostWorkFinder(torch.overrides.TorchFunctionMode):
    """Records, once `on`, each factory call made without a device (`host tensor`), each operation whose
    output shape depends on the data (`data-shaped`), each one where half precision meets float32
    (`upcast`) and each one-element write of a Python number (`host scalar`), at the innermost frame under the checkout
    (`kind function file:line`; a call inside transformers is charged to our line that ran the model).
    `to_device` may build host tensors."""

    def __init__(self):
        super().__init__()
        self.on, self.sites = False, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.on:
            keeps_device = func in (torch.tensor, torch.as_tensor) and args and isinstance(args[0], torch.Tensor)
            if func in FACTORIES and kwargs.get("device") is None and not keeps_device:
                self.record("host tensor", func)
            elif shape_depends_on_data(func, args, kwargs):
                self.record("data-shaped", func)
            elif promotes_half_precision(func, args, kwargs):
                self.record("upcast", func)
            elif writes_a_host_scalar(func, args, kwargs):
                self.record("host scalar", func)
        return func(*args, **kwargs)

    def record(self, kind, func):
        site = next((frame for frame in reversed(traceback.extract_stack()[:-2])
                     if frame.filename.startswith(str(ROOT)) and "site-packages" not in frame.filename), None)
        allowed = kind == "host tensor" and site is not None and site.name == "to_device" \
            and site.filename.endswith("transfer.py")
        if site is None or allowed:
            return
        self.sites.append(f"{kind} {func.__name__} {Path(site.filename).relative_to(ROOT)}:{site.lineno}")


ROOT = Path(__file__).resolve().parents[2]


def host_work_in_the_loop(method, target, temperature) -> list[str]:
    finder = HostWorkFinder()
    with finder:  # from the first step on: the prefill and setup may build on the host
        generate(method, target, [7, 30, 31, 32, 33, 34] * 4, max_new_tokens=24, temperature=temperature, seed=1,
                 on_step=lambda state: setattr(finder, "on", True))
    return finder.sites


@pytest.fixture(scope="module")
def bf16_zoo(tmp_path_factory):
    from pipeline.zoo import random_target

    return random_target("tiny", dtype=torch.bfloat16), tmp_path_factory.mktemp("zoo_syncs_bf16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", [m for m in METHODS if m != "dominotree_reference"])
def test_the_decoding_loop_does_no_host_work_a_gpu_would_pay_for(name, temperature, dtype, zoo, bf16_zoo,
                                                                 monkeypatch):
    """The guide's rule, checked on the CPU where a GPU would crash, stall or spend twice the bandwidth:
    after the prefill, no factory call of ours runs without a device, nothing waits on the data for a shape,
    no element is written from a Python number (on CUDA a blocking copy, and an error inside a CUDA graph:
    DominoTree's whole-tree graph failed to capture so until 2026-12-06), and a bf16 run's tensors never meet
    float32 ones (the reference DominoTree builder is a test oracle, not a hot path)."""
    from pipeline.zoo import build_method

    target, folder = zoo if dtype == "float32" else bf16_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    method = build_method(name, target, folder)
    assert host_work_in_the_loop(method, target, temperature) == []


def test_the_host_work_finder_names_each_planted_line(zoo):
    from pipeline.zoo import build_method

    target, folder = zoo
    method = build_method("ar", target, folder)
    real = method.propose

    def propose(state):
        ids = torch.arange(4, device=target.device)  # a device given: not reported
        torch.arange(3)  # a host tensor
        ids[ids > 1]  # a boolean mask: data-shaped
        torch.nonzero(ids)  # data-shaped
        torch.where(ids > 1, ids, 0)  # the three-argument where is not
        ids.repeat_interleave(2)  # an int repeat is not
        halves = torch.ones(2, dtype=torch.bfloat16, device=target.device)
        halves + torch.ones(2, device=target.device)  # bf16 meets float32: an upcast
        halves + torch.ones((), device=target.device)  # a 0-dim float32 does not promote
        ids[0] = 5  # one element from a Python number: a host scalar copied
        ids[:1] = 5  # a slice is filled: not reported
        ids[1].fill_(5)  # nor is fill_
        return real(state)

    method.propose = propose
    sites = host_work_in_the_loop(method, target, 0.0)
    here = "tests/decoding/test_host_syncs.py:"
    kinds = {site.split(here)[0] for site in sites}
    assert kinds == {"host tensor arange ", "data-shaped __getitem__ ", "data-shaped nonzero ", "upcast add ",
                     "host scalar __setitem__ "}
    assert all(here in site for site in sites)  # each at its own line, not at the engine's call of propose


@pytest.fixture(scope="module")
def graphed_zoo(zoo):
    """The tiny target as `model.cuda_graph=true` runs it on a GPU, its graphs emulated (replayed eagerly through
    static buffers, decoding/engine/cuda_graph.py)."""
    from decoding.engine.cuda_graph import GraphReplayer
    from decoding.engine.target import TargetModel

    target, folder = zoo
    return TargetModel(target.model, graphs=GraphReplayer(True, "model.cuda_graph", emulate=True)), folder


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", [m for m in METHODS if m != "dominotree_reference"])
def test_the_code_cuda_graphs_capture_does_no_host_work_either(name, temperature, graphed_zoo, monkeypatch):
    """The paths only a GPU takes: the target's static forward and the Domino chain's and DominoTree's graphs,
    here emulated, so what a capture would record runs under the finder (host work there fails the capture)."""
    from decoding.engine import cuda_graph
    from pipeline.zoo import build_method

    target, folder = graphed_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    monkeypatch.setattr(cuda_graph, "graphs_for", lambda device, enabled, what, emulate=False:
                        cuda_graph.GraphReplayer(enabled, what, emulate=True))
    method = build_method(name, target, folder)
    if name in ("domino", "dominotree"):
        assert method.graphs.enabled
    assert host_work_in_the_loop(method, target, temperature) == []
    assert target.graphs.captures > 0


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
    from pipeline.zoo import build_method

    target, folder = bf16_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    name, overrides = VARIANTS[variant]
    method = build_method(name, target, folder, **overrides)
    assert host_work_in_the_loop(method, target, temperature) == []
