"""The native DFlash/Domino drafter: published checkpoint layout, drafts equal to a from-scratch
reference computation of the paper's attention, loud failures on wrong checkpoints."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from decoding.drafting.dflash_drafter import DFlashDrafter, default_target_layer_ids, load_drafter, save_drafter
from pipeline.errors import ConfigError

PUBLISHED_BACKBONE = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
    f"layers.0.{n}.weight" for n in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm")}
DOMINO_HEAD = {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"}


def test_default_target_layer_ids_match_zlab():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(30, 3) == [1, 14, 27]


@pytest.mark.parametrize("domino", [False, True])
def test_checkpoint_round_trip_uses_published_names_and_config(tmp_path, domino, tiny_drafter):
    model = tiny_drafter(domino=domino)
    save_drafter(model, tmp_path, dtype=torch.float32)
    names = set(load_file(tmp_path / "model.safetensors"))
    assert names == PUBLISHED_BACKBONE | (DOMINO_HEAD if domino else set())
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["block_size"] == 5 and cfg["dflash_config"]["target_layer_ids"] == [0, 2]
    assert cfg["dflash_config"]["mask_token_id"] == 0
    if domino:
        assert cfg["dflash_config"]["projector_type"] == "domino" and cfg["dflash_config"]["shift_label"] is True
        assert cfg["dflash_config"]["gru_hidden_dim"] == 12 and cfg["dflash_config"]["emb_dim"] == 6
    loaded = load_drafter(str(tmp_path))
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_loads_a_config_written_like_zlab_with_legacy_domino_alias(tmp_path, tiny_drafter):
    """Fields as the published config.json has them: Qwen3 fields at top level, block_size at top
    level, the DFlash fields in dflash_config, emb_dim at top level, projector_type causal_v5."""
    model = tiny_drafter(domino=True)
    save_drafter(model, tmp_path, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["dflash_config"]["projector_type"] = "causal_v5"
    cfg["emb_dim"] = cfg["dflash_config"].pop("emb_dim")
    cfg["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load_drafter(str(tmp_path))
    assert loaded.spec.is_domino and loaded.spec.emb_dim == 6


def reference_block_hidden(model: DFlashDrafter, context: torch.Tensor, block_embeds: torch.Tensor) -> torch.Tensor:
    """The paper's pass written out from scratch: positions 0..C-1 context, C.. block; K/V of
    [fc-fused context; block] through the same projections, Q of the block, no causal mask."""
    spec = model.spec
    c, b = len(context), len(block_embeds)
    pos = torch.arange(c + b).float()
    inv = 1.0 / spec.rope_theta ** (torch.arange(0, spec.head_dim, 2).float() / spec.head_dim)
    ang = torch.cat([pos[:, None] * inv] * 2, dim=-1)
    cos, sin = ang.cos(), ang.sin()

    def rms(x, w, eps=spec.rms_norm_eps):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def rope(x, cos, sin):  # x [heads, n, d]
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    ctx = rms(context @ model.fc.weight.t(), model.hidden_norm.weight)
    h = block_embeds
    for layer in model.layers:
        at = layer.self_attn
        x = rms(h, layer.input_layernorm.weight)
        kv_in = torch.cat([ctx, x])
        q = rms((x @ at.q_proj.weight.t()).view(b, 4, 8), at.q_norm.weight).transpose(0, 1)
        k = rms((kv_in @ at.k_proj.weight.t()).view(c + b, 2, 8), at.k_norm.weight).transpose(0, 1)
        v = (kv_in @ at.v_proj.weight.t()).view(c + b, 2, 8).transpose(0, 1)
        q, k = rope(q, cos[c:], sin[c:]), rope(k, cos, sin)
        k, v = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
        attn = torch.softmax(q @ k.transpose(1, 2) / 8 ** 0.5, dim=-1) @ v
        h = h + attn.transpose(0, 1).reshape(b, -1) @ at.o_proj.weight.t()
        x = rms(h, layer.post_attention_layernorm.weight)
        h = h + (torch.nn.functional.silu(x @ layer.mlp.gate_proj.weight.t()) * (x @ layer.mlp.up_proj.weight.t())) \
            @ layer.mlp.down_proj.weight.t()
    return rms(h, model.norm.weight)


def test_incremental_drafting_equals_the_reference_pass(tmp_path, tiny_drafter):
    """Loaded from the published layout, drafting with the cached context over three rounds gives
    the same hidden states (hence the same drafts) as the from-scratch computation."""
    save_drafter(tiny_drafter(layers=2), tmp_path, dtype=torch.float32)
    model = load_drafter(str(tmp_path))
    gen = torch.Generator().manual_seed(0)
    context = torch.randn(11, 64, generator=gen)
    cache = model.new_cache()
    seen = 0
    for new in (6, 3, 2):  # prefill context, then two rounds of accepted rows
        block = torch.randn(5, 32, generator=gen)
        got = model.draft(cache, context[seen:seen + new], block, seen + new)
        seen += new
        want = reference_block_hidden(model, context[:seen], block)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert cache.length == seen
    with pytest.raises(RuntimeError, match="out of sync"):
        model.draft(cache, context[:2], torch.randn(5, 32), seen + 5)


def test_bad_checkpoints_fail_with_one_line(tmp_path, tiny_drafter):
    with pytest.raises(ConfigError, match="no such folder"):
        load_drafter(str(tmp_path / "missing"))
    save_drafter(tiny_drafter(), tmp_path, dtype=torch.float32)
    state = load_file(tmp_path / "model.safetensors")
    state["extra.weight"] = state.pop("fc.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="tensor names do not match"):
        load_drafter(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(ConfigError, match="not a DFlash drafter config"):
        load_drafter(str(tmp_path))


def test_a_drafter_path_says_which_folder_and_weights_it_resolved_to(tmp_path, monkeypatch, caplog):
    """`drafters/<model>/<kind>` resolves relative to the cwd first, then among the shipped drafters. A trainer's
    export in the cwd named like a shipped drafter is used with a warning naming both, and the record (the run
    summary's provenance) holds the folder and weights digest actually loaded."""
    from decoding.drafting import dflash_drafter as dd

    shipped, work = tmp_path / "assets", tmp_path / "work"
    location = "drafters/tiny/dflash"
    for root, payload in ((shipped, b"shipped weights"), (work, b"trained here")):
        (root / location).mkdir(parents=True)
        (root / location / "model.safetensors").write_bytes(payload)
    monkeypatch.setattr(dd, "SHIPPED_DRAFTERS", shipped)
    monkeypatch.setattr(dd, "RESOLVED", {})
    monkeypatch.chdir(tmp_path)  # only the shipped one is visible from here
    with caplog.at_level("WARNING"):
        assert dd.local_folder(location) == shipped / location
    assert not caplog.records
    assert dd.RESOLVED[location] == {"folder": str((shipped / location).resolve()),
                                     "sha256": hashlib.sha256(b"shipped weights").hexdigest()[:16]}
    dd.forget_resolved()
    monkeypatch.chdir(work)  # the export shadows the shipped drafter
    with caplog.at_level("WARNING"):
        assert dd.local_folder(location).resolve() == (work / location).resolve()
    assert "not the shipped" in caplog.text and str(shipped / location) in caplog.text
    assert dd.RESOLVED[location]["sha256"] == hashlib.sha256(b"trained here").hexdigest()[:16]
    assert dd.RESOLVED[location]["folder"] == str((work / location).resolve())


@pytest.mark.parametrize("domino", [False, True])
def test_a_bf16_drafter_keeps_its_rope_frequencies_in_fp32(tmp_path, domino, tiny_drafter):
    """Loaded in bf16, the weights are bf16 but RoPE's inv_freq stays fp32 (as HF keeps the target's):
    a bf16 inv_freq would rotate far-apart positions by visibly wrong angles."""
    model = tiny_drafter(domino=domino)
    save_drafter(model, tmp_path, dtype=torch.float32)
    loaded = load_drafter(str(tmp_path), dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    assert loaded.inv_freq.dtype == torch.float32
    positions = torch.tensor([0, 700])
    cos, sin = loaded.rope(positions, torch.float32)
    ref_cos, ref_sin = model.rope(positions, torch.float32)
    assert torch.allclose(cos, ref_cos, atol=1e-5) and torch.allclose(sin, ref_sin, atol=1e-5)


def test_the_drafters_rmsnorm_rounds_as_hf_qwen3_in_bf16():
    """Cast the normalised row to the input dtype, then scale (HF's order): in bf16 the other order rounds
    once instead of twice and can flip the reference drafts' argmax near-ties."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from decoding.drafting.dflash_drafter import RMSNorm

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 96, generator=gen) * 3).to(torch.bfloat16)
    ours, theirs = RMSNorm(96, 1e-6).to(torch.bfloat16), Qwen3RMSNorm(96, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        weight = (1 + 0.3 * torch.randn(96, generator=gen)).to(torch.bfloat16)
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
        assert torch.equal(ours(x), theirs(x))
        assert ours(x.float()).dtype == torch.float32


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_grouped_attention_repeating_the_kv_heads_equals_sdpa_grouping_them(mask_kind):
    """The drafters' attention repeats the K/V heads where SDPA's grouped path would fall back to its math
    kernel (a mask on CUDA); both paths compute the same attention."""
    from decoding.drafting.dflash_drafter import grouped_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 8, generator=g) for h, n in ((6, 5), (2, 9), (2, 9)))
    mask = {"none": None, "bool": torch.rand(5, 9, generator=g) > 0.3,
            "float": torch.randn(5, 9, generator=g)}[mask_kind]
    if mask is not None and mask.dtype == torch.bool:
        mask[:, 0] = True  # every query sees a key
    grouped, expanded = grouped_attention(q, k, v, mask, expand=False), grouped_attention(q, k, v, mask, expand=True)
    torch.testing.assert_close(expanded, grouped)
    # query head h reads K/V head h // 3, as SDPA's enable_gqa does
    reference = torch.nn.functional.scaled_dot_product_attention(q[:, 4:5], k[:, 1:2], v[:, 1:2], attn_mask=mask)
    torch.testing.assert_close(grouped[:, 4:5], reference)
