"""Shared fixtures: tiny randomly initialised llama / qwen3 models with a character-level
tokenizer, saved to a temp dir so they load through the same code path as real checkpoints."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# searches export into the user's folder (pipeline.resources.user_dir): never the real one in tests
os.environ.setdefault("SPECDEC_HOME", tempfile.mkdtemp(prefix="specdec-home-"))

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="<|end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials[3:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(arch: str, vocab_size: int, seed: int = 0, layers: int = 4, init_range: float = 0.2):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  initializer_range=init_range, eos_token_id=2, bos_token_id=1, pad_token_id=0,
                  tie_word_embeddings=False)
    config = LlamaConfig(**common) if arch == "llama" else Qwen3Config(head_dim=16, **common)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """{'llama': dir, 'qwen3': dir}, each a saved model + tokenizer."""
    tokenizer = tiny_tokenizer()
    dirs = {}
    for arch in ("llama", "qwen3"):
        path = tmp_path_factory.mktemp(f"tiny_{arch}")
        build_tiny_model(arch, len(tokenizer)).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs[arch] = path
    return dirs


@pytest.fixture(params=["llama", "qwen3"])
def tiny_target(request, tiny_model_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.engine.target import TargetModel

    path = tiny_model_dirs[request.param]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return TargetModel(model, AutoTokenizer.from_pretrained(path))


@pytest.fixture
def tiny_llama(tiny_model_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.engine.target import TargetModel

    path = tiny_model_dirs["llama"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return TargetModel(model, AutoTokenizer.from_pretrained(path))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real single-node Slurm (Debian's slurmctld/slurmd/munge) for the session, stopped by pid
    afterwards; skipped with the reason when the binaries are absent (.ci/run installs them)."""
    from pipeline.local_slurm import LocalSlurm, missing_binaries

    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm not installed here (missing {', '.join(missing)}); CI installs it in .ci/run")
    if os.geteuid() != 0:
        pytest.skip("the test Slurm runs slurmd, which launches jobs, and needs root")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def tiny_drafter():
    """make(vocab=60, domino=False, layers=1, seed=0) -> a random DFlash (or Domino, published
    shift_label semantics) drafter with hidden 32, fed by target layers [0, 2], block size 5."""
    from decoding.drafting.dflash_drafter import DFlashDrafter, DrafterSpec

    def make(vocab=60, domino=False, layers=1, seed=0, hidden=32, heads=4, kv_heads=2, block_size=5):
        spec = DrafterSpec(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, head_dim=hidden // heads, intermediate_size=48,
                           vocab_size=vocab, target_layer_ids=[0, 2], mask_token_id=0, block_size=block_size,
                           num_target_layers=4, rope_theta=10000.0, projector_type="domino" if domino else None,
                           gru_hidden_dim=12 if domino else None, emb_dim=6 if domino else None,
                           pure_draft_prefix_len=1 if domino else 0, shift_label=domino)
        torch.manual_seed(seed)
        model = DFlashDrafter(spec)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.3) if p.dim() == 2 else torch.nn.init.uniform_(p, 0.5, 1.5)
        return model.eval()

    return make


@pytest.fixture
def random_exit_head():
    """Factory: a tuned-lens exit head (decoding/drafting/exit_head.py) with random, non-zero weights."""
    from decoding.drafting.exit_head import ExitTranslator

    def make(hidden: int, seed: int = 0) -> ExitTranslator:
        head = ExitTranslator(hidden)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            head.proj.weight.copy_(0.3 * torch.randn(hidden, hidden, generator=gen))
            head.proj.bias.copy_(0.3 * torch.randn(hidden, generator=gen))
        return head

    return make
