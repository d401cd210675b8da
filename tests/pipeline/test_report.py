"""`python -m pipeline.report`: real runs of the runner on a tiny model, aggregated into one table
(Markdown, CSV), plots, notes on failed/unfinished jobs, and the W&B comparison run."""

import csv
import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from pipeline import report
from pipeline.runner import run
from pipeline.schema import register_configs

register_configs()


@pytest.fixture(scope="module")
def sweep_dir(tiny_model_dirs, tmp_path_factory) -> Path:
    """A sweep-shaped dir: AR, PLD with defaults and PLD with 4 draft tokens, one failed job recorded by
    the launcher, one unfinished run."""
    root = tmp_path_factory.mktemp("report")
    sweep = root / "sweep"
    for num, overrides in enumerate([["method=ar"], ["method=pld"], ["method=pld", "method.num_draft_tokens=4"]]):
        with initialize_config_module(config_module="conf", version_base="1.3"):
            cfg = compose("config", overrides=[
                "model=smollm2-135m", "model.source=hub", "model.dtype=float32",
                f"model.path={tiny_model_dirs['llama']}",
                "model.name=tiny-llama", "task=humaneval", "task.limit=2", "max_new_tokens=10", "tracker=none",
                f"outputs_root={root / 'outputs'}", "experiment_name=unit_sweep", *overrides])
        run(cfg, sweep / f"{num}_{overrides[0][7:]}_humaneval", show_progress=False)
    unfinished = sweep / "3_pld_gsm8k"
    unfinished.mkdir()
    (unfinished / "run_config.yaml").write_text("method: {}\n")
    (unfinished / "results.jsonl").write_text('{"id": "a"}\n')
    (sweep / "jobs.json").write_text(json.dumps({"4": {
        "num": 4, "overrides": ["method=pld", "task=mbpp"], "status": "FAILED", "run_dir": str(sweep / "4_pld_mbpp"),
        "error": "JobError: TaskDataError: mbpp needs task.path offline"}}))
    return sweep


def test_one_row_per_method_and_setting_with_the_runners_numbers(sweep_dir):
    collected = report.collect([sweep_dir])
    rows = collected.rows
    assert [(r["method"], r["settings"]) for r in rows] == [("ar", ""), ("pld", ""), ("pld", "num_draft_tokens=4")]
    for r in rows:
        summary = json.loads((Path(r["run_dir"]) / "summary.json").read_text())
        assert r["speedup"] == summary["speedup"] and r["tau"] == summary["tau"]
        assert r["quality"] == summary["quality"]["pass@1"] and r["num_prompts"] == 2
    ar, pld = rows[0], rows[1]
    assert ar["speedup"] == 1.0 and ar["rejection_rate"] is None and ar["ar_reference"] is None
    summary = json.loads((Path(pld["run_dir"]) / "summary.json").read_text())
    assert pld["rejection_rate"] == pytest.approx(1 - summary["num_accepted_tokens"] / summary["num_draft_tokens"])
    assert pld["match_rate"] == 1.0 and pld["ar_reference"] == rows[2]["ar_reference"]  # one shared AR reference
    notes = "\n".join(collected.notes)
    assert "job #4 (method=pld task=mbpp) FAILED: JobError: TaskDataError" in notes
    assert "3_pld_gsm8k: no summary.json (unfinished or failed; 1 prompts in results.jsonl)" in notes


