"""Compare runs: `python -m pipeline.report <run or sweep dir>... [--out DIR] [--forward-cost FILE] [--wandb]`

Reads every summary.json under the given dirs (written by pipeline/runner.py) into one table, one
row per model x task x temperature x method (x method settings that differ from the defaults, x the
run's drafter, dtype, token limit, prompts, seed and repeats: rows that share a label name the ones they
differ in), as
Markdown and CSV, draws the plots (pipeline/plots.py) and optionally logs all of it to W&B.

Speedup and match_rate are the runner's: tokens/s against the AR reference of the same model,
task, settings and machine (fingerprinted, see runner.reference_fingerprint); the report never
divides numbers from different runs. Failed and unfinished jobs are listed, not dropped silently.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback

from pipeline import table
from pipeline.environment import exit_on_old_libraries

COLUMNS = ("model", "task", "temperature", "method", "settings", "dtype", "num_prompts", "speedup", "speedup_std",
           "repeats", "tau", "decoding_efficiency", "quality_metric", "quality", "ar_quality", "ar_prefix_agreement",
           "match_rate", "match_ties", "match_divergences", "rejection_rate", "draft_redundancy", "tokens_per_s",
           "ar_tokens_per_s", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
           "lossless", "experiment", "ar_reference", "run_dir")
MARKDOWN_COLUMNS = (("model", "model"), ("task", "task"), ("temperature", "T"), ("method", "method"),
                    ("settings", "settings"), ("num_prompts", "n"), ("speedup", "speedup"), ("tau", "τ"),
                    ("decoding_efficiency", "DE"), ("quality", "quality"), ("ar_quality", "AR quality"),
                    ("ar_prefix_agreement", "AR prefix"),
                    ("match_rate", "match"), ("match_ties", "ties"), ("match_divergences", "diverged"),
                    ("rejection_rate", "rejection"), ("tokens_per_s", "tok/s"),
                    ("ar_tokens_per_s", "AR tok/s"))


class ReportError(ValueError):
    """Nothing to report, or an unusable argument: one line for the user."""


@dataclass
class Collected:
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # failed / unfinished jobs, unreadable files, caveats


def collect(paths: list[Path]) -> Collected:
    out = Collected()
    summaries: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise ReportError(f"{path} does not exist")
        found = [path] if path.is_file() else sorted(path.rglob("summary.json"))
        summaries.update({p.resolve(): p for p in found})
        if path.is_dir():
            notes, failed_dirs = failed_jobs(path)
            out.notes += notes + unfinished_runs(path, skip=failed_dirs)
    for path in summaries.values():
        try:
            out.rows.append(row_from_summary(path))
        except (ValueError, KeyError, TypeError) as err:  # malformed file: say so, keep the others
            out.notes.append(f"skipped {path}: unreadable summary ({type(err).__name__}: {err})")
    if not out.rows:
        raise ReportError(f"no summary.json found under {', '.join(map(str, paths))}")
    out.rows, dropped = latest_per_key(out.rows)
    out.notes += [f"{d} is superseded by a newer run of the same configuration" for d in dropped]
    out.notes += mixed_references(out.rows)
    out.notes += [f"warning: {r['model']}/{r['task']}/T={r['temperature']:g} {r['method']}: {len(r['_divergent_ids'])} "
                  f"prompt(s) diverge from AR beyond a numeric near-tie: {', '.join(r['_divergent_ids'])}"
                  for r in out.rows if r["_divergent_ids"]]
    return out


def row_from_summary(path: Path) -> dict:
    row = summary_row(json.loads(path.read_text()), path.parent)
    row["_mtime"] = path.stat().st_mtime
    return row


def summary_row(s: dict, run_dir: Path) -> dict:
    """One table row from a run's summary (pipeline/summary.py) and its run dir."""
    metric = s.get("quality_metric")
    reference = run_dir / "reference.json"
    in_comparison = (run_dir.parent / "comparison.json").exists()  # named by its `methods` entry (ptd_tuned)
    config = read_run_config(run_dir)
    return {
        "model": s["model"], "task": s["task"], "temperature": float(s["temperature"]),
        "method": run_dir.name if in_comparison else s["method"],
        "settings": method_settings(config, s["method"]), "_run": run_fields(config, s["method"], s.get("dtype")),
        "num_prompts": s["num_prompts"],
        "speedup": s.get("speedup"), "speedup_std": s.get("speedup_std"), "repeats": s.get("repeats"),
        "tau": s.get("tau"), "decoding_efficiency": s.get("decoding_efficiency"),
        "quality_metric": metric, "quality": (s.get("quality") or {}).get(metric) if metric else None,
        "ar_quality": (s.get("ar_quality") or {}).get(metric) if metric else None,
        "match_rate": s.get("match_rate"), "ar_prefix_agreement": s.get("ar_prefix_agreement"),
        # mismatching prompts whose first divergence is a numeric near-tie, and the real divergences
        "match_ties": s.get("match_ties"), "match_divergences": s.get("match_divergences"),
        "dtype": s.get("dtype"), "_divergent_ids": s.get("divergent_ids") or [],
        # vLLM's draft acceptance rate, inverted: share of drafted tokens (tree nodes for tree methods) rejected
        "rejection_rate": s.get("rejection_rate"), "draft_redundancy": s.get("draft_redundancy"),
        "tokens_per_s": s.get("tokens_per_s"), "ar_tokens_per_s": s.get("ar_tokens_per_s"),
        "num_drafts": s.get("num_drafts"), "num_draft_tokens": s.get("num_draft_tokens"),
        "num_accepted_tokens": s.get("num_accepted_tokens"), "lossless": s.get("lossless"),
        "experiment": s.get("experiment"),
        "ar_reference": json.loads(reference.read_text()).get("fingerprint") if reference.exists() else None,
        "run_dir": str(run_dir), "_summary": {"method": s["method"], "by_category": s.get("by_category")},
        "_entry": in_comparison,
    }


