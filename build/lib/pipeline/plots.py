"""The report's figures (matplotlib, PNG): speedup and τ per method per task, quality against speedup
for lossy methods, and the forward-cost curve that sets tree budgets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on cluster nodes
import matplotlib.pyplot as plt  # noqa: E402


class ForwardCostError(ValueError):
    """The forward-cost file is missing or has no curve in it."""


def draw_all(rows: list[dict], out: Path, forward_cost: dict | None = None) -> list[Path]:
    images = [bars(rows, "speedup", "speedup over AR (x)", out / "speedup.png", reference=1.0),
              bars(rows, "tau", "τ (accepted tokens per verification)", out / "tau.png", reference=1.0)]
    lossy = quality_vs_speedup(rows, out / "quality_vs_speedup.png")
    if lossy:
        images.append(lossy)
    if forward_cost:
        images.append(forward_cost_curve(forward_cost, out / "forward_cost.png"))
    return images


def label(row: dict) -> str:
    return row["method"] + (f" ({row['settings']})" if row["settings"] else "")


def bars(rows: list[dict], metric: str, ylabel: str, path: Path, reference: float | None = None) -> Path:
    """One panel per (model, temperature); tasks on the x axis, one bar per method."""
    panels = sorted({(r["model"], r["temperature"]) for r in rows})
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(6.0, 1.6 * len(tasks_of(rows)) + 3), 3.2 * len(panels)),
                             squeeze=False)
    for ax, (model, temp) in zip(axes[:, 0], panels):
        sub = [r for r in rows if (r["model"], r["temperature"]) == (model, temp) and r.get(metric) is not None]
        tasks, methods = tasks_of(sub), sorted({label(r) for r in sub}, key=lambda m: (not m.startswith("ar"), m))
        width = 0.8 / max(1, len(methods))
        for j, method in enumerate(methods):
            mine = {r["task"]: r for r in sub if label(r) == method}
            xs = [i + (j - (len(methods) - 1) / 2) * width for i, t in enumerate(tasks) if t in mine]
            shown = [mine[t] for t in tasks if t in mine]
            # error bars: the std over repeats (speedup with repeats=N); n: prompts per bar
            errors = [r.get(f"{metric}_std") or 0.0 for r in shown]
            n = sorted({r["num_prompts"] for r in shown})
            drawn = ax.bar(xs, [r[metric] for r in shown], width, yerr=errors if any(errors) else None, capsize=3,
                           label=f"{method} (n={'/'.join(map(str, n))})")
            ax.bar_label(drawn, fmt="%.2f", fontsize=7)
        if reference is not None:
            ax.axhline(reference, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(tasks)), tasks)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model}, T={temp:g}")
        ax.legend(fontsize="small", ncol=min(4, max(1, len(methods))))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def tasks_of(rows: list[dict]) -> list[str]:
    return sorted({r["task"] for r in rows})


def quality_vs_speedup(rows: list[dict], path: Path) -> Path | None:
    """Lossy methods trade quality for speed: one panel per (model, task, T) that has a lossy run,
    with the AR reference's quality at speedup 1 as the point to beat."""
    lossy = [r for r in rows if r["lossless"] is False and r["quality"] is not None and r["speedup"] is not None]
    panels = sorted({(r["model"], r["task"], r["temperature"]) for r in lossy})
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, key in zip(axes[0], panels):
        sub = [r for r in lossy if (r["model"], r["task"], r["temperature"]) == key]
        for r in sub:
            ax.scatter(r["speedup"], r["quality"], label=label(r))
        ar_quality = next((r["ar_quality"] for r in sub if r["ar_quality"] is not None), None)
        if ar_quality is not None:
            ax.scatter(1.0, ar_quality, marker="*", s=150, color="black", label="AR")
        ax.set_xlabel("speedup over AR (x)")
        ax.set_ylabel(sub[0]["quality_metric"])
        ax.set_title(f"{key[0]}, {key[1]}, T={key[2]:g}")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_forward_cost(path: Path) -> dict:
    """{'sizes': [...], 'ms': [...], 'title': str} from bench_engine.py's printed output (saved to a
    file) or from a JSON file with the same keys."""
    if not path.exists():
        raise ForwardCostError(f"forward-cost file {path} does not exist")
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        return {"sizes": data["sizes"], "ms": data["ms"], "title": data.get("title", path.name)}
    points = re.findall(r"n=\s*(\d+):\s*([\d.]+) ms", text)
    if not points:
        raise ForwardCostError(f"{path} has no forward-cost lines ('n=   1:   83.0 ms'); "
                               "save the output of benchmarks/bench_engine.py")
    model = re.search(r"model=(\S+)", text)
    context = re.search(r"with a (\d+)-token cache", text)
    title = f"{model.group(1) if model else path.name}, {context.group(1) if context else '?'}-token cache"
    return {"sizes": [int(n) for n, _ in points], "ms": [float(ms) for _, ms in points], "title": title}


def forward_cost_curve(curve: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.8))
    base = curve["ms"][0]
    ax.plot(curve["sizes"], [ms / base for ms in curve["ms"]], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in one verification forward (n)")
    ax.set_ylabel("cost / cost of n=1")
    ax.set_title(f"forward cost: {curve['title']}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
