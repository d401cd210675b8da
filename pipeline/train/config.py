"""Typed config of `python -m pipeline.train` (registered in Hydra's ConfigStore)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from pipeline.errors import ConfigError, check_choice, check_range
from pipeline.models import ModelConfig
from pipeline.schema import TrackerConfig


@dataclass
class DataConfig:
    dir: str = "outputs/drafter_data/${model.name}"  # shards of answers + tapped hidden states (resumable)
    num_prompts: int = 192  # even mix of GSM8K-train-side, stdlib-coding and open-ended prompts
    max_new_tokens: int = 128
    batch_size: int = 16  # batched HF generate: far cheaper per token than batch-1 on a CPU
    seed: int = 0
    corpus: Optional[str] = None  # a self-distillation corpus (python -m pipeline.train.corpus): token ids, features recomputed

    def __post_init__(self) -> None:
        check_range("data.num_prompts", self.num_prompts, 1)
        check_range("data.batch_size", self.batch_size, 1)


@dataclass
class DrafterTrainConfig:
    # dflash | domino (Domino head + backbone fine-tuned from a DFlash checkpoint) | exit_head | eagle3
    kind: str = "dflash"
    out_dir: str = "drafters/${model.name}/${.kind}"  # published-format safetensors + config.json
    state_dir: str = "outputs/drafter_train/${model.name}/${.kind}"  # resumable optimizer state
    # domino: the DFlash checkpoint to start from; dflash, eagle3: a trained checkpoint (ours or a published one,
    # local folder or hub id) to continue as a new leg: its weights, a fresh optimizer and schedule. dflash keeps
    # its architecture (drafter.* values that differ are logged, unused); eagle3 keeps its draft vocabulary and
    # refuses taps other than this run's eagle_layer_ids
    init_from: Optional[str] = None
    num_layers: int = 2  # published Qwen3-8B drafter: 5; small for a 2-core CPU
    intermediate_size: int = 1024
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 14, 27])  # default_target_layer_ids(30, 3)
    block_size: int = 16  # the published -b16 checkpoints
    mask_token_id: int = 16  # SmolLM2 has no <|MASK|>: <empty_output> (id 16) never occurs in chat answers
    gru_hidden_dim: int = 256  # Domino; Qwen3-8B checkpoint: 1024
    emb_dim: int = 64  # Domino correction rank; Qwen3-8B checkpoint: 256
    pure_draft_prefix_len: int = 1  # Domino: first draft position uses the base logits
    shift_label: bool = False  # see docs/methods/block-diffusion.md: keeps DFlash's row semantics so the backbone carries over
    steps: int = 300
    time_budget_min: float = 40.0  # stop (and save) after this many minutes even before `steps`
    seqs_per_step: int = 4  # training sequences per optimizer step
    num_anchors: int = 16  # blocks per sequence (SpecForge: 512 per long sequence on GPUs)
    lr: float = 1e-3
    warmup_steps: int = 50
    loss_decay_gamma: float = 7.0  # DFlash: gamma = 7 for block size 16
    lambda_start: float = 0.8  # Domino base-anchored curriculum: weight of CE(base) ...
    lambda_end: float = 0.2  # ... annealed linearly to this over the first 60% of steps
    checkpoint_every: int = 25
    val_sequences: int = 16
    seed: int = 0
    exit_layer: int = 6  # exit_head: the early exit it translates (decoder layers [0, exit_layer))
    tokens_per_step: int = 1024  # exit_head: positions per optimizer step
    max_train_positions: int = 262144  # exit_head: drafting positions whose features are kept in memory (2 x H floats each)
    eagle_layer_ids: list[int] = field(default_factory=list)  # eagle3: output ids; [] = 1, L//2-1, L-4 (EAGLE's)
    draft_vocab_size: int = 8192  # eagle3: the most frequent answer tokens (EAGLE-3 Llama-3.1-8B: 32000)
    ttt_length: int = 7  # eagle3: training-time-test steps (EAGLE-3 / SpecForge: 7)
    head_init: str = "random"  # eagle3: random (EAGLE-3, SpecForge) | target (its lm_head rows and final norm, trained)
    ttt_decay: float = 0.8  # eagle3: weight decay^j of step j's loss (EAGLE main.py, SpecForge ploss_decay)
    # eagle3, dflash, domino: none (EAGLE-3, SpecForge, z-lab: fc reads the raw features) | rms: fc trains on features
    # divided per dimension by their RMS over answer positions (a trained drafter's fc columns multiplied by it at the
    # start), divided back out at every export, so the published format is unchanged (an optimizer preconditioning of
    # ours; pipeline/train/feature_scale.py)
    feature_scale: str = "none"
    max_train_len: int = 2048  # tokens per training sequence (EAGLE: max_len 2048)
    # matmuls in bf16, weights/optimizer fp32; null = where bf16 is native (GPU cc >= 8.0, CPU avx512_bf16/AMX)
    bf16_autocast: Optional[bool] = None

    def __post_init__(self) -> None:
        check_choice("drafter.kind", self.kind, ("dflash", "domino", "exit_head", "eagle3"))
        check_choice("drafter.head_init", self.head_init, ("random", "target"))
        check_choice("drafter.feature_scale", self.feature_scale, ("none", "rms"))
        if self.kind == "exit_head" and self.feature_scale != "none":
            raise ConfigError(f"drafter.feature_scale={self.feature_scale}: the exit head reads no tapped features "
                              "through an fc; use it with drafter=eagle3, dflash or domino")
        check_range("drafter.ttt_length", self.ttt_length, 1)
        check_range("drafter.draft_vocab_size", self.draft_vocab_size, 2)
        check_range("drafter.exit_layer", self.exit_layer, 1)
        check_range("drafter.tokens_per_step", self.tokens_per_step, 1)
        check_range("drafter.max_train_positions", self.max_train_positions, 1)
        check_range("drafter.block_size", self.block_size, 2)
        check_range("drafter.lambda_start", self.lambda_start, 0.0, 1.0)
        check_range("drafter.lambda_end", self.lambda_end, 0.0, 1.0)


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    drafter: DrafterTrainConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    threads: Optional[int] = None

    def __post_init__(self) -> None:
        # the trainers build the drafter, the target's features and the optimizer state on the CPU: a target on
        # GPUs would meet them there with a device-mismatch traceback after loading
        if self.model.device_map:
            raise ConfigError(f"model.device_map={self.model.device_map}: pipeline.train runs on the CPU (the drafter, "
                              "the target's features and the optimizer live there); leave model.device_map unset")


def register_train_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_train", node=TrainConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="drafter", name="drafter_train_schema", node=DrafterTrainConfig)
