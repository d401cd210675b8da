"""Every method on a randomly initialised model: the smoke-test zoo behind
`benchmarks/gpu_smoke.py`, `benchmarks/bench_host_overhead.py` and the engine-wide tests (what a step costs the
host is measured by `pipeline/step_probes.py`).

- `random_target(shape, dtype, device, arch)`: a target with random weights (Qwen3 unless `arch`
  names another of ARCHITECTURES)
  (`tiny`: 6 layers, hidden 64, vocab 512, a forward of a few milliseconds on a CPU core;
  `qwen3-1.7b`: Qwen3-1.7B's shape, vocab 151936, for a GPU);
- `save_random_drafters(target, folder)`: a DFlash, a Domino and an EAGLE-3 drafter with random
  weights, written in the published layouts (the z-lab / Huang2020 config fields: `block_size`,
  `dflash_config.{mask_token_id, target_layer_ids}`, `projector_type: domino`, `gru_hidden_dim`,
  `emb_dim`, `pure_draft_prefix_len: 1`, `shift_label: true`, and their tensor names; EAGLE-3's
  SpecForge config with a draft vocabulary half the target's), so they load through the same code
  as a hub checkpoint;
- `build_method(name, target, folder)`: a method at its config defaults, with those drafters, an
  early-exit drafter at half depth for the drafter-verifier methods and a routing mask that
  skips every third layer for the slim ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from decoding.engine.packed_linear import pack_like_target
from decoding.engine.target import TargetModel

SHAPES = {
    # name: (config fields every architecture takes, drafter fields)
    "tiny": (dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16),
             dict(num_hidden_layers=1, intermediate_size=128, gru_hidden_dim=32, emb_dim=16, taps=3)),
    "qwen3-1.7b": (dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128),
                   dict(num_hidden_layers=2, intermediate_size=6144, gru_hidden_dim=1024, emb_dim=256, taps=5)),
}

# Architectures the engine is tested on (tests/decoding/test_architectures.py), as extra config
# fields over a shape: hybrid ones get a sliding window of 8 so a short test crosses it.
ARCHITECTURES = {
    "llama": ("LlamaConfig", dict()),
    "qwen3": ("Qwen3Config", dict()),
    # Qwen2 with its sliding window switched on for the layers from max_window_layers up: a hybrid stack
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=3)),
    # Gemma 3: local/global rotary bases, scaled embeddings; 2 sliding layers per full one here (5 in the models)
    "gemma3": ("Gemma3TextConfig", dict(sliding_window=8, query_pre_attn_scalar=16,
                                        layer_types=["sliding_attention"] * 2 + ["full_attention"]
                                        + ["sliding_attention"] * 2 + ["full_attention"])),
    # Mistral: every layer sliding (one layer type, so one mask tensor rather than a dict per type)
    "mistral": ("MistralConfig", dict(sliding_window=8)),
    # Gemma 2: alternating sliding/full layers, attention and final-logit soft-capping (eager attention)
    "gemma2": ("Gemma2Config", dict(sliding_window=8, query_pre_attn_scalar=16, final_logit_softcapping=30.0,
                                    attn_logit_softcapping=50.0, attn_implementation="eager")),
}

# More families, outside the tested matrix: `benchmarks/arch_probe.py` runs every method on them (AR against the
# model's uncached forward, the lossless methods against AR), and tests/decoding/engine/test_readout.py covers the
# readout of families whose forward scales around the stack (Granite, Cohere, MiniCPM3; Gemma 2 caps).
PROBED_ARCHITECTURES = {
    "phi3": ("Phi3Config", dict()),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "olmo2": ("Olmo2Config", dict()),
    "olmo3": ("Olmo3Config", dict(sliding_window=8)),
    "smollm3": ("SmolLM3Config", dict(no_rope_layer_interval=2)),  # every other layer without RoPE
    "exaone4": ("Exaone4Config", dict(sliding_window=8)),
    # Llama 3.1's RoPE scaling
    "llama3.1": ("LlamaConfig", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})),
    # Granite: embeddings x embedding_multiplier, logits / logits_scaling (decoding/engine/readout.py)
    "granite": ("GraniteConfig", dict(embedding_multiplier=2.0, logits_scaling=2.0, residual_multiplier=0.5,
                                      attention_multiplier=0.25)),
    "cohere": ("CohereConfig", dict(logit_scale=0.5)),  # logits x logit_scale
    "cohere2": ("Cohere2Config", dict(sliding_window=8, logit_scale=0.5)),
    "granitemoe": ("GraniteMoeConfig", dict(num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=2.0,
                                            logits_scaling=2.0)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=32)),
    "olmoe": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2)),
    # multi-head latent attention (its keys and values are not the query heads' width)
    "deepseek_v3": ("DeepseekV3Config", dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                             kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                             v_head_dim=16, first_k_dense_replace=1, n_group=1, topk_group=1,
                                             num_key_value_heads=4)),
    "gpt_oss": ("GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8)),  # sinks, MoE
    "glm4": ("Glm4Config", dict()),
    "stablelm": ("StableLmConfig", dict()),  # partial rotary, LayerNorm
    "starcoder2": ("Starcoder2Config", dict(sliding_window=8)),
    "gemma": ("GemmaConfig", dict()),
    "ministral": ("MinistralConfig", dict(sliding_window=8)),
    "seed_oss": ("SeedOssConfig", dict()),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", dict()),
    # logits_scaling divides the final hidden states before the head; latent attention
    "minicpm3": ("MiniCPM3Config", dict(num_key_value_heads=4, dim_model_base=16, qk_nope_head_dim=16,
                                        qk_rope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=16)),
    # layer types the engine does not handle: refused with one line
    "qwen3_next": ("Qwen3NextConfig", dict()),  # linear attention (Gated DeltaNet) layers
    "llama4": ("Llama4TextConfig", dict()),  # chunked attention layers
}

METHODS = ("ar", "pld", "lookahead", "self_draft", "ptd", "ptd_forest", "sd", "sd_slim", "spec_cascade", "via_sd",
           "via_sd_eagle3", "dflash", "ddtree", "caddtree", "domino", "dominotree", "dominotree_reference", "eagle3")
LOSSLESS = tuple(m for m in METHODS if m not in ("spec_cascade", "via_sd", "via_sd_eagle3"))


def mixed_prompts(count: int, high: int) -> list[list[int]]:
    """Even-numbered prompts repeat a phrase (drafts get accepted), odd ones are random tokens in
    [3, high) (drafts get rejected); seeded, so every run sees the same prompts."""
    gen = torch.Generator().manual_seed(0)
    return [[7, 30, 31, 32, 33, 34] * 4 if i % 2 == 0 else torch.randint(3, high, (24,), generator=gen).tolist()
            for i in range(count)]


def uncached_greedy(model, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens from the model's own forward over the whole sequence every step, no cache: the reference
    AR is checked against on every architecture."""
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def subset_and_full_logits(target: TargetModel, seq: list[int], split: int = 10):
    """The logits of seq[split:] after a prefill of seq[:split], by the layer-subset path over every layer
    (`_run_layers`: drafters, slim verifiers, VIA-SD) and by the full model's forward: equal where the subset
    path rebuilds the model's own forward from its modules."""
    target.prefill(seq[:split])
    subset = target._run_layers(torch.tensor(seq[split:]), torch.arange(split, len(seq)), None, (), False,
                                target.layers).logits
    target.prefill(seq[:split])
    return subset, target.forward(seq[split:], list(range(len(seq) - split))).logits


