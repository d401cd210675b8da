"""Typed config schemas, registered in Hydra's ConfigStore so that every YAML option is validated
against a dataclass (unknown keys and wrong types are refused at composition)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from decoding.drafting.drafter import DrafterConfig
from pipeline.errors import ConfigError, check_choice, check_range
from pipeline.models import ModelConfig
from pipeline.tasks.base import TaskConfig


@dataclass
class TrackerConfig:
    kind: str = "wandb"  # wandb | none
    project: str = "specdec"
    entity: Optional[str] = None
    mode: str = "offline"  # online | offline | disabled; the WANDB_MODE env var wins
    group: Optional[str] = None  # W&B group; defaults to the experiment name
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_choice("tracker.kind", self.kind, ("wandb", "none"))
        check_choice("tracker.mode", self.mode, ("online", "offline", "disabled"))


@dataclass
class ReferenceConfig:
    """The AR reference run that speedup and match_rate are measured against."""

    enabled: bool = True
    reuse: bool = True  # reuse an AR reference with the same fingerprint (model, task, settings, machine)


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    method: Any = None  # one of decoding.method_configs(), validated by its own schema: run it alone vs AR
    # with no `method`: compare these method options (conf/method/<name>.yaml) in one job, interleaved per
    # prompt, AR first (added if missing)
    methods: list[str] = field(default_factory=list)
    task: TaskConfig = MISSING
    tracker: TrackerConfig = MISSING
    drafter: Optional[DrafterConfig] = None  # drafter-verifier methods only (sd, spec_cascade, via_sd)
    # names the W&B group and the report; `+experiment=<file>` sets it (the key is not `experiment`, which
    # is the config group of conf/experiment/ and cannot also be a value on the command line)
    experiment_name: str = "default"
    temperature: float = 0.0
    seed: int = 0
    max_new_tokens: Optional[int] = None  # overrides task.max_new_tokens
    threads: Optional[int] = None  # torch CPU threads (None = torch's default)
    warmup: int = 1  # untimed generations before measuring (first-call overheads)
    # each prompt this many times (the whole prompt set once per repeat, ids "<id>#<r>" for r > 0);
    # tables show speedup as mean ± std over the repeats (Spec-Bench reports 3)
    repeats: int = 1
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    outputs_root: str = "outputs"  # where AR references are cached for reuse

    def __post_init__(self) -> None:
        check_range("temperature", self.temperature, 0.0)
        if self.method is None and not self.methods:
            raise ConfigError("no method: give method=<name> (one method against AR) or methods=[ar,pld,...]")
        check_range("warmup", self.warmup, 0)
        check_range("repeats", self.repeats, 1)
        if self.max_new_tokens is not None:
            check_range("max_new_tokens", self.max_new_tokens, 1)


def register_configs() -> None:
    from decoding import method_configs

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=RunConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="task", name="base_task", node=TaskConfig)
    cs.store(group="tracker", name="base_tracker", node=TrackerConfig)
    cs.store(group="drafter", name="base_drafter", node=DrafterConfig)
    for name, config_cls in method_configs().items():
        cs.store(group="method", name=f"{name}_schema", node=config_cls)