def label_of(row: dict) -> str:
    """A comparison's row is named by its `methods` entry already (ptd_tuned, spec_cascade_alpha=0.05)."""
    return row["method"] + (f" ({row['settings']})" if row["settings"] and not row.get("_entry") else "")


def read_run_config(run_dir: Path) -> dict | None:
    """The run's run_config.yaml as a dict (None where the run has none)."""
    config_path = run_dir / "run_config.yaml"
    if not config_path.exists():
        return None
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(config_path))


def method_settings(config: dict | None, method: str) -> str:
    """The method's hyperparameters that differ from its config defaults (from the run's config), so
    that sweeps over a method's settings give distinguishable rows."""
    if config is None:
        return ""
    from omegaconf import OmegaConf

    from decoding import method_configs

    used = config.get("method", {})
    config_cls = method_configs().get(method)
    defaults = OmegaConf.to_container(OmegaConf.structured(config_cls)) if config_cls else {}
    changed = {k: v for k, v in used.items() if k not in ("_target_", "name") and defaults.get(k, object()) != v}
    if "verify" in defaults and "verify" not in used and used.get("sample_draft"):
        changed["verify"] = "rejection"  # a sampled Domino/DFlash chain before `verify` existed (2026-12-05)
    return " ".join(f"{k}={v}" for k, v in sorted(changed.items()))


def run_fields(config: dict | None, method: str, dtype: str | None) -> dict:
    """The run's settings outside `method` that change its numbers, by dotted name (from its config):
    the drafter (for methods that use one), the dtype the run used, the token limit, the prompts, seed and
    repeats. Runs that differ in any are different rows, even where their method settings agree."""
    used = config or {}
    # None is a value (task.limit=null: every prompt); only a setting a run did not record (an older
    # run_config.yaml, an older summary's dtype) is left out, and then matches any (same_run_settings)
    fields = {"dtype": dtype} if dtype is not None else {}
    fields |= {k: used[k] for k in ("max_new_tokens", "seed", "repeats") if k in used}
    if "limit" in (used.get("task") or {}):
        fields["task.limit"] = used["task"]["limit"]
    if uses_drafter(method) and used.get("drafter"):
        fields |= flattened("drafter", {k: v for k, v in used["drafter"].items() if k != "_target_"})
    return {k: json.dumps(v, sort_keys=True, separators=(",", ":")) for k, v in fields.items()}


