"""`python -m pipeline.train drafter=dflash|domino|exit_head [model=...]`: train a drafter for a target."""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline.environment import exit_on_old_libraries

exit_on_old_libraries()  # one line, before the engine's imports below would fail with a traceback

from pipeline.cli import USER_ERRORS, exit_on_user_error, precheck_overrides  # noqa: E402
from pipeline.train.config import register_train_configs  # noqa: E402

register_train_configs()


@hydra.main(version_base="1.3", config_path="../../conf/train", config_name="train")
def main(cfg: DictConfig) -> None:
    from pipeline.train.trainer import train

    logging.getLogger().setLevel(logging.INFO)
    with exit_on_user_error(USER_ERRORS):
        train(OmegaConf.to_object(cfg), OmegaConf.to_container(cfg, resolve=True), show_progress=sys.stderr.isatty())


def cli() -> None:
    """The console script (pyproject [project.scripts]) and `python -m`."""
    precheck_overrides(sys.argv[1:], config_module="conf.train", config_name="train")
    main()


if __name__ == "__main__":
    cli()
