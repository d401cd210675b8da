"""`python -m pipeline [overrides]`: one Hydra job per run (`-m` for sweeps)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline.environment import exit_on_old_libraries

exit_on_old_libraries()  # one line, before the engine's imports below would fail with a traceback

from pipeline.cli import USER_ERRORS, exit_on_user_error, precheck_overrides  # noqa: E402
from pipeline.schema import register_configs  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from pipeline.runner import run

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    with exit_on_user_error(USER_ERRORS, in_sweep=hydra_cfg.mode == RunMode.MULTIRUN):
        summary = run(cfg, run_dir, show_progress=sys.stderr.isatty())
    if "methods" in summary:  # a comparison: the sweep's objective is the last method's speedup
        return summary["methods"][-1].get("speedup")
    return summary.get("speedup")


def cli() -> None:
    """The console script (pyproject [project.scripts]) and `python -m`."""
    from pipeline.help import pipeline_help, print_help_if_asked

    print_help_if_asked(sys.argv[1:], pipeline_help)
    precheck_overrides(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