def test_main_writes_markdown_csv_and_plots(sweep_dir, tmp_path):
    bench = tmp_path / "bench.txt"
    bench.write_text("model=smollm2-135m threads=2\nforward cost with a 300-token cache (tree block, float mask)\n"
                     "  n=   1:     83.0 ms   ( 1.00x of n=1)\n  n=   8:    103.1 ms   ( 1.24x of n=1)\n")
    out = tmp_path / "out"
    assert report.main([str(sweep_dir), "--out", str(out), "--forward-cost", str(bench)]) == 0
    markdown = (out / "report.md").read_text()
    assert "| model | task | T | method | settings | n | speedup | τ | DE |" in markdown
    assert "| tiny-llama | humaneval | 0 | ar |  | 2 | 1.00x | 1.000 | 1.000 |" in markdown
    assert "num_draft_tokens=4" in markdown and "Notes:" in markdown
    with (out / "report.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 3 and table[0]["method"] == "ar" and float(table[1]["speedup"]) > 0
    for png in ("speedup.png", "tau.png", "forward_cost.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert not (out / "quality_vs_speedup.png").exists()  # no lossy method in this sweep


def test_quality_vs_speedup_is_drawn_for_lossy_methods(sweep_dir, tmp_path):
    lossy = tmp_path / "lossy_run"
    shutil.copytree(sweep_dir / "1_pld_humaneval", lossy)
    summary = json.loads((lossy / "summary.json").read_text())
    summary.update(method="cascade_like", lossless=False, quality={"pass@1": 0.5}, speedup=1.7)  # a lossy run's shape
    (lossy / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "out"
    assert report.main([str(sweep_dir), str(lossy), "--out", str(out)]) == 0
    assert (out / "quality_vs_speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_one_line(sweep_dir, tmp_path, capsys):
    assert report.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing'} does not exist"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main([str(empty)]) == 2
    assert capsys.readouterr().err.strip() == f"error: no summary.json found under {empty}"
    broken = tmp_path / "broken"
    shutil.copytree(sweep_dir / "0_ar_humaneval", broken)
    (broken / "summary.json").write_text("{not json")
    collected = report.collect([sweep_dir, broken])
    assert len(collected.rows) == 3  # the others are kept
    assert any(n.startswith(f"skipped {broken / 'summary.json'}: unreadable summary") for n in collected.notes)


def test_wandb_comparison_run_has_the_table_and_images(sweep_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "out"
    assert report.main([str(sweep_dir), "--out", str(out), "--wandb"]) == 0
    [offline] = list((out / "wandb").glob("offline-run-*"))
    [table_file] = offline.glob("files/media/table/comparison_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:4] == ["model", "task", "temperature", "method"] and len(table["data"]) == 3
    assert len(list(offline.glob("files/media/images/*.png"))) == 2  # speedup, tau


def test_a_sampled_chain_saved_before_verify_existed_is_labelled_rejection(tmp_path):
    """Runs saved before `method.verify` (2026-12-05) verified a sampled Domino/DFlash chain by rejection
    sampling; without a label they would share a row with today's exact-match runs."""
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, verify in ((old, ""), (new, "  verify: exact\n")):
        folder.mkdir()
        (folder / "run_config.yaml").write_text("method:\n  name: domino\n  sample_draft: true\n" + verify)
    assert report.method_settings(report.read_run_config(old), "domino") == "verify=rejection"
    assert report.method_settings(report.read_run_config(new), "domino") == ""
    (old / "run_config.yaml").write_text("method:\n  name: dflash\n")  # a greedy DFlash chain: nothing to label
    assert report.method_settings(report.read_run_config(old), "dflash") == ""


def test_runs_that_differ_outside_the_method_are_separate_rows_told_apart(tiny_model_dirs, tmp_path):
    """A sweep over drafter= or max_new_tokens= used to collapse into one row (the older run dropped as
    "superseded"); the rows now stay and name the setting they differ in. AR ignores the drafter."""
    sweep = tmp_path / "sweep"
    runs = [["method=ar"], ["method=ar", "drafter.exit_layer=1"],
            ["method=sd", "drafter.exit_layer=1"], ["method=sd", "drafter.exit_layer=2"],
            ["method=sd", "drafter=qwen3-0.6b", f"drafter.model.path={tiny_model_dirs['qwen3']}",
             "drafter.model.source=hub", "drafter.model.dtype=float32"],
            ["method=pld"], ["method=pld", "max_new_tokens=6"]]
    for num, overrides in enumerate(runs):
        with initialize_config_module(config_module="conf", version_base="1.3"):
            cfg = compose("config", overrides=[
                "model=smollm2-135m", "model.source=hub", "model.dtype=float32",
                f"model.path={tiny_model_dirs['llama']}",
                "model.name=tiny-llama", "task=humaneval", "task.limit=1", "max_new_tokens=8", "tracker=none",
                "drafter=early_exit", f"outputs_root={tmp_path / 'outputs'}", *overrides])
        run(cfg, sweep / f"{num}", show_progress=False)
    collected = report.collect([sweep])
    rows = sorted((r["method"], r["settings"]) for r in collected.rows)
    assert rows[:3] == [("ar", ""), ("pld", "max_new_tokens=6"), ("pld", "max_new_tokens=8")]
    sd = [settings.split() for method, settings in rows[3:]]  # one k=v per differing setting, nested ones dotted
    assert len(sd) == 3 and len({tuple(s) for s in sd}) == 3 and all(len(s) == len(sd[0]) for s in sd)
    assert "drafter.exit_layer=1" in sd[0] and "drafter.exit_layer=2" in sd[1]
    assert f"drafter.model.path={tiny_model_dirs['qwen3']}" in sd[2] and "drafter.kind=model" in sd[2]
    assert [n for n in collected.notes if "superseded" in n] == [f"{sweep / '0'} is superseded by a newer run of "
                                                                 "the same configuration"]


def test_a_lossy_run_at_t0_reports_how_much_of_ars_text_it_kept(tmp_path):
    from pipeline.summary import compare_to_reference, prefix_agreement
    from pipeline.table import match_cell

    assert prefix_agreement([[1, 2, 3], [4]], [[1, 2, 9], [4]]) == 0.5  # turns in order: 2 of AR's 4 tokens
    assert prefix_agreement([[1, 2]], [[1, 2]]) == 1.0 and prefix_agreement([[5]], [[1, 2]]) == 0.0
    from decoding.engine.metrics import GenerationStats

    def row(id_, wall_s, ids):
        return {"id": id_, **GenerationStats(new_tokens=4, wall_s=wall_s).to_dict(), "output_ids": [ids]}

    rows = [row("a", 1.0, [1, 2, 3, 4]), row("b", 1.0, [1, 2, 3, 4])]
    reference = [row("a", 2.0, [1, 2, 3, 4]), row("b", 2.0, [1, 7, 3, 4])]
    out = compare_to_reference(rows, reference, check_match=False, check_agreement=True)
    assert out["ar_prefix_agreement"] == pytest.approx((1.0 + 0.25) / 2) and "match_rate" not in out
    assert match_cell({"match_rate": None, "ar_prefix_agreement": 0.625}) == "prefix 0.62"


def test_a_lossy_job_at_t0_has_its_ar_prefix_agreement_in_the_summary(tiny_model_dirs, tmp_path):
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=smollm2-135m", "model.source=hub", "model.dtype=float32", f"model.path={tiny_model_dirs['llama']}",
            "model.name=tiny-llama", "task=humaneval", "task.limit=2", "max_new_tokens=12", "tracker=none",
            "method=spec_cascade", "method.alpha=0.5", "drafter=early_exit", "drafter.exit_layer=2",
            f"outputs_root={tmp_path / 'outputs'}"])
    summary = run(cfg, tmp_path / "run", show_progress=False)
    assert 0.0 <= summary["ar_prefix_agreement"] <= 1.0 and "match_rate" not in summary
    row = report.collect([tmp_path / "run"]).rows[0]
    assert row["ar_prefix_agreement"] == summary["ar_prefix_agreement"]


def test_a_run_whose_config_lacks_a_newer_field_is_still_superseded():
    def row(mtime, run):
        return {"model": "m", "task": "t", "temperature": 0.0, "method": "sd", "settings": "", "_run": run,
                "_mtime": mtime, "run_dir": f"run{mtime}"}

    old = row(1, {"seed": "0"})  # saved before max_new_tokens was recorded
    rows, dropped = report.latest_per_key([old, row(2, {"seed": "0", "max_new_tokens": "8"}),
                                           row(3, {"seed": "1", "max_new_tokens": "8"})])
    assert dropped == ["run1"] and [r["settings"] for r in rows] == ["seed=0", "seed=1"]


def test_the_report_keeps_a_full_run_apart_from_a_limited_one(tmp_path):
    """task.limit=null (every prompt) is a value, not a missing setting: a later 5-prompt run of the same
    label must not supersede the full run."""
    for name, limit in (("full", "null"), ("five", "5")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run_config.yaml").write_text(f"task:\n  limit: {limit}\nmax_new_tokens: 8\n")
    full, five = (report.run_fields(report.read_run_config(tmp_path / name), "ar", None) for name in ("full", "five"))
    assert full["task.limit"] == "null" and not report.same_run_settings(full, five)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run_config.yaml").write_text("max_new_tokens: 8\n")  # a run that recorded no limit
    assert report.same_run_settings(report.run_fields(report.read_run_config(tmp_path / "old"), "ar", None), five)