def static_passes_on_meta(arch: str, dtype=torch.bfloat16) -> list[tuple]:
    """A random `arch` model built on the meta device, prefilled with 20 tokens, then its static forward's captured
    function (TargetModel._static_pass) run on a chain with hidden taps, a tree with the last row only, and one row:
    the (logits, *taps) of each. Meta tensors hold no values, so any host read of a device value there (`.item()`,
    `bool(t)`, `nonzero`, which a CUDA graph cannot hold) raises: what a capture would refuse shows without a GPU.
    `dtype`: the model's (bf16, as on a GPU: transformers picks an MoE's experts kernel by it)."""
    from transformers import AutoModelForCausalLM

    from decoding.engine import readout
    from decoding.engine.attention_layout import SLIDING
    from decoding.engine.cuda_graph import GraphReplayer
    from decoding.engine.static_forward import StaticBlock

    config = random_config("tiny", arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    readout.mark_checked(model)  # the readout's check compares values, which a meta model has none of
    target = TargetModel(model, graphs=GraphReplayer(True, "model.cuda_graph", emulate=True))
    target.prefill(list(range(3, 23)), rows_expected=64)  # eager, as on a GPU
    buffer = target._static_buffer
    columns = torch.arange(buffer.capacity, device="meta")
    tokens, positions = torch.zeros(3, dtype=torch.long, device="meta"), torch.arange(3, device="meta") + 20
    visible = torch.ones(3, 3, dtype=torch.bool, device="meta").tril()
    outputs = []
    with torch.inference_mode():
        for rows, seen, last_only, taps in ((3, None, False, (1,)), (3, visible, True, ()), (1, None, True, ())):
            block = StaticBlock(tokens[:rows], positions[:rows], seen, 20, buffer.capacity, target.dtype, columns,
                                last_only, target.layout.windows.get(SLIDING))
            outputs.append(target._static_pass(**block.inputs(), keys=buffer.keys, values=buffer.values, taps=taps))
    return outputs


def random_config(shape: str = "tiny", arch: str = "qwen3", init_range: float = 0.2, num_layers: int | None = None):
    """The config of a random `arch` model (one of ARCHITECTURES or PROBED_ARCHITECTURES) of `shape` (one of
    SHAPES); `num_layers` overrides the shape's depth (architectures without a fixed list of layer types)."""
    import transformers

    fields, _ = SHAPES[shape]
    class_name, extra = {**ARCHITECTURES, **PROBED_ARCHITECTURES}[arch]
    fields = {**fields, **extra}
    if num_layers is not None:
        if "layer_types" in fields:
            raise ValueError(f"random_config: {arch} has a fixed list of layer types; num_layers cannot change it")
        fields["num_hidden_layers"] = num_layers
    attn = fields.pop("attn_implementation", None)
    config = getattr(transformers, class_name)(**fields, max_position_embeddings=4096, initializer_range=init_range,
                                                eos_token_id=2, bos_token_id=1, pad_token_id=0,
                                                tie_word_embeddings=False)
    if attn is not None:
        config._attn_implementation = attn
    return config


def random_target(shape: str = "tiny", dtype=torch.float32, device="cpu", seed: int = 0,
                  init_range: float = 0.2, arch: str = "qwen3", num_layers: int | None = None) -> TargetModel:
    """Random weights; `init_range` 0.2 (not the usual 0.02) gives peaked next-token distributions,
    so greedy outputs are not decided by near-ties everywhere."""
    from transformers import AutoModelForCausalLM

    config = random_config(shape, arch, init_range, num_layers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return TargetModel(model.eval())


def save_random_drafters(target: TargetModel, folder: Path, shape: str = "tiny", seed: int = 0) -> dict[str, str]:
    """{"dflash": dir, "domino": dir} with random drafters for `target`, saved in its dtype."""
    from decoding.drafting.dflash_drafter import DFlashDrafter, DrafterSpec, default_target_layer_ids, save_drafter

    _, d = SHAPES[shape]
    cfg = target.config
    dirs = {}
    for kind in ("dflash", "domino"):
        domino = kind == "domino"
        spec = DrafterSpec(hidden_size=cfg.hidden_size, num_hidden_layers=d["num_hidden_layers"],
                           num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                           head_dim=cfg.head_dim, intermediate_size=d["intermediate_size"], vocab_size=cfg.vocab_size,
                           target_layer_ids=default_target_layer_ids(cfg.num_hidden_layers, d["taps"]),
                           mask_token_id=cfg.vocab_size - 1, block_size=16, num_target_layers=cfg.num_hidden_layers,
                           rope_theta=float(getattr(cfg, "rope_theta", None) or 1_000_000.0),
                           projector_type="domino" if domino else None,
                           gru_hidden_dim=d["gru_hidden_dim"] if domino else None,
                           emb_dim=d["emb_dim"] if domino else None, pure_draft_prefix_len=1 if domino else 0,
                           shift_label=domino)
        torch.manual_seed(seed + domino)
        with torch.device(target.device):
            model = DFlashDrafter(spec)
        with torch.no_grad():
            for p in model.parameters():
                torch.nn.init.normal_(p, std=0.3 / p.shape[-1] ** 0.5 * 8) if p.dim() == 2 else p.uniform_(0.5, 1.5)
        path = Path(folder) / kind
        save_drafter(model, path, dtype=target.dtype)
        dirs[kind] = str(path)
    dirs["eagle3"] = save_random_eagle3(target, Path(folder) / "eagle3", seed)
    return dirs


def save_random_eagle3(target: TargetModel, path: Path, seed: int = 0) -> str:
    from decoding.drafting.eagle3_drafter import Eagle3Drafter, Eagle3Spec, save_eagle3, vocab_mapping

    cfg = target.config
    spec = Eagle3Spec(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                      num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                      vocab_size=cfg.vocab_size, draft_vocab_size=cfg.vocab_size // 2,
                      target_hidden_size=cfg.hidden_size, head_dim=cfg.head_dim,
                      rope_theta=float(getattr(cfg, "rope_theta", None) or 1_000_000.0),
                      aux_layer_ids=[1, cfg.num_hidden_layers // 2 - 1, cfg.num_hidden_layers - 2])
    torch.manual_seed(seed + 2)
    with torch.device(target.device):
        model = Eagle3Drafter(spec)
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.3 / p.shape[-1] ** 0.5 * 8) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    model.d2t, model.t2d = (t.to(target.device) for t in vocab_mapping(torch.arange(cfg.vocab_size) % 5,
                                                                         spec.draft_vocab_size))
    save_eagle3(model, path, dtype=target.dtype)
    return str(path)


# the zoo's variants and the method config each one sets
BASE_METHOD = {"ptd_forest": "ptd", "sd_slim": "sd", "dominotree_reference": "dominotree", "via_sd_eagle3": "via_sd"}


def build_method(name: str, target: TargetModel, folder: Path, shape: str = "tiny", **overrides):
    """`name` (one of METHODS) at its defaults on `target`; drafters and a mask go to `folder`."""
    import importlib

    from decoding import method_configs
    from decoding.drafting.drafter import DrafterConfig
    from decoding.drafting.routing import save_mask

    folder = Path(folder)
    layers = target.num_layers
    mask = folder / "random-dimr.json"
    if not mask.exists():
        save_mask(mask, list(range(1, layers - 1, 3)), num_layers=layers, model="random")
    drafters = folder / "drafters"
    if not (drafters / "eagle3" / "config.json").exists():
        save_random_drafters(target, drafters, shape)
    configs = method_configs()
    base = BASE_METHOD.get(name, name)
    fields = dict(overrides)
    if name == "ptd_forest":  # the ablation's option, as conf/method/ptd_forest.yaml has it
        import yaml  # not OmegaConf: this module runs where only torch and transformers are (the GPU image)

        import conf

        option = yaml.safe_load((Path(conf.__file__).parent / "method" / "ptd_forest.yaml").read_text())
        fields.update({k: v for k, v in option.items() if k != "defaults"})
    if name == "dominotree_reference":
        fields.update(builder="reference")
    if base in ("dflash", "ddtree", "caddtree"):
        fields.setdefault("drafter", str(drafters / "dflash"))
    if base in ("domino", "dominotree"):
        fields.setdefault("drafter", str(drafters / "domino"))
    if base == "via_sd":
        fields.setdefault("mask", str(mask))
    if base == "eagle3":
        fields.setdefault("drafter", str(drafters / "eagle3"))
    cfg = configs[base](**fields)
    module, _, cls_name = cfg._target_.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    if getattr(cls, "uses_drafter", False):
        drafter = DrafterConfig(kind="slim", mask=str(mask)) if name == "sd_slim" else \
            DrafterConfig(kind="eagle3", checkpoint=str(drafters / "eagle3")) if name == "via_sd_eagle3" else \
            DrafterConfig(exit_layer=max(1, layers // 2))
        method = cls(cfg, drafter=drafter)
    else:
        method = cls(cfg)
    method.setup(target)
    pack_like_target(method, target)  # as the runner does: the drafters run as the target does
    return method
