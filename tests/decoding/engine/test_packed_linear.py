"""Linear layers packed for oneDNN (decoding/engine/packed_linear.py, `model.prepack_linear`): bf16 outputs
bit-identical to `F.linear`'s, the original parameters kept, autograd and autocast left to `F.linear`, and every
module a method holds packed with the target."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decoding.engine.loop import generate
from decoding.engine.packed_linear import PackedLinear, pack_held_linears, pack_linears, packing_available
from pipeline.errors import ConfigError
from pipeline.models import cpu_has_native_bf16, pack_for_decoding
from pipeline.zoo import build_method, mixed_prompts, random_target

pytestmark = pytest.mark.skipif(not packing_available(torch.float32), reason="this PyTorch build has no oneDNN")
native_bf16 = pytest.mark.skipif(not (cpu_has_native_bf16() and packing_available(torch.bfloat16)),
                                 reason="bf16 packing is auto only on a CPU with native bf16 (avx512_bf16 / AMX)")


def linear(out_features: int, in_features: int, dtype, bias: bool = False) -> nn.Linear:
    torch.manual_seed(out_features + in_features)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype)


@native_bf16
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_packed_outputs_equal_f_linear_bit_for_bit(bias):
    """The packed call runs oneDNN's bf16 kernel as F.linear does, without the per-call reorder: same bits, for
    the row counts a decoding step has and 3D inputs (a transformers layer's [batch, rows, hidden])."""
    for out_features, in_features in [(1536, 576), (576, 1536), (4099, 576), (192, 576)]:
        plain = linear(out_features, in_features, torch.bfloat16, bias)
        packed = PackedLinear(plain)
        for rows in (1, 3, 16, 65):
            x = torch.randn(1, rows, in_features, dtype=torch.bfloat16)
            with torch.inference_mode():
                assert torch.equal(packed(x), F.linear(x, plain.weight, plain.bias)), (out_features, rows)


def test_fp32_packed_outputs_are_oneDNN_rounding_of_the_same_product():
    plain = linear(1536, 576, torch.float32, bias=True)
    packed = PackedLinear(plain)
    x = torch.randn(2, 5, 576)
    with torch.inference_mode():
        out = packed(x)
    assert out.shape == (2, 5, 1536)
    torch.testing.assert_close(out, F.linear(x, plain.weight, plain.bias), rtol=1e-5, atol=1e-5)


def test_inference_calls_run_the_packed_kernel_and_others_f_linear():
    packed = PackedLinear(linear(64, 32, torch.float32))
    x = torch.randn(3, 32)

    def kernels(grad: bool) -> set[str]:
        with torch.profiler.profile() as prof, torch.set_grad_enabled(grad):
            packed(x)
        return {event.name for event in prof.events()}

    assert "mkldnn::_linear_pointwise" in kernels(grad=False)
    assert "mkldnn::_linear_pointwise" not in kernels(grad=True)


def test_autograd_and_autocast_run_f_linear_on_the_original_weight():
    plain = linear(64, 32, torch.float32, bias=True)
    reference = copy.deepcopy(plain)
    packed = PackedLinear(plain)
    x = torch.randn(3, 32)
    packed(x).pow(2).sum().backward()  # grad enabled: F.linear, so the weight gets its gradient
    reference(x).pow(2).sum().backward()
    torch.testing.assert_close(packed.weight.grad, reference.weight.grad)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's cast is kept
        assert packed(x).dtype == torch.bfloat16


def test_a_copy_or_a_pickle_packs_its_own_weight():
    import pickle

    packed = PackedLinear(linear(64, 32, torch.float32, bias=True))
    x = torch.randn(3, 32)
    for copied in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed))):
        assert copied.weight is not packed.weight and torch.equal(copied.weight, packed.weight)
        with torch.inference_mode():
            assert torch.equal(copied(x), packed(x))


def test_pack_linears_swaps_each_linear_once_and_keeps_parameters_and_ties():
    target = random_target("tiny", dtype=torch.float32)
    model = target.model
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    head.weight = embed.weight  # tied, as SmolLM2's are
    linears = sum(type(m) is nn.Linear for m in model.modules())
    state = {k: v.clone() for k, v in model.state_dict().items()}

    class OwnForward(nn.Linear):  # a subclass has a forward of its own: left alone
        pass

    model.extra = OwnForward(4, 4)
    assert pack_linears(model, torch.bfloat16) == 0  # another dtype
    assert pack_linears(model, torch.float32) == linears > 0
    assert pack_linears(model, torch.float32) == 0  # already packed
    assert type(model.extra) is OwnForward
    assert not any(type(m) is nn.Linear for m in model.modules())
    after = model.state_dict()
    del model.extra
    assert sorted(after) == sorted([*state, "extra.weight", "extra.bias"])
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    assert model.get_output_embeddings().weight is embed.weight  # still tied


def test_a_methods_drafters_are_packed_with_the_target(tmp_path):
    target = random_target("tiny", dtype=torch.float32)
    method = build_method("eagle3", target, tmp_path)
    drafter_linears = sum(type(m) is nn.Linear for m in method.drafter.modules())
    target_linears = sum(type(m) is nn.Linear for m in target.model.modules())
    assert drafter_linears > 0
    assert pack_held_linears(method, torch.float32) == drafter_linears + target_linears  # through method.target too
    assert isinstance(method.drafter.lm_head, PackedLinear)
    assert pack_held_linears(method, torch.float32) == 0


