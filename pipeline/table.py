"""The results table every run ends with (and `pipeline.report` prints): one row per method, the
numbers rounded, as rich on a terminal, aligned plain text otherwise (logs, Slurm), and Markdown for
`summary.md`."""

from __future__ import annotations

import sys

# (row key, header): rows are pipeline.report.summary_row dicts
RUN_COLUMNS = (("method", "method"), ("task", "task"), ("num_prompts", "prompts"), ("tokens_per_s", "tok/s"),
               ("ar_tokens_per_s", "AR tok/s"), ("speedup", "speedup"), ("tau", "τ"), ("decoding_efficiency", "DE"),
               ("match", "match vs AR"), ("quality", "quality"), ("ar_quality", "AR quality"))

LEGEND = ("Speedup: tokens/s over the AR reference of the same model, task, settings and machine. τ: mean accepted "
          "tokens per verification (bonus included). DE: new tokens per target forward (cost-weighted: a pass over "
          "k of L layers counts k/L). match: share of prompts identical to AR (lossless methods at T=0); near-tie / "
          "diverged: mismatching prompts whose first difference is a numeric near-tie of AR's logits / is not; prefix "
          "(lossy methods at T=0): mean share of AR's tokens reproduced before the first difference. "
          "rejection: drafted tokens rejected. With repeats=N: speedup ± the sample std of the N per-repeat speedups.")


def fmt(value, column: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if column == "speedup":
            return f"{value:.2f}x"
        if column == "temperature":
            return f"{value:g}"
        if column in ("tokens_per_s", "ar_tokens_per_s"):
            return f"{value:.1f}"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def match_cell(row: dict) -> str:
    """The share of prompts equal to AR, with the tie diagnosis of the others where there is one."""
    if row.get("match_rate") is None:  # a lossy method at T=0: how much of AR's text it kept
        agreement = row.get("ar_prefix_agreement")
        return "–" if agreement is None else f"prefix {agreement:.2f}"
    text = f"{row['match_rate']:.2f}"
    parts = [f"{n} {label}" for n, label in ((row.get("match_ties"), "near-tie"),
                                             (row.get("match_divergences"), "diverged")) if n]
    return text + (f" ({', '.join(parts)})" if parts else "")


def cells(row: dict, columns=RUN_COLUMNS) -> list[str]:
    out = []
    for key, _ in columns:
        if key == "match":
            out.append(match_cell(row))
        elif key == "method" and row.get("settings") and not any(k == "settings" for k, _ in columns):
            # a variant of an option: name (settings), unless the table has a settings column
            out.append(f"{row['method']} ({row['settings']})")
        elif key in ("quality", "ar_quality") and row.get(key) is not None and row.get("quality_metric"):
            out.append(f"{fmt(row[key])} {row['quality_metric']}")
        elif key == "speedup" and row.get("speedup_std") is not None:  # repeats: mean ± std
            out.append(f"{fmt(row.get('speedup'), 'speedup')} ± {row['speedup_std']:.2f}")
        else:
            out.append(fmt(row.get(key), key))
    return out


def markdown(rows: list[dict], columns=RUN_COLUMNS) -> str:
    head = [label for _, label in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells(r, columns)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plain(rows: list[dict], columns=RUN_COLUMNS) -> str:
    grid = [[label for _, label in columns]] + [cells(r, columns) for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in grid]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text) + "\n"


def show(rows: list[dict], title: str, columns=RUN_COLUMNS, stream=None) -> None:
    """rich on a terminal, plain text otherwise."""
    stream = stream or sys.stdout
    if not stream.isatty():
        stream.write(f"{title}\n{plain(rows, columns)}")
        stream.flush()
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, (_, label) in enumerate(columns):
        table.add_column(label, justify="left" if i < 2 else "right")
    for r in rows:
        table.add_row(*cells(r, columns))
    Console(file=stream).print(table)


CATEGORY_COLUMNS = (("method", "method"), ("category", "category"), ("num_prompts", "prompts"),
                    ("tokens_per_s", "tok/s"), ("speedup", "speedup"), ("tau", "τ"))


def category_rows(labelled: list[tuple[str, dict]]) -> list[dict]:
    """One row per method x category from (label, summary) pairs' `by_category` (Spec-Bench's layout)."""
    return [{"method": label, "category": category, **entry}
            for label, s in labelled for category, entry in (s.get("by_category") or {}).items()]
