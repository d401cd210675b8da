"""`--help` for the apps: the options of each config group with one line each, read from the shipped
conf/ (and the user's exported options), instead of Hydra's generic listing of every group."""

from __future__ import annotations

from pathlib import Path

import conf
from pipeline.resources import user_conf

CONF = Path(conf.__file__).resolve().parent
WIDTH = 130


def describe(path: Path) -> str:
    """The option's first comment line that is not a Hydra directive (or, for a model, its weights)."""
    text = path.read_text()
    comments = [line.lstrip("# ").rstrip() for line in text.splitlines() if line.startswith("#")]
    comments = [c for c in comments if c and not c.startswith("@package")]
    line = comments[0] if comments else ""
    if path.parent.name == "model":
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(path)
        source = cfg.get("source", "hub")
        line = f"{cfg.get('path', '')} (HF hub)" if source == "hub" else f"offline: {comments[0] if comments else source}"
    room = WIDTH - 24
    return line if len(line) <= room else line[: line.rfind(" ", 0, room - 3)].rstrip(",;:") + " ..."


def options(group: str) -> list[tuple[str, str]]:
    found: dict[str, Path] = {}
    for root in (CONF, user_conf()):  # a user's export shadows the shipped option of the same name
        folder = root / group
        if folder.is_dir():
            found.update({p.stem: p for p in sorted(folder.glob("*.yaml"))})
    return [(name, describe(found[name])) for name in sorted(found)]


def section(title: str, group: str) -> str:
    rows = options(group)
    pad = max([22, *(len(name) + 2 for name, _ in rows)])
    return f"{title}\n" + "".join(f"  {name:<{pad}}{text}\n" for name, text in rows)


def pipeline_help() -> str:
    return (
        "specdec (python -m pipeline): run and compare speculative-decoding methods on one model and task.\n\n"
        "usage: python -m pipeline [method=<name> | methods=[ar,pld,...]] [model=<name>] [task=<name>] [key=value ...]\n"
        "       python -m pipeline -m method=ar,pld task=gsm8k,humaneval [hydra/launcher=slurm]   (a sweep)\n"
        "       python -m pipeline +experiment=<name>                                             (a paper table)\n\n"
        "With no method= the job compares `methods` (default ar, pld, ptd) interleaved per prompt.\n\n"
        + section("methods (method=, methods=[...]):", "method") + "\n"
        + section("models (model=):", "model") + "\n"
        + section("tasks (task=):", "task") + "\n"
        + section("drafters for sd / spec_cascade / via_sd (drafter=):", "drafter") + "\n"
        + section("experiments (+experiment=):", "experiment") + "\n"
        "Every field and its value: python -m pipeline [overrides] --cfg job.  Docs: README.md, docs/.\n"
        "Hydra's own options: --hydra-help.\n"
    )


def search_help() -> str:
    return (
        "specdec-search (python -m search): one Optuna study worker (resumes the study if it exists).\n\n"
        "usage: python -m search objective=<name> [sampler=tpe|random|gp] [n_trials=N] [model=<name>] [key=value ...]\n"
        "       python -m search -m objective=ptd worker=0,1,2,3 hydra/launcher=slurm   (parallel workers)\n\n"
        + section("objectives (objective=):", "objective") + "\n"
        + section("models (model=):", "model") + "\n"
        "Every field: python -m search [overrides] --cfg job.  Hydra's own options: --hydra-help.\n"
    )


def print_help_if_asked(argv: list[str], render) -> None:
    if "--help" in argv or "-h" in argv:
        print(render(), end="")
        raise SystemExit(0)
