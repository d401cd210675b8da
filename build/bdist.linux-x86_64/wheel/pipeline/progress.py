"""A rich progress bar with live tokens/s and mean accepted length on a terminal; one log line per
finished prompt otherwise (Slurm logs, pipes)."""

from __future__ import annotations

import logging
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


log = logging.getLogger(__name__)


class RunProgress:
    def __init__(self, label: str, total: int, already_done: int = 0, enabled: bool = True):
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[tps]:>7.1f} tok/s  tau {task.fields[tau]:.2f}"), TimeElapsedColumn(),
            disable=not enabled, transient=False,
        )
        self._task = self._progress.add_task(label, total=total, completed=already_done, tps=0.0, tau=0.0)
        self._log_lines = not enabled
        self._label, self._total, self._done = label, total, already_done
        self._tokens = 0
        self._seconds = 0.0

    def __enter__(self) -> "RunProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def step_callback(self):
        start = time.perf_counter()
        tokens_before, seconds_before = self._tokens, self._seconds

        def on_step(state) -> None:
            elapsed = seconds_before + time.perf_counter() - start
            tokens = tokens_before + len(state.new_tokens)
            self._progress.update(self._task, tps=tokens / elapsed if elapsed else 0.0, tau=state.stats.tau)

        return on_step

    def finish_example(self, row: dict, method: str | None = None) -> None:
        self._tokens += row["new_tokens"]
        self._seconds += row["wall_s"]
        self._done += 1
        tps = self._tokens / self._seconds if self._seconds else 0.0
        self._progress.update(self._task, advance=1, tps=tps, tau=row["tau"])
        if self._log_lines:
            row_tps = row["new_tokens"] / row["wall_s"] if row["wall_s"] else 0.0
            log.info("%s %d/%d %s%s: %.1f tok/s, tau %.2f", self._label, self._done, self._total,
                     f"{method} " if method else "", row["id"], row_tps, row["tau"])
