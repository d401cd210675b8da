"""Experiment tracking behind one small interface: W&B (offline by default) or nothing."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class Tracker(Protocol):
    def log_prompt(self, row: dict) -> None: ...
    def log_row(self, prefix: str, row: dict) -> None: ...  # one step of a series (a search trial...)
    def log_summary(self, summary: dict) -> None: ...
    def log_table(self, name: str, rows: list[dict]) -> None: ...
    def log_image(self, name: str, path: str) -> None: ...
    def finish(self) -> None: ...


class NoTracker:
    def log_prompt(self, row: dict) -> None:
        pass

    def log_row(self, prefix: str, row: dict) -> None:
        pass

    def log_summary(self, summary: dict) -> None:
        pass

    def log_table(self, name: str, rows: list[dict]) -> None:
        pass

    def log_image(self, name: str, path: str) -> None:
        pass

    def finish(self) -> None:
        pass


def _scalars(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _flat_metrics(summary: dict) -> dict:
    """Scalars plus lists and dicts of numbers spelled out (acceptance_per_pos/0, quality/pass@1), so
    every method's run carries the same metric names in W&B (vLLM's names for the draft counters)."""
    out = _scalars(summary)
    for key, value in summary.items():
        if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            out.update({f"{key}/{i}": v for i, v in enumerate(value)})
        elif isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in _scalars(value).items()})
    return out


class WandbTracker:
    def __init__(self, cfg, run_config: dict, run_dir: Path, job_type: str, tags: list[str]):
        import wandb

        self._wandb = wandb
        mode = os.environ.get("WANDB_MODE", cfg.mode)
        # one W&B run per run dir: a requeued (or rerun) job resumes the run it started instead of opening
        # a second one (the id is kept beside its results)
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(8)  # W&B ids: [a-z0-9]
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id)
        self.run = wandb.init(
            id=run_id,
            resume="allow",
            project=cfg.project,
            entity=cfg.entity,
            mode=mode,
            group=cfg.group or run_config.get("experiment_name"),
            job_type=job_type,
            tags=list(cfg.tags) + tags,
            config=run_config,
            dir=str(run_dir),
            name=run_dir.name,
            reinit="finish_previous",  # in-process multiruns: one W&B run per Hydra job
        )
        self._step = self.run.step or 0  # a resumed run continues its step count

    def log_prompt(self, row: dict) -> None:
        self.log_row("prompt", row)

    def log_row(self, prefix: str, row: dict) -> None:
        """The row's numbers as `<prefix>/<key>` at the next step."""
        self.run.log({f"{prefix}/{k}": v for k, v in _scalars(row).items()}, step=self._step)
        self._step += 1

    def log_summary(self, summary: dict) -> None:
        for key, value in _flat_metrics(summary).items():
            self.run.summary[key] = value

    def log_table(self, name: str, rows: list[dict]) -> None:
        if not rows:
            return
        columns = list(rows[0])
        data = [[_cell(r.get(c)) for c in columns] for r in rows]
        self.run.log({name: self._wandb.Table(columns=columns, data=data)}, step=self._step)

    def log_image(self, name: str, path: str) -> None:
        self.run.log({name: self._wandb.Image(path)}, step=self._step)

    def finish(self) -> None:
        self.run.finish()


def _cell(value):
    if isinstance(value, (list, dict, tuple)):
        import json

        return json.dumps(value)
    return value


def make_tracker(cfg, run_config: dict, run_dir: Path, job_type: str, tags: list[str]) -> Tracker:
    if cfg.kind == "none":
        return NoTracker()
    try:
        import wandb  # noqa: F401
    except ImportError:  # a laptop install without the `wandb` extra: results stay in the run dir
        log.warning("tracker=wandb but W&B is not installed (pip install 'specdec-pipeline[wandb]'); "
                    "not tracking this run (tracker=none silences this)")
        return NoTracker()
    return WandbTracker(cfg, run_config, run_dir, job_type, tags)
