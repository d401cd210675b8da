"""conf/experiment/: every paper-reproduction grid composes and validates, job by job, and each
`_smoke` variant runs the same methods and temperatures offline on smollm2-135m."""

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from pipeline.cli import first_config_problem
from pipeline.schema import register_configs

register_configs()

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "experiment").glob("*.yaml"))
METHOD_OPTIONS = {p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "method").glob("*.yaml")}
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


BENCHES = [e for e in EXPERIMENTS if e.startswith("bench_")]  # methods compared in one job per grid point
CASES = [(e, m) for e in EXPERIMENTS if e not in BENCHES for m in grid(e)["method"]]


@pytest.mark.parametrize(("experiment", "method"), CASES, ids=[f"{e}-{m}" for e, m in CASES])
def test_every_value_of_the_grid_composes_and_validates(experiment, method):
    if method not in METHOD_OPTIONS:  # conf/method/<option>.yaml (variants such as ptd_forest included)
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


@pytest.mark.parametrize("bench", BENCHES)
def test_a_benchmark_experiment_compares_its_methods_in_each_job_of_its_grid(bench):
    """The docs' benchmark tables come from these: each grid point is one job comparing every entry of
    `methods` (AR first); every entry composes with its settings."""
    from pipeline.runner import compose_methods

    params = grid(bench)
    assert "method" not in params and params["model"] == ["smollm2-135m"] and set(params["task"]) <= OFFLINE_TASKS
    with initialize_config_module(config_module="conf", version_base="1.3"):
        job = compose("config", overrides=[f"+experiment={bench}"])
        cfg = OmegaConf.to_object(job)
        assert cfg.method is None and cfg.methods[0] == "ar" and cfg.experiment_name == bench
        configs, labels, _ = compose_methods(cfg.methods, job)
    assert len(configs) == len(cfg.methods) == len(set(labels)) and labels[0] == "ar"


def test_every_paper_table_has_a_smoke_variant():
    tables = {e for e in EXPERIMENTS if not e.endswith("_smoke") and e not in BENCHES}
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


def missing_offline_asset(experiment: str, method: str) -> str | None:
    """A method's shipped asset that is not in this tree yet: a trained drafter folder or a routing mask."""
    from decoding.drafting.dflash_drafter import local_folder  # a folder, or one shipped in pipeline/assets
    from decoding.drafting.routing import mask_path

    root = Path(__file__).resolve().parents[2]
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=[f"+experiment={experiment}", f"method={method}"]))
    drafter = getattr(cfg.method, "drafter", None)
    if isinstance(drafter, str) and local_folder(drafter) is None and not (root / drafter).exists():
        return f"drafter {drafter}"
    mask = getattr(cfg.method, "mask", None)
    if isinstance(mask, str) and not (mask_path(mask).exists() or (root / mask_path(mask)).exists()):
        return f"routing mask {mask}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("smoke", [e for e in EXPERIMENTS if e.endswith("_smoke")])
def test_smoke_experiment_runs_one_cell_of_every_method(smoke, tmp_path):
    """One cell of the grid (humaneval, T=0, 1 prompt, 16 tokens) for every method, offline, on
    smollm2-135m through `python -m pipeline +experiment=<smoke>`; each method's run lands a summary."""
    methods, not_run = [], []
    for method in grid(smoke)["method"]:
        reason = "not implemented yet" if method not in METHOD_OPTIONS else missing_offline_asset(smoke, method)
        (not_run.append(f"{method} ({reason})") if reason else methods.append(method))
    if not methods:
        pytest.skip(f"no method of {smoke} can run here: {', '.join(not_run)}")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "pipeline", f"+experiment={smoke}", f"method={','.join(methods)}",  # the command line wins over the grid
           "task=humaneval", "temperature=0.0", "task.limit=1", "max_new_tokens=16", "tracker=none",
           "warmup=0", f"outputs_root={tmp_path / 'outputs'}", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # by option name (a variant such as ptd_forest reports its class's name, ptd, in summary["method"])
    summaries = {OmegaConf.load(p.parent / "run_config.yaml").method.name: json.loads(p.read_text())
                 for p in sweep.glob("*/summary.json")}
    assert sorted(summaries) == sorted(methods)
    for method, summary in summaries.items():
        assert summary["num_prompts"] == 1 and summary["experiment"] == smoke and summary["speedup"] > 0
        if summary["lossless"]:  # T=0: a lossless method reproduces AR, up to diagnosed bf16 near-ties
            assert summary["match_divergences"] == 0, method
            assert summary["match_rate"] + summary["match_ties"] == 1, method
    if not_run:
        pytest.skip(f"{smoke}: ran {', '.join(methods)}; not run: {', '.join(not_run)}")