def uses_drafter(method: str) -> bool:
    from hydra.utils import get_class

    from decoding import method_configs

    config_cls = method_configs().get(method)
    return bool(config_cls and getattr(get_class(config_cls._target_), "uses_drafter", False))


def flattened(prefix: str, value) -> dict:
    if not isinstance(value, dict):
        return {prefix: value}
    return {k: v for key, item in value.items() for k, v in flattened(f"{prefix}.{key}", item).items()}


def row_key(row: dict) -> tuple:
    return row["model"], row["task"], row["temperature"], row["method"], row["settings"]


def same_run_settings(a: dict, b: dict) -> bool:
    """Equal wherever both runs recorded the setting (an older run_config.yaml may lack a field)."""
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def latest_per_key(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """The newest run of each configuration: the same label and the same run settings."""
    kept: dict[tuple, list[dict]] = {}
    dropped = []
    for row in sorted(rows, key=lambda r: r["_mtime"]):
        group = kept.setdefault(row_key(row), [])
        older = [r for r in group if same_run_settings(r["_run"], row["_run"])]
        dropped += [r["run_dir"] for r in older]
        group[:] = [r for r in group if r not in older] + [row]
    for group in kept.values():
        told_apart(group)
    ordered = sorted((r for g in kept.values() for r in g),
                     key=lambda r: (r["model"], r["task"], r["temperature"], r["method"] != "ar", r["method"],
                                    r["settings"]))
    return ordered, dropped


def shown(encoded: str | None) -> str:
    """A run setting as the settings column shows it: plain for a string or number, compact JSON else."""
    if encoded is None:
        return "?"
    value = json.loads(encoded)
    return encoded if isinstance(value, (dict, list)) else str(value)


def told_apart(group: list[dict]) -> None:
    """Rows that share a label but not their run settings (a sweep over drafter=, max_new_tokens=, ...)
    get the run settings in which they differ added to their settings column."""
    if len(group) < 2:
        return
    names = sorted({k for r in group for k in r["_run"]})
    differing = [k for k in names if len({r["_run"].get(k) for r in group}) > 1]
    for row in group:
        extra = " ".join(f"{k}={shown(row['_run'].get(k))}" for k in differing)
        row["settings"] = f"{row['settings']} {extra}".strip()


def mixed_references(rows: list[dict]) -> list[str]:
    notes = []
    groups: dict[tuple, set] = {}
    for r in rows:
        if r["ar_reference"]:
            groups.setdefault((r["model"], r["task"], r["temperature"]), set()).add(r["ar_reference"])
    for (model, task, temp), refs in groups.items():
        if len(refs) > 1:
            notes.append(f"{model}/{task}/T={temp:g}: speedups are against {len(refs)} different AR references "
                         "(another machine or settings); compare each row with its own AR only")
    return notes


def failed_jobs(sweep_dir: Path) -> tuple[list[str], set[str]]:
    """Failures recorded by the Slurm/local launchers (<sweep dir>/jobs.json), and their run dirs."""
    notes, run_dirs = [], set()
    for jobs_file in sorted(sweep_dir.rglob("jobs.json")):
        for job in json.loads(jobs_file.read_text()).values():
            if job.get("status") != "COMPLETED":
                notes.append(f"job #{job['num']} ({' '.join(job['overrides'])}) {job['status']}: {job['error']}")
                run_dirs.add(str(job.get("run_dir")))
    return notes, run_dirs


def unfinished_runs(root: Path, skip: set[str]) -> list[str]:
    notes = []
    for config in sorted(root.rglob("run_config.yaml")):
        if (config.parent / "comparison.json").exists() or any(config.parent.glob("*/run_config.yaml")):
            continue  # a methods=[...] job: its runs are the subdirs
        if not (config.parent / "summary.json").exists() and str(config.parent) not in skip:
            results = config.parent / "results.jsonl"
            done = len(results.read_text().splitlines()) if results.exists() else 0
            failure = config.parent / "failed.json"  # a method that failed inside a comparison
            why = f"failed: {json.loads(failure.read_text())['error']}" if failure.exists() else "unfinished or failed"
            notes.append(f"{config.parent}: no summary.json ({why}; {done} prompts in results.jsonl)")
    return notes


def to_markdown(collected: Collected) -> str:
    text = table.LEGEND + "\n\n"
    text += table.markdown(collected.rows, MARKDOWN_COLUMNS)
    categories = [c for r in collected.rows for c in table.category_rows(
        [(f"{r['model']}/{r['task']}/T={r['temperature']:g} {label_of(r)}", r["_summary"])])]
    if categories:
        text += "\nBy category (Spec-Bench's layout):\n\n" + table.markdown(categories, table.CATEGORY_COLUMNS)
    if collected.notes:
        text += "\nNotes:\n" + "".join(f"- {n}\n" for n in collected.notes)
    return text


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def log_to_wandb(collected: Collected, images: list[Path], out: Path, project: str, group: str | None) -> None:
    """One W&B run (job_type=report) in the sweep's group: the table as a wandb.Table, plots as images."""
    from pipeline.schema import TrackerConfig
    from pipeline.tracking import make_tracker

    experiments = sorted({r["experiment"] for r in collected.rows if r["experiment"]})
    group = group or (experiments[0] if len(experiments) == 1 else "report")
    tracker = make_tracker(TrackerConfig(project=project, group=group), {"runs": [r["run_dir"] for r in collected.rows]},
                           out, job_type="report", tags=["report"])
    try:
        tracker.log_table("comparison", [{c: r[c] for c in COLUMNS} for r in collected.rows])
        for image in images:
            tracker.log_image(image.stem, str(image))
    finally:
        tracker.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs, sweep dirs or summary.json files")
    parser.add_argument("--out", type=Path, help="output dir (default: <first path>/report)")
    parser.add_argument("--forward-cost", type=Path, help="benchmarks/bench_engine.py output (text or JSON)")
    parser.add_argument("--wandb", action="store_true", help="log the table and plots as a W&B run")
    parser.add_argument("--project", default="specdec", help="W&B project (with --wandb)")
    parser.add_argument("--group", help="W&B group (default: the runs' experiment name)")
    args = parser.parse_args(argv)
    exit_on_old_libraries()  # before `collect` imports the methods' configs
    try:
        from pipeline import plots

        collected = collect(args.paths)
        out = args.out or ((args.paths[0] if args.paths[0].is_dir() else args.paths[0].parent) / "report")
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(to_markdown(collected))
        write_csv(collected.rows, out / "report.csv")
        forward_cost = plots.read_forward_cost(args.forward_cost) if args.forward_cost else None
        images = plots.draw_all(collected.rows, out, forward_cost)
        if args.wandb:
            log_to_wandb(collected, images, out, args.project, args.group)
    except (ReportError, plots.ForwardCostError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(to_markdown(collected))
    print(f"wrote {out / 'report.md'}, {out / 'report.csv'}" + "".join(f", {p}" for p in images))
    return 0



class SweepReport(Callback):
    """Hydra callback (conf/config.yaml `hydra.callbacks`): a `-m` sweep ends by reporting itself, the
    comparison table printed and report.md / report.csv / plots written to <sweep dir>/report."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        try:
            code = main([str(sweep_dir)])
        except Exception as err:  # noqa: BLE001 - the sweep's jobs are done; the report can be rerun
            print(f"the sweep's report failed ({type(err).__name__}: {err})", file=sys.stderr)
            code = 1
        if code:
            print(f"the sweep's report failed (exit {code}); rerun: python -m pipeline.report {sweep_dir}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
