"""`python -m search [objective=ptd] [sampler=tpe|random|gp] [n_trials=N] [worker=K] [storage=...]`:
one Optuna study worker (see search/study.py). Resumes the study if it exists; writes the worker's
summary.json to its run dir and the best parameters where the objective exports them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipeline.environment import exit_on_old_libraries

exit_on_old_libraries()  # one line, before the engine's imports below would fail with a traceback

from pipeline.cli import USER_ERRORS, exit_on_user_error, precheck_overrides  # noqa: E402
from search.study import TrialFailed, register_configs  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="search")
def main(cfg: DictConfig) -> float | None:
    from pipeline.tracking import make_tracker
    from search.study import run_study

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with exit_on_user_error((*USER_ERRORS, TrialFailed)):
        sc = OmegaConf.to_object(cfg)
        tracker = make_tracker(sc.tracker, OmegaConf.to_container(cfg, resolve=True), run_dir, job_type="search",
                               tags=[sc.model.name, sc.objective.name, sc.sampler, f"worker{sc.worker}"])
        try:
            summary = run_study(sc, tracker)
        finally:
            tracker.finish()
    if summary["exported"]:  # the run dir keeps a copy of what this search exported
        exported = Path(summary["exported"])
        if exported.resolve() != (run_dir / exported.name).resolve():
            shutil.copy2(exported, run_dir / exported.name)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    best = summary["best"][0] if summary["best"] else None
    print(f"study {summary['study_name']}: {summary['finished_trials']} finished trials; "
          + (f"best #{best['number']} {best['values']} {best['params']}" if best else "no completed trial")
          + (f"; wrote {summary['exported']}" if summary["exported"] else ""))
    return best["values"][0] if best else None


def cli() -> None:
    """The console script (pyproject [project.scripts]) and `python -m`."""
    from pipeline.help import search_help, print_help_if_asked

    print_help_if_asked(sys.argv[1:], search_help)
    precheck_overrides(sys.argv[1:], config_name="search")
    main()


if __name__ == "__main__":
    cli()
