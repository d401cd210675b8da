"""One job: load model and task, run the AR reference (or reuse a matching one), run the method,
write results.jsonl / summary.json and log to the tracker."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import platform
from contextlib import contextmanager
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from decoding.engine.loop import Method
from decoding.engine.target import TargetModel
from pipeline.generation import GenerationSettings, diagnose_mismatches, read_results, run_examples
from pipeline.models import load_model, stop_token_ids
from pipeline.progress import RunProgress
from pipeline.schema import RunConfig
from pipeline.summary import add_tie_diagnosis, summarize
from pipeline.tasks import load_examples
from pipeline.tasks.sandbox import configure as configure_sandbox
from pipeline.tasks.scoring import CODE_TASKS
from pipeline.tracking import make_tracker

log = logging.getLogger(__name__)


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Instantiate the dataclasses, which runs every schema's value checks (__post_init__)."""
    return OmegaConf.to_object(cfg)


def build_method(method_cfg, target: TargetModel, drafter_cfg=None) -> Method:
    cls = get_class(method_cfg._target_)
    method = cls(method_cfg, drafter=drafter_cfg) if getattr(cls, "uses_drafter", False) else cls(method_cfg)
    method.setup(target)
    return method


def machine_id() -> dict:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or platform.machine()
    return {"host": platform.node(), "device": device, "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def reference_fingerprint(cfg: RunConfig, settings: GenerationSettings) -> tuple[str, dict]:
    """What makes an AR reference reusable: same model, task, decoding settings and machine."""
    payload = {
        "model": OmegaConf.to_container(OmegaConf.structured(cfg.model)),
        "task": OmegaConf.to_container(OmegaConf.structured(cfg.task)),
        "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature, "seed": settings.seed,
        "machine": machine_id(),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return digest, payload


@contextmanager
def file_lock(path: Path):
    """Serialise jobs that share an AR reference (e.g. a Slurm array over methods)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_reference(cfg: RunConfig, target, examples, settings, run_dir: Path, show_progress: bool) -> list[dict]:
    from decoding.methods.ar import AR, ARConfig

    digest, payload = reference_fingerprint(cfg, settings)
    ref_dir = (Path(cfg.outputs_root) / "ar_reference" / digest) if cfg.reference.reuse else run_dir / "ar_reference"
    ref_dir.mkdir(parents=True, exist_ok=True)
    (ref_dir / "fingerprint.json").write_text(json.dumps(payload, indent=2))
    results_path = ref_dir / "results.jsonl"
    with file_lock(ref_dir / ".lock"):
        done = len(read_results(results_path))
        with RunProgress("AR reference", len(examples), min(done, len(examples)), show_progress) as progress:
            rows = run_examples(AR(ARConfig()), target, cfg.task, examples, settings, results_path, progress=progress)
    (run_dir / "reference.json").write_text(json.dumps({"dir": str(ref_dir), "fingerprint": digest}))
    return rows


def run(cfg: DictConfig, run_dir: Path, show_progress: bool = True) -> dict:
    rc = to_run_config(cfg)
    if rc.threads:
        torch.set_num_threads(rc.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_resume(cfg, run_dir)

    sandbox = None
    if rc.task.name in CODE_TASKS:  # generated code will run: check its isolation before generating
        sandbox = configure_sandbox(rc.task.sandbox)
    examples = load_examples(rc.task)
    model, tokenizer = load_model(rc.model)
    target = TargetModel(model, tokenizer)
    settings = GenerationSettings(
        max_new_tokens=rc.max_new_tokens or rc.task.max_new_tokens, temperature=rc.temperature,
        seed=rc.seed, stop_ids=stop_token_ids(model, tokenizer), warmup=rc.warmup,
        chat_template_kwargs=dict(rc.model.chat_template_kwargs))
    method = build_method(rc.method, target, rc.drafter)

    tracker = make_tracker(rc.tracker, OmegaConf.to_container(cfg, resolve=True), run_dir, job_type=method.name,
                           tags=[rc.model.name, rc.task.name, f"T{rc.temperature:g}"])
    try:
        reference = None
        if method.name != "ar" and rc.reference.enabled:
            reference = run_reference(rc, target, examples, settings, run_dir, show_progress)
        results_path = run_dir / "results.jsonl"
        done = len(read_results(results_path))
        with RunProgress(method.name, len(examples), min(done, len(examples)), show_progress) as progress:
            rows = run_examples(method, target, rc.task, examples, settings, results_path,
                                on_row=tracker.log_prompt, progress=progress)
        summary = summarize(rc, method, examples, rows, reference)
        summary["dtype"] = str(target.dtype).removeprefix("torch.")
        summary["chat_template_kwargs"] = dict(rc.model.chat_template_kwargs)
        summary["sandbox"] = sandbox  # the isolation generated code ran under (None: the task runs no code)
        if "mismatched_ids" in summary:  # a lossless method at T=0: tell near-ties from real divergences
            add_tie_diagnosis(summary, diagnose_mismatches(target, rc.task, examples, rows, reference, settings)
                              if summary["mismatched_ids"] else [])
        summary["run_dir"] = str(run_dir)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        tracker.log_summary(summary)
        tracker.log_table("prompts", [{k: v for k, v in r.items() if k != "output_ids"} for r in rows])
    finally:
        tracker.finish()
    log.info("summary: %s", json.dumps({k: summary[k] for k in ("method", "dtype", "tokens_per_s", "tau", "speedup",
                                                                 "match_rate", "match_ties", "match_divergences")
                                        if k in summary}))
    if summary.get("divergent_ids"):
        log.warning("%s: %d prompt(s) diverge from AR beyond a numeric near-tie (not explained by %s rounding): %s",
                    method.name, len(summary["divergent_ids"]), summary["dtype"], ", ".join(summary["divergent_ids"]))
    return summary


def _check_resume(cfg: DictConfig, run_dir: Path) -> None:
    """Resuming into a run dir is only safe with the same config: refuse a different one."""
    saved = run_dir / "run_config.yaml"
    current = OmegaConf.to_yaml(cfg, resolve=True)
    if saved.exists() and (run_dir / "results.jsonl").exists() and saved.read_text() != current:
        from pipeline.errors import ConfigError

        raise ConfigError(f"{run_dir} holds results of a different config; choose another hydra.run.dir")
    saved.write_text(current)
