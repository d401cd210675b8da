"""Every method on a randomly initialised model: the smoke-test zoo behind
`benchmarks/gpu_smoke.py`, `benchmarks/bench_host_overhead.py` and the engine-wide tests.

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

from decoding.engine.target import TargetModel
from decoding.engine.transfer import synchronize

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

METHODS = ("ar", "pld", "lookahead", "self_draft", "ptd", "ptd_forest", "sd", "sd_slim", "spec_cascade", "via_sd",
           "via_sd_eagle3", "dflash", "ddtree", "caddtree", "domino", "dominotree", "dominotree_reference", "eagle3")
LOSSLESS = tuple(m for m in METHODS if m not in ("spec_cascade", "via_sd", "via_sd_eagle3"))


def mixed_prompts(count: int, high: int) -> list[list[int]]:
    """Even-numbered prompts repeat a phrase (drafts get accepted), odd ones are random tokens in
    [3, high) (drafts get rejected); seeded, so every run sees the same prompts."""
    gen = torch.Generator().manual_seed(0)
    return [[7, 30, 31, 32, 33, 34] * 4 if i % 2 == 0 else torch.randint(3, high, (24,), generator=gen).tolist()
            for i in range(count)]


def random_config(shape: str = "tiny", arch: str = "qwen3", init_range: float = 0.2, num_layers: int | None = None):
    """The config of a random `arch` model (one of ARCHITECTURES) of `shape` (one of SHAPES); `num_layers`
    overrides the shape's depth (architectures without a fixed list of layer types)."""
    import transformers

    fields, _ = SHAPES[shape]
    class_name, extra = ARCHITECTURES[arch]
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
    return method


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
    import collections
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
    sites = collections.Counter(f"{'/'.join(Path(w.filename).parts[-2:])}:{w.lineno}" for w in syncs)
    steps = max(state.stats.num_steps - 1, 1)
    return {"syncs_per_step": round(len(syncs) / steps, 2), "steps": steps,
            "sites": {site: round(n / steps, 2) for site, n in sites.most_common(top)}}


# Tensor methods that read a tensor's data on the host: on a GPU each waits for the device
HOST_READS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
              torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy)


def reads_the_host(func, args) -> bool:
    """Whether a call `__torch_function__` sees reads tensor data on the host: one of HOST_READS, or `x[t]`
    with a 0-dim integer tensor `t` (indexing reads `t` in C++)."""
    if func in HOST_READS:
        return True
    if func is torch.Tensor.__getitem__:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point()
                   and i.dtype != torch.bool for i in index)
    return False


class HostReadCounter(torch.overrides.TorchFunctionMode):
    """Notes the line of every host read (`reads_the_host`) made from Python while active."""

    def __init__(self):
        super().__init__()
        self.sites: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if reads_the_host(func, args):
            import sys

            caller = sys._getframe(1)
            self.sites.append(f"{'/'.join(Path(caller.f_code.co_filename).parts[-2:])}:{caller.f_lineno}")
        return func(*args, **(kwargs or {}))


def host_reads(method, target: TargetModel, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
               seed: int = 0, top: int = 3) -> dict:
    """The device->host reads per decoding step, found by rule on any device (HostReadCounter), counted as
    `device_syncs` counts a GPU's syncs: steps 2 to last, with the `top` lines they came from."""
    import collections

    from decoding.engine.loop import generate

    counter, marks = HostReadCounter(), []
    with counter:
        state = generate(method, target, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                         on_step=lambda s: marks.append(len(counter.sites)))
    reads = counter.sites[marks[0]:marks[-1]] if marks else []
    steps = max(state.stats.num_steps - 1, 1)
    return {"reads_per_step": round(len(reads) / steps, 2), "steps": steps,
            "sites": {site: round(n / steps, 2) for site, n in collections.Counter(reads).most_common(top)}}
