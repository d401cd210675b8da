"""conf/experiment/: every paper-reproduction grid composes and validates, job by job, and each
`_smoke` variant runs the same methods and temperatures offline on smollm2-135m."""

from functools import lru_cache
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from decoding import method_configs
from pipeline.cli import first_config_problem
from pipeline.schema import register_configs

register_configs()

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "experiment").glob("*.yaml"))
OFFLINE_TASKS = {"humaneval", "gsm8k", "mt_bench"}  # data ships with the project's dependencies / shared data
PENDING = {"lookahead": 3, "self_draft": 3, "ptd": 3, "dflash": 4, "ddtree": 4, "caddtree": 4, "domino": 4,
           "dominotree": 4, "sd": 5, "spec_cascade": 5, "via_sd": 5}  # the issue that adds each method


@lru_cache(maxsize=None)
def grid(experiment: str) -> dict[str, list[str]]:
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={experiment}"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN" and cfg.experiment_name == experiment
    return {key: str(value).split(",") for key, value in cfg.hydra.sweeper.params.items()}


def jobs(experiment: str, method: str) -> list[list[str]]:
    """The method's jobs: every model (drafters and method settings depend on it) on the first
    task/temperature, and every task and temperature on the first model: each value of every
    dimension is composed once, without paying for the whole product (composition is ~0.3 s)."""
    params = {k: v for k, v in grid(experiment).items() if k != "method"}
    first = {k: v[0] for k, v in params.items()}
    variants = [{**first, key: value} for key, values in params.items() for value in values]
    unique = {tuple(sorted(v.items())) for v in variants}
    return [[f"+experiment={experiment}", f"method={method}"] + [f"{k}={v}" for k, v in combo] for combo in unique]


CASES = [(e, m) for e in EXPERIMENTS for m in grid(e)["method"]]


@pytest.mark.parametrize(("experiment", "method"), CASES, ids=[f"{e}-{m}" for e, m in CASES])
def test_every_value_of_the_grid_composes_and_validates(experiment, method):
    if method not in method_configs():
        pytest.skip(f"method={method} does not exist yet (issue {PENDING.get(method, '?')} adds it)")
    combos = jobs(experiment, method)
    seen: dict[str, set] = {}
    with initialize_config_module(config_module="conf", version_base="1.3"):
        for combo in combos:
            run_config = OmegaConf.to_object(compose("config", overrides=combo))  # runs every schema's checks
            assert run_config.method.name == method and run_config.experiment_name == experiment
            for override in combo[2:]:
                key, value = override.split("=", 1)
                seen.setdefault(key, set()).add(value)
    assert seen == {k: set(v) for k, v in grid(experiment).items() if k != "method"}


@pytest.mark.parametrize("smoke", [e for e in EXPERIMENTS if e.endswith("_smoke")])
def test_smoke_variant_runs_the_same_grid_offline_on_smollm2(smoke):
    full, small = grid(smoke.removesuffix("_smoke")), grid(smoke)
    assert small["model"] == ["smollm2-135m"]
    assert small["method"] == full["method"] and small.get("temperature") == full.get("temperature")
    assert set(small["task"]) <= OFFLINE_TASKS
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={smoke}"])
    assert cfg.task.limit <= 5 and cfg.max_new_tokens <= 128 and cfg.model.source == "gguf_wheel"


def test_every_paper_table_has_a_smoke_variant():
    tables = {e for e in EXPERIMENTS if not e.endswith("_smoke")}
    assert tables == {"ptd_table", "dominotree_table", "viasd_table"}
    assert {f"{t}_smoke" for t in tables} <= set(EXPERIMENTS)


def test_a_bad_value_in_an_experiment_grid_is_one_line_before_anything_runs(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "bad_grid.yaml").write_text(
        "# @package _global_\nexperiment_name: bad_grid\nhydra:\n  sweeper:\n    params:\n      method: ar,nosuch\n")
    extra = [f"hydra.searchpath=[file://{tmp_path}]", "+experiment=bad_grid"]
    problem = first_config_problem(extra)
    assert problem is not None and problem.startswith("method=nosuch is not an option; choose one of: ")
    assert first_config_problem(extra + ["method=pld"]) is None  # the command line wins over the grid