def test_pack_for_decoding_follows_the_setting(monkeypatch):
    fp32 = random_target("tiny", dtype=torch.float32).model
    assert pack_for_decoding(fp32, False) == 0
    assert pack_for_decoding(fp32, None) == 0  # auto: bf16 only
    assert pack_for_decoding(fp32, True) > 0
    import decoding.engine.packed_linear as packed_linear

    monkeypatch.setattr(packed_linear, "packing_available", lambda dtype: False)
    with pytest.raises(ConfigError, match="model.prepack_linear=true"):
        pack_for_decoding(random_target("tiny", dtype=torch.float32).model, True)
    import pipeline.models as models

    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)  # auto on a bf16 model it cannot pack: no error
    assert pack_for_decoding(random_target("tiny", dtype=torch.bfloat16).model, None) == 0


def test_the_runner_packs_a_methods_drafter(tmp_path):
    from decoding.drafting.verify_cost import machine_key
    from decoding.methods.eagle3 import Eagle3Config
    from pipeline.runner import build_method as runner_build_method
    from pipeline.zoo import save_random_drafters

    target = random_target("tiny", dtype=torch.float32)
    unpacked_key = machine_key(target)
    target.packed_linears = pack_for_decoding(target.model, True)
    assert machine_key(target) == unpacked_key + "-packed"  # a cost curve measured packed is another curve
    drafters = save_random_drafters(target, tmp_path / "drafters")
    method = runner_build_method(Eagle3Config(drafter=drafters["eagle3"]), target)
    assert isinstance(method.drafter.lm_head, PackedLinear)
    assert not any(type(m) is nn.Linear for m in method.drafter.modules())


@pytest.mark.parametrize("name, loader, options", [
    ("caddtree", "decoding.methods.block_draft.load_drafter", {"max_budget": 4}),
    ("dominotree", "decoding.methods.block_draft.load_drafter", {"budget": "cond_adaptive", "max_budget": 4}),
    ("eagle3", "decoding.methods.eagle3.load_eagle3", {"budget": "cost_aware", "total_tokens": 5, "depth": 1,
                                                       "top_k": 2}),
])
def test_a_drafter_timed_inside_setup_is_packed_before_its_profile(name, loader, options, tmp_path, monkeypatch):
    """CaDDTree, cost-aware DominoTree and EAGLE-3 time their drafter in setup, before the runner packs it: the
    profile packs it first, so Cd is the cost of the drafter that decodes."""
    import importlib

    import decoding.drafting.verify_cost as verify_cost

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target = random_target("tiny", dtype=torch.float32)
    target.packed_linears = pack_for_decoding(target.model, True)
    module, _, attr = loader.rpartition(".")
    owner = importlib.import_module(module)
    loaded, packed_when_profiled = [], []
    load = getattr(owner, attr)
    monkeypatch.setattr(owner, attr, lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    profile = verify_cost.profile_verify_cost

    def profiled(*args, **kwargs):
        packed_when_profiled.append([type(m) for m in loaded[-1].modules() if isinstance(m, nn.Linear | PackedLinear)])
        return profile(*args, **kwargs)

    monkeypatch.setattr(verify_cost, "profile_verify_cost", profiled)
    build_method(name, target, tmp_path, profile_node_counts=[1, 4], profile_context_lengths=[8], profile_repeats=1,
                 **options)
    assert len(packed_when_profiled) == 1 and packed_when_profiled[0]
    assert set(packed_when_profiled[0]) == {PackedLinear}


def test_a_long_container_is_data_not_modules():
    class Holder:  # an engine object holding a long list (an n-gram table) with a module at its end
        pass

    Holder.__module__ = "decoding.fake"
    holder = Holder()
    holder.table = [(i, i + 1) for i in range(1000)] + [nn.Sequential(nn.Linear(4, 4))]
    holder.few = [nn.Sequential(nn.Linear(4, 4))]  # (a module is swapped inside its parent)
    assert pack_held_linears(holder, torch.float32) == 1


@native_bf16
@pytest.mark.parametrize("name", ["ar", "eagle3", "pld"])
def test_bf16_decoding_gives_the_same_tokens_packed_and_unpacked(name, tmp_path):
    """Packing changes speed, not tokens: a bf16 target and its packed copy decode the same answers."""
    plain = random_target("tiny", dtype=torch.bfloat16)
    packed = random_target("tiny", dtype=torch.bfloat16)
    assert pack_for_decoding(packed.model, None) > 0  # auto packs bf16 on this CPU
    packed.packed_linears = 1
    methods = [build_method(name, t, tmp_path / tag) for t, tag in ((plain, "plain"), (packed, "packed"))]
    assert pack_held_linears(methods[1], torch.bfloat16) == 0  # the zoo packed them after setup, as the runner does
    for prompt in mixed_prompts(3, 200):
        outputs = [generate(m, t, prompt, max_new_tokens=24).new_tokens for m, t in zip(methods, (plain, packed))]
        assert outputs[0] == outputs[1]
