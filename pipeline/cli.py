"""Command-line guard rails: a bad override or bad input stops with one line that names the field
and the allowed values, instead of a traceback wall."""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager

from decoding.engine.attention_layout import UnsupportedArchitecture
from decoding.engine.loop import ContextLimitError
from pipeline.errors import ConfigError, one_line
from pipeline.models import ModelLoadError
from pipeline.tasks import TaskDataError
from pipeline.tasks.sandbox import SandboxUnavailable

USER_ERRORS = (ConfigError, ModelLoadError, TaskDataError, ContextLimitError, UnsupportedArchitecture,
               SandboxUnavailable)
MAX_CHECKED_COMBINATIONS = 256


class JobError(RuntimeError):
    """A user error inside one job of a sweep: the job fails with this one line, the sweep goes on."""


@contextmanager
def exit_on_user_error(errors=USER_ERRORS, in_sweep: bool = False):
    try:
        yield
    except errors as err:
        if in_sweep:  # SystemExit would end a basic-launcher sweep and leave submitit no result to report
            raise JobError(f"{type(err).__name__}: {err}") from None
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def precheck_overrides(argv: list[str], config_module: str = "conf", config_name: str = "config") -> None:
    """Compose the config for every combination of the command-line overrides (sweeps expanded)
    and validate it before Hydra starts any job; exit 2 with one line on the first problem."""
    overrides = [a for a in argv if not a.startswith("-") and "=" in a]
    if any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c") for a in argv):
        return
    launcher = next((a.split("=", 1)[1] for a in overrides if a.startswith("hydra/launcher=")), None)
    if launcher in ("slurm", "local") and not submitit_installed():
        print(f"error: hydra/launcher={launcher} needs hydra-submitit-launcher: pip install 'specdec-pipeline[slurm]'",
              file=sys.stderr)
        raise SystemExit(2)
    message = first_config_problem(overrides, config_module, config_name)
    if message:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def submitit_installed() -> bool:
    try:
        from hydra_plugins.hydra_submitit_launcher import submitit_launcher  # noqa: F401
    except ImportError:
        return False
    return True


def first_config_problem(overrides: list[str], config_module: str = "conf", config_name: str = "config") -> str | None:
    from hydra import compose, initialize_config_module
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=config_module, version_base="1.3"):
            try:
                parser = OverridesParser.create()
                combos = BasicSweeper.split_arguments(parser.parse_overrides(overrides), None)[0]
                # a grid in the config (experiments' hydra.sweeper.params) is swept too; the command line wins
                params = compose(config_name=config_name, overrides=combos[0], return_hydra_config=True).hydra.sweeper.params
                grid = [f"{key}={value}" for key, value in (params or {}).items()]
                combos = BasicSweeper.split_arguments(parser.parse_overrides(grid + overrides), None)[0]
                combos = combos[:MAX_CHECKED_COMBINATIONS]
            except Exception as err:  # unparsable override, or a bad one in the first combination
                return describe(err, overrides)
            checked_methods = set()
            for combo in combos:
                try:
                    cfg = compose(config_name=config_name, overrides=combo)
                    run_config = OmegaConf.to_object(cfg)
                    methods = getattr(run_config, "methods", None)
                    if methods and run_config.method is None and tuple(methods) not in checked_methods:
                        from pipeline.runner import compose_methods  # every entry, before any job starts

                        checked_methods.add(tuple(methods))
                        compose_methods(list(methods), cfg)
                except Exception as err:
                    return describe(err, combo)
    finally:
        GlobalHydra.instance().clear()
    return None


def describe(err: Exception, combo: list[str]) -> str:
    """Turn Hydra/OmegaConf composition errors into one actionable line."""
    text = full_text(err)
    missing = re.search(r"Could not find '([\w/.\-]+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        return f"{group}={option} is not an option; choose one of: {', '.join(group_options(group))}"
    not_in_struct = re.search(r"Key '([^']+)' not in '(\w+)'", text)
    full_key = re.search(r"full_key: ([\w.\[\]]+)", text)
    if not_in_struct:
        key = full_key.group(1) if full_key else not_in_struct.group(1)
        return f"unknown config key '{key}' (not a field of {not_in_struct.group(2)})"
    for cause in chain(err):
        if isinstance(cause, ConfigError):
            return str(cause)
    convert = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", text)
    if convert:
        key = full_key.group(1) if full_key else "a field"
        return f"{key}={convert.group(1)!r} is not a valid {convert.group(2)}"
    return one_line(err)


def group_options(group: str) -> list[str]:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    loader = GlobalHydra.instance().config_loader()
    return [o for o in loader.get_group_options(group, results_filter=ObjectType.CONFIG) if not o.endswith("_schema")
            and not o.startswith("base_")]


def chain(err: BaseException):
    while err is not None:
        yield err
        err = err.__cause__ or err.__context__


def full_text(err: BaseException) -> str:
    return "\n".join(str(e) for e in chain(err))

