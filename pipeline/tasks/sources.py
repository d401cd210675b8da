"""Where task rows come from: local jsonl files, the data shipped in `pipeline/assets/data`, or HF `datasets`.

Every source yields `Rows`: an indexable sequence of dict rows plus a way to name row i in error
messages (``file:line`` for jsonl, ``HF id[split] row i`` for datasets), so a malformed row is
reported as one line that points at it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.tasks.base import TaskDataError

@dataclass
class Rows:
    rows: Sequence[dict]  # a list, or an HF Dataset (which also supports len() and [i] -> dict)
    where: Callable[[int], str]
    origin: dict = field(default_factory=dict)  # where the rows came from, with a revision (provenance)

    def __len__(self) -> int:
        return len(self.rows)


def read_jsonl(path: str | Path) -> Rows:
    p = Path(path).expanduser()
    if not p.is_file():
        raise TaskDataError(f"{p}: file not found")
    rows: list[dict] = []
    linenos: list[int] = []
    try:
        with p.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    # `from None`: the one-line message already says everything; no chained traceback
                    raise TaskDataError(f"{p}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(row, dict):
                    raise TaskDataError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
                rows.append(row)
                linenos.append(lineno)
    except UnicodeDecodeError as e:
        raise TaskDataError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise TaskDataError(f"{p}: cannot read ({e.strerror})") from None
    origin = {"source": "file", "path": str(p.resolve()), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()[:16]}
    return Rows(rows, lambda i: f"{p}:{linenos[i]}", origin)


def load_hf(task: str, dataset: str, config: Optional[str], split: str) -> Rows:
    """Load an HF dataset split. `datasets` is imported here so importing the task package stays
    fast; any failure (usually: offline) becomes one line that says how to give a local copy."""
    try:
        import datasets

        ds = datasets.load_dataset(dataset, config, split=split)
    except Exception as e:  # noqa: BLE001 - whatever `datasets` raises, the fix is the same
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise TaskDataError(
            f"task {task}: could not load HF dataset '{dataset}' (config {config}, split {split}) "
            f"[{type(e).__name__}: {detail}]; offline? give a local copy with task.path=<file>.jsonl"
        ) from None
    origin = {"source": "hf", "id": dataset, "config": config, "split": split,
              "fingerprint": getattr(ds, "_fingerprint", None)}  # the datasets cache's content hash
    return Rows(ds, lambda i: f"HF dataset {dataset}[{split}] row {i}", origin)


def require(row: dict, key: str | tuple[str, ...], where: str, kind: type | None = str) -> Any:
    """`row[key]` (the first present of several alternative keys), checked to be of `kind`."""
    keys = (key,) if isinstance(key, str) else key
    for k in keys:
        if row.get(k) is not None:
            value = row[k]
            if kind is not None and not isinstance(value, kind):
                raise TaskDataError(f"{where}: field '{k}' should be {kind.__name__}, got {type(value).__name__}")
            return value
    names = " or ".join(f"'{k}'" for k in keys)
    raise TaskDataError(f"{where}: missing required field {names}")


def data_cache() -> Path:
    """Downloaded task files: <SPECDEC_CACHE or ~/.cache/specdec>/data."""
    from pipeline.models import cache_root

    return cache_root() / "data"


def fetch_cached(task: str, url: str, timeout_s: float = 60.0) -> Path:
    """The file at `url`, downloaded once into the data cache (written whole, then renamed, so a
    broken download never leaves a partial file); offline it is one line naming the ways to give it."""
    import urllib.request

    path = data_cache() / task / url.rsplit("/", 1)[-1]
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            data = response.read()
    except OSError as e:  # URLError, timeouts, DNS: offline in practice
        raise TaskDataError(f"task {task}: could not download {url} ({type(e).__name__}: {str(e)[:120]}); offline? "
                            f"give the file with task.path=<file>.jsonl, or place it at {path}") from None
    try:  # a proxy's HTML page is not a data file: never cache it
        json.loads(data.decode("utf-8").split("\n", 1)[0])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TaskDataError(f"task {task}: {url} did not return JSON lines; give the file with task.path=<file>.jsonl")
    # a unique temp file renamed into place: concurrent first uses (a Slurm array) never see a partial file
    fd, partial = tempfile.mkstemp(dir=path.parent, suffix=".part")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)
    return path
