"""A whole job on a tiny model: results, summary, resume, AR reference reuse, tracking."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from pipeline.runner import run
from pipeline.schema import register_configs

register_configs()


def job_config(tiny_dir: Path, tmp_path: Path, *extra):
    overrides = [
        "model=smollm2-135m", "model.source=hub", f"model.path={tiny_dir}", "model.name=tiny-llama",
        "task=humaneval", "task.limit=3", "max_new_tokens=12", "tracker=none", f"outputs_root={tmp_path / 'outputs'}",
        *extra,
    ]
    with initialize_config_module(config_module="conf", version_base="1.3"):
        return compose("config", overrides=overrides)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ar_job_writes_rows_and_summary(tiny_model_dirs, tmp_path):
    run_dir = tmp_path / "run"
    summary = run(job_config(tiny_model_dirs["llama"], tmp_path), run_dir, show_progress=False)
    rows = read_rows(run_dir / "results.jsonl")
    assert [r["id"] for r in rows] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(r["new_tokens"] == 12 and len(r["output_ids"][0]) == 12 for r in rows)
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["num_prompts"] == 3 and saved["new_tokens"] == 36 and saved["speedup"] == 1.0
    assert saved["tau"] == 1.0 and saved["decoding_efficiency"] == 1.0 and "pass@1" in saved["quality"]
    assert summary["tokens_per_s"] > 0


def test_rerun_resumes_and_skips_finished_prompts(tiny_model_dirs, tmp_path):
    run_dir = tmp_path / "run"
    cfg = job_config(tiny_model_dirs["llama"], tmp_path)
    run(cfg, run_dir, show_progress=False)
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    # simulate a kill during the third prompt: two finished rows and a torn line
    (run_dir / "results.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][: len(lines[2]) // 2])
    run(cfg, run_dir, show_progress=False)
    rows = read_rows_tolerant(run_dir / "results.jsonl")
    assert [r["id"] for r in rows] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    # the finished rows were not regenerated: identical timings
    assert [r["wall_s"] for r in rows[:2]] == [json.loads(x)["wall_s"] for x in lines[:2]]


def read_rows_tolerant(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def test_resume_into_a_dir_of_another_config_is_refused(tiny_model_dirs, tmp_path):
    from pipeline.errors import ConfigError

    run_dir = tmp_path / "run"
    run(job_config(tiny_model_dirs["llama"], tmp_path), run_dir, show_progress=False)
    with pytest.raises(ConfigError, match="different config"):
        run(job_config(tiny_model_dirs["llama"], tmp_path, "max_new_tokens=5"), run_dir, show_progress=False)


def test_wandb_offline_run_dir(tiny_model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    run(job_config(tiny_model_dirs["llama"], tmp_path, "tracker=wandb", "experiment_name=unit"), run_dir, show_progress=False)
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("run-*.wandb"))
    tables = list(offline[0].glob("files/media/table/prompts_*.table.json"))
    assert tables
    table = json.loads(tables[0].read_text())
    assert "tau" in table["columns"] and len(table["data"]) == 3


def test_speculative_job_measures_against_a_reused_ar_reference(tiny_model_dirs, tmp_path):
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "method=pld")
    first = run(cfg, tmp_path / "run1", show_progress=False)
    assert first["match_rate"] == 1.0 and first["speedup"] > 0 and first["ar_tokens_per_s"] > 0
    ref_dirs = list((tmp_path / "outputs" / "ar_reference").iterdir())
    assert len(ref_dirs) == 1
    ref_rows = (ref_dirs[0] / "results.jsonl").read_text()
    second = run(cfg, tmp_path / "run2", show_progress=False)
    # same fingerprint: the reference is reused, not regenerated
    assert (ref_dirs[0] / "results.jsonl").read_text() == ref_rows
    assert second["ar_tokens_per_s"] == first["ar_tokens_per_s"]
    # another temperature is another fingerprint
    run(job_config(tiny_model_dirs["llama"], tmp_path, "method=pld", "temperature=1.0"), tmp_path / "run3",
        show_progress=False)
    assert len(list((tmp_path / "outputs" / "ar_reference").iterdir())) == 2
