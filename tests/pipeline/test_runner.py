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
        "model=smollm2-135m", "model.source=hub", "model.dtype=float32", f"model.path={tiny_dir}", "model.name=tiny-llama",
        "task=humaneval", "task.limit=3", "max_new_tokens=12", "tracker=none", f"outputs_root={tmp_path / 'outputs'}",
        *extra,
    ]
    if not any(o.startswith(("method=", "methods=")) for o in extra):
        overrides.append("method=ar")
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


def test_a_code_task_records_the_isolation_its_programs_ran_under(tiny_model_dirs, tmp_path):
    summary = run(job_config(tiny_model_dirs["llama"], tmp_path, "method=ar", "task.limit=1"), tmp_path / "run",
                  show_progress=False)
    assert summary["sandbox"] == "bwrap"  # task.sandbox=auto, with bubblewrap installed (.ci/run)
    gsm = run(job_config(tiny_model_dirs["llama"], tmp_path, "method=ar", "task=gsm8k", "task.limit=1"),
              tmp_path / "run_gsm", show_progress=False)
    assert gsm["sandbox"] is None  # no generated code runs


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


def test_an_ar_reference_is_not_reused_across_engine_code(tiny_model_dirs, tmp_path, monkeypatch):
    """A reference timed on older engine code would credit methods with the engine's changes."""
    import pipeline.runner as runner

    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "method=pld", "task.limit=1")
    run(cfg, tmp_path / "run1", show_progress=False)
    current = runner.engine_digest()
    monkeypatch.setattr(runner, "engine_digest", lambda: "other-engine")
    run(cfg, tmp_path / "run2", show_progress=False)
    fingerprints = [json.loads((d / "fingerprint.json").read_text())
                    for d in (tmp_path / "outputs" / "ar_reference").iterdir()]
    assert sorted(f["engine"] for f in fingerprints) == sorted([current, "other-engine"])


def test_a_bf16_job_records_its_dtype_and_diagnoses_every_mismatch(tiny_model_dirs, tmp_path):
    """bf16: a lossless method may leave AR at near-ties; every mismatching prompt is classified."""
    summary = run(job_config(tiny_model_dirs["llama"], tmp_path, "method=pld", "model.dtype=bfloat16",
                             "task.limit=4", "max_new_tokens=24"), tmp_path / "run", show_progress=False)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["dtype"] == "bfloat16" and saved["chat_template_kwargs"] == {}
    from pipeline.models import cpu_has_native_bf16

    assert (saved["packed_linears"] > 0) == cpu_has_native_bf16()  # model.prepack_linear=null (auto)
    assert summary["match_ties"] + summary["match_divergences"] == len(summary["mismatched_ids"])
    assert [d["id"] for d in summary["mismatch_diagnosis"]] == summary["mismatched_ids"]
    assert summary["match_divergences"] == 0 and summary["divergent_ids"] == []


def test_a_real_divergence_is_named_in_a_warning(tiny_model_dirs, tmp_path, monkeypatch, caplog):
    import decoding.engine.loop as engine
    from decoding.engine.acceptance import Verdict, accept_greedy

    def keeps_a_rejected_draft(tree, logits, also=()):
        verdict = accept_greedy(tree, logits, also)
        if tree.children[0] and not verdict.num_accepted:
            return Verdict([0, tree.children[0][0]], verdict.bonus, verdict.reads)
        return verdict

    monkeypatch.setattr(engine, "accept_greedy", keeps_a_rejected_draft)
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "method=pld", "task.limit=4", "max_new_tokens=24")
    with caplog.at_level("WARNING"):
        summary = run(cfg, tmp_path / "run", show_progress=False)
    assert summary["match_divergences"] > 0 and summary["divergent_ids"]
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("beyond a numeric near-tie" in w and summary["divergent_ids"][0] in w for w in warning)


def test_chat_template_kwargs_reach_the_template_and_the_summary(tiny_model_dirs, tmp_path, monkeypatch):
    """Qwen3's enable_thinking=false: a template that reads the flag sees it in every prompt."""
    import shutil

    from transformers import AutoTokenizer

    import pipeline.generation as generation

    model_dir = tmp_path / "thinking_model"
    shutil.copytree(tiny_model_dirs["llama"], model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = ("{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}<|assistant|>"
                         "{% if enable_thinking is defined and not enable_thinking %}nothink:{% endif %}")
    tok.save_pretrained(model_dir)
    prompts = []
    real_generate = generation.generate

    def spy(method, target, prompt_ids, **kwargs):
        prompts.append(target.tokenizer.decode(prompt_ids))
        return real_generate(method, target, prompt_ids, **kwargs)

    monkeypatch.setattr(generation, "generate", spy)
    summary = run(job_config(model_dir, tmp_path, "+model.chat_template_kwargs.enable_thinking=false", "warmup=0"),
                  tmp_path / "run", show_progress=False)
    assert prompts and all(p.endswith("<|assistant|>nothink:") for p in prompts)
    assert summary["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_run_ends_with_a_rounded_table_printed_logged_and_in_summary_md(tiny_model_dirs, tmp_path, capsys, caplog):
    import logging

    log_file = logging.FileHandler(tmp_path / "job.log")  # as Hydra's job logging has one
    logging.getLogger().addHandler(log_file)
    try:
        with caplog.at_level("INFO"):
            summary = run(job_config(tiny_model_dirs["llama"], tmp_path, "method=pld"), tmp_path / "run",
                          show_progress=False)
    finally:
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    printed = capsys.readouterr().out
    logged = (tmp_path / "job.log").read_text()
    assert "results (tiny-llama on humaneval, T=0):" in logged
    assert "\npld " in logged and printed.count("\npld ") == 1
    header = next(line for line in printed.splitlines() if line.startswith("method"))
    assert all(col in header for col in ("tok/s", "AR tok/s", "speedup", "τ", "DE", "match vs AR", "AR quality"))
    row = next(line for line in printed.splitlines() if line.startswith("pld"))
    assert f"{summary['speedup']:.2f}x" in row and f"{summary['tokens_per_s']:.1f}" in row and "pass@1" in row
    assert str(summary["tokens_per_s"]) not in printed  # rounded, not the raw float
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "| pld | humaneval | 3 |" in md and "Speedup: tokens/s" in md
    messages = [r.getMessage() for r in caplog.records]
    # stderr is no terminal here: one progress line per finished prompt, with tok/s and tau
    assert sum(m.startswith("pld ") and "/3 HumanEval/" in m and "tok/s, tau" in m for m in messages) == 3


def test_methods_compared_in_one_job_interleaved_per_prompt_ar_first(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    import pipeline.runner as runner

    calls = []
    real = runner.generate_example

    def recording(method, target, task_cfg, example, settings, on_step=None):
        calls.append((method.name, example.id))
        return real(method, target, task_cfg, example, settings, on_step)

    monkeypatch.setattr(runner, "generate_example", recording)
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=2", "methods=[pld,ptd]")
    run_dir = tmp_path / "run"
    comparison = run(cfg, run_dir, show_progress=False)
    ids = ["HumanEval/0", "HumanEval/1"]
    assert calls == [(m, i) for i in ids for m in ("ar", "pld", "ptd")]
    by_name = {s["method"]: s for s in comparison["methods"]}
    assert list(by_name) == ["ar", "pld", "ptd"]
    assert by_name["pld"]["match_rate"] == 1.0 and by_name["ptd"]["match_rate"] == 1.0  # lossless, same job's AR
    ar_tps = by_name["ar"]["tokens_per_s"]
    assert by_name["ptd"]["speedup"] == pytest.approx(by_name["ptd"]["tokens_per_s"] / ar_tps)
    for name in by_name:
        assert [r["id"] for r in read_rows(run_dir / name / "results.jsonl")] == ids
        assert json.loads((run_dir / name / "summary.json").read_text())["method"] == name
    printed = capsys.readouterr().out
    assert [line.split()[0] for line in printed.splitlines() if line.split()[:1] in (["ar"], ["pld"], ["ptd"])] == \
        ["ar", "pld", "ptd"]
    md = (run_dir / "summary.md").read_text()
    assert all(f"| {name} | humaneval | 2 |" in md for name in by_name)

    calls.clear()  # rerun into the same dir: every prompt of every method is finished, nothing runs again
    again = run(cfg, run_dir, show_progress=False)
    assert calls == [] and [s["tokens_per_s"] for s in again["methods"]] == [s["tokens_per_s"] for s in comparison["methods"]]

    from pipeline.report import collect  # the report reads the comparison as three runs, nothing unfinished
    collected = collect([run_dir])
    assert [r["method"] for r in collected.rows] == ["ar", "pld", "ptd"] and collected.notes == []


def test_a_method_failing_in_a_comparison_is_recorded_and_the_others_go_on(tiny_model_dirs, tmp_path, monkeypatch,
                                                                          capsys, caplog):
    import pipeline.runner as runner

    real = runner.generate_example

    def pld_fails_on_the_second_prompt(method, target, task_cfg, example, settings, on_step=None):
        if method.name == "pld" and example.id == "HumanEval/1":
            raise RuntimeError("CUDA out of memory\n(details)")
        return real(method, target, task_cfg, example, settings, on_step)

    monkeypatch.setattr(runner, "generate_example", pld_fails_on_the_second_prompt)
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=3", "methods=[pld,ptd]")
    run_dir = tmp_path / "run"
    comparison = run(cfg, run_dir, show_progress=False)
    assert [s["method"] for s in comparison["methods"]] == ["ar", "ptd"]
    assert comparison["failed"] == {"pld": "RuntimeError: CUDA out of memory"}
    assert comparison["methods"][1]["num_prompts"] == 3  # ptd ran every prompt after pld stopped
    assert [r["id"] for r in read_rows(run_dir / "pld" / "results.jsonl")] == ["HumanEval/0"]  # kept
    assert not (run_dir / "pld" / "summary.json").exists()
    assert "CUDA out of memory" in json.loads((run_dir / "pld" / "failed.json").read_text())["traceback"]
    assert any(line.startswith("pld (failed)") for line in capsys.readouterr().out.splitlines())
    assert any(r.levelname == "ERROR" and "pld failed after 1 prompt(s): RuntimeError: CUDA out of memory"
               in r.getMessage() for r in caplog.records)
    from pipeline.report import collect

    collected = collect([run_dir])
    assert [r["method"] for r in collected.rows] == ["ar", "ptd"]
    assert collected.notes == [f"{run_dir / 'pld'}: no summary.json (failed: RuntimeError: CUDA out of memory; "
                               "1 prompts in results.jsonl)"]

    monkeypatch.setattr(runner, "generate_example", real)  # a rerun tries the failed method again, from prompt 2
    again = run(cfg, run_dir, show_progress=False)
    assert [s["method"] for s in again["methods"]] == ["ar", "pld", "ptd"] and "failed" not in again
    assert not (run_dir / "pld" / "failed.json").exists()


def test_ar_failing_in_a_comparison_fails_the_job(tiny_model_dirs, tmp_path, monkeypatch):
    import pipeline.runner as runner

    def ar_fails(method, *args, **kwargs):
        raise RuntimeError("broken")

    monkeypatch.setattr(runner, "generate_example", ar_fails)
    with pytest.raises(RuntimeError, match="broken"):  # AR is every ratio's reference: nothing to compare against
        run(job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=1", "methods=[pld]"), tmp_path / "run",
            show_progress=False)


def test_an_unknown_method_in_methods_is_one_line(tiny_model_dirs, tmp_path):
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match=r"methods: 'nope' is not a method option; choose from: .*ptd"):
        run(job_config(tiny_model_dirs["llama"], tmp_path, "methods=[pld,nope]"), tmp_path / "run", show_progress=False)


def test_a_rerun_into_its_run_dir_continues_the_same_wandb_run(tiny_model_dirs, tmp_path, monkeypatch):
    """A requeued Slurm job reruns in its run dir: it resumes the W&B run (same id), not a second one."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "tracker=wandb", "task.limit=1")
    run(cfg, run_dir, show_progress=False)
    run_id = (run_dir / "wandb_run_id").read_text()
    run(cfg, run_dir, show_progress=False)
    assert (run_dir / "wandb_run_id").read_text() == run_id
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(f"-{run_id}" in d.name for d in offline)  # (W&B adds -1 within one second)
    other = tmp_path / "other"
    run(cfg, other, show_progress=False)
    assert (other / "wandb_run_id").read_text() != run_id


def test_the_summary_records_provenance(tiny_model_dirs, tmp_path):
    import torch
    import transformers

    summary = run(job_config(tiny_model_dirs["llama"], tmp_path, "task=gsm8k", "task.limit=1"), tmp_path / "run",
                  show_progress=False)
    origin = json.loads((tmp_path / "run" / "summary.json").read_text())["provenance"]
    assert origin == summary["provenance"]
    assert len(origin["git"]["commit"]) == 40 and isinstance(origin["git"]["dirty"], bool)
    assert origin["versions"]["torch"] == torch.__version__.split("+")[0] or origin["versions"]["torch"] == torch.__version__
    assert origin["versions"]["transformers"] == transformers.__version__
    assert origin["model"]["id"] == str(tiny_model_dirs["llama"]) and origin["model"]["name"] == "tiny-llama"
    assert origin["dataset"]["task"] == "gsm8k" and origin["dataset"]["path"].endswith("assets/data/gsm8k_test.jsonl")
    assert len(origin["dataset"]["sha256"]) == 16 and origin["dataset"]["limit"] == 1
    assert origin["dtype"] == "float32" and origin["device"] == "cpu" and origin["threads"] >= 1


def test_repeats_run_every_prompt_n_times_and_report_speedup_mean_and_std(tiny_model_dirs, tmp_path, capsys):
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=2", "methods=[pld]", "repeats=3")
    comparison = run(cfg, tmp_path / "run", show_progress=False)
    ar, pld = comparison["methods"]
    ids = [r["id"] for r in read_rows(tmp_path / "run" / "pld" / "results.jsonl")]
    assert ids == ["HumanEval/0", "HumanEval/1", "HumanEval/0#1", "HumanEval/1#1", "HumanEval/0#2", "HumanEval/1#2"]
    assert pld["repeats"] == 3 and len(pld["speedup_per_repeat"]) == 3 and pld["num_prompts"] == 6
    import statistics

    assert pld["speedup_std"] == pytest.approx(statistics.stdev(pld["speedup_per_repeat"]))
    assert pld["match_rate"] == 1.0  # greedy repeats of a lossless method still equal AR, row by row
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("pld"))
    assert f"{pld['speedup']:.2f}x ± {pld['speedup_std']:.2f}" in row


def test_a_spec_bench_run_breaks_results_down_by_category(tiny_model_dirs, tmp_path, capsys):
    rows = [{"question_id": i, "category": c, "turns": [f"Say {c} {i}."]}
            for i, c in enumerate(["translation", "rag", "translation", "qa"])]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "task=spec_bench", f"task.path={path}", "task.limit=4",
                     "methods=[pld]")
    comparison = run(cfg, tmp_path / "run", show_progress=False)
    pld = comparison["methods"][1]
    assert {c: e["num_prompts"] for c, e in pld["by_category"].items()} == {"qa": 1, "rag": 1, "translation": 2}
    assert all(e["speedup"] > 0 and e["tau"] >= 1 for e in pld["by_category"].values())
    assert [r["category"] for r in read_rows(tmp_path / "run" / "pld" / "results.jsonl")] == \
        ["translation", "rag", "translation", "qa"]
    printed = capsys.readouterr().out
    assert "by category" in printed and any(line.split()[:2] == ["pld", "translation"] for line in printed.splitlines())
    assert "| pld | rag | 1 |" in (tmp_path / "run" / "summary.md").read_text()
    from pipeline.report import collect, to_markdown

    assert "By category" in to_markdown(collect([tmp_path / "run"]))


def test_methods_entries_may_carry_settings_for_variants_of_one_option(tiny_model_dirs, tmp_path, capsys):
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=1",
                     "methods=[pld,'pld num_draft_tokens=2','pld max_ngram_size=1 num_draft_tokens=4']")
    comparison = run(cfg, tmp_path / "run", show_progress=False)
    dirs = sorted(p.name for p in (tmp_path / "run").iterdir() if (p / "summary.json").exists())
    assert dirs == ["ar", "pld", "pld_max_ngram_size=1_num_draft_tokens=4", "pld_num_draft_tokens=2"]
    assert [s["method"] for s in comparison["methods"]] == ["ar", "pld", "pld", "pld"]
    printed = capsys.readouterr().out
    assert [line.split()[0] for line in printed.splitlines() if line.startswith("pld")] == \
        ["pld", "pld_num_draft_tokens=2", "pld_max_ngram_size=1_num_draft_tokens=4"]
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="methods: 'pld gamma=3': unknown config key 'method.gamma'"):
        run(job_config(tiny_model_dirs["llama"], tmp_path, "methods=['pld gamma=3']"), tmp_path / "bad",
            show_progress=False)


def test_compared_methods_resolve_against_the_jobs_model_not_the_default_one(tiny_model_dirs, tmp_path):
    from pipeline.runner import compose_methods

    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        job = compose("config", overrides=["model=qwen3-4b", "methods=[dflash,via_sd]"])
        configs, labels, _ = compose_methods(list(job.methods), job)
    assert labels == ["ar", "dflash", "via_sd"]
    assert configs[1].drafter == "z-lab/Qwen3-4B-DFlash-b16" and configs[2].mask == "qwen3-4b-dimr"


def test_a_methods_entry_can_bring_its_own_drafter(tiny_model_dirs, tmp_path):
    """'sd drafter=eagle3' next to plain sd: one job compares the same method with two drafters."""
    from pipeline.runner import compose_methods

    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        job = compose("config", overrides=["model=qwen3-8b", "methods=[sd,'sd drafter=eagle3','sd drafter.gamma=3']"])
        configs, labels, drafters = compose_methods(list(job.methods), job)
    assert labels == ["ar", "sd", "sd_drafter=eagle3", "sd_drafter.gamma=3"]
    assert drafters[1] is None  # the job's drafter
    assert drafters[2].kind == "eagle3" and drafters[2].checkpoint == "AngelSlim/Qwen3-8B_eagle3"
    assert drafters[3].gamma == 3 and drafters[3].kind == "early_exit"  # the job's drafter, with γ = 3
    with initialize_config_module(config_module="conf", version_base="1.3"):
        job = compose("config", overrides=["model=qwen3-8b", "drafter=eagle3", "methods=['sd drafter.gamma=3']"])
        _, _, drafters = compose_methods(list(job.methods), job)
    assert drafters[1].kind == "eagle3" and drafters[1].gamma == 3  # fields apply to the job's own drafter
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="drafter=nope"):
        with initialize_config_module(config_module="conf", version_base="1.3"):
            compose_methods(["sd drafter=nope"], compose("config", overrides=["model=qwen3-8b"]))


def test_a_methods_entry_sets_the_checkpoint_of_a_method_with_its_own_drafter_field(tiny_model_dirs, tmp_path):
    """'eagle3 drafter=<folder>' next to plain eagle3: two checkpoints of one method in one job (the method's
    own `drafter` field, not the drafter config group, which eagle3 does not use)."""
    from pipeline.runner import compose_methods

    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        job = compose("config", overrides=["model=qwen3-8b"])
        configs, labels, drafters = compose_methods(["eagle3", "eagle3 drafter=/ckpt/old tree=false"], job)
    assert labels == ["ar", "eagle3", "eagle3_drafter=-ckpt-old_tree=false"]
    assert configs[1].drafter == "AngelSlim/Qwen3-8B_eagle3" and configs[2].drafter == "/ckpt/old"
    assert configs[2].tree is False and drafters == [None, None, None]


def test_a_comparison_run_dir_refuses_a_different_config(tiny_model_dirs, tmp_path):
    from pipeline.errors import ConfigError

    run(job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=1", "methods=[pld]"), tmp_path / "run",
        show_progress=False)
    with pytest.raises(ConfigError, match="holds results of a different config"):
        run(job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=2", "methods=[pld]"), tmp_path / "run",
            show_progress=False)


def test_the_provenance_names_the_drafter_folder_and_weights_a_job_loaded(tiny_model_dirs, tmp_path):
    from decoding.drafting.dflash_drafter import weights_digest
    from pipeline.zoo import save_random_drafters

    from transformers import AutoModelForCausalLM

    from decoding.engine.target import TargetModel

    target = TargetModel(AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"]))
    folder = Path(save_random_drafters(target, tmp_path / "drafters")["dflash"])
    cfg = job_config(tiny_model_dirs["llama"], tmp_path, "method=dflash", f"method.drafter={folder}", "task.limit=1")
    origin = run(cfg, tmp_path / "run", show_progress=False)["provenance"]
    assert origin["checkpoints"] == {str(folder): {"folder": str(folder.resolve()), "sha256": weights_digest(folder)}}
    assert len(origin["checkpoints"][str(folder)]["sha256"]) == 16
    ar_only = run(job_config(tiny_model_dirs["llama"], tmp_path, "task.limit=1"), tmp_path / "ar", show_progress=False)
    assert ar_only["provenance"]["checkpoints"] == {}  # the earlier job's drafter is not this job's


def test_model_cuda_graph_reaches_the_target_and_decodes_as_the_eager_job(tiny_model_dirs, tmp_path, monkeypatch):
    """model.cuda_graph=true, with the replay emulated as the CPU tests do (decoding/engine/static_forward.py):
    the job's target replays its forwards and gives the eager job's tokens; off CUDA the option does nothing."""
    from decoding.engine import cuda_graph
    from decoding.engine.cuda_graph import GraphReplayer

    built = []

    def emulated(device, enabled, what):
        built.append(GraphReplayer(enabled, what, emulate=True))
        return built[-1]

    eager = run(job_config(tiny_model_dirs["llama"], tmp_path, "method=ptd"), tmp_path / "eager", show_progress=False)
    assert cuda_graph.graphs_for("cpu", True, "model.cuda_graph").enabled is False  # a CPU: no graphs
    monkeypatch.setattr(cuda_graph, "graphs_for", emulated)
    run(job_config(tiny_model_dirs["llama"], tmp_path, "method=ptd", "model.cuda_graph=true"), tmp_path / "graphed",
        show_progress=False)
    assert built[0].enabled and built[0].what == "model.cuda_graph" and built[0].captures >= 2  # AR and ptd buckets
    outputs = [[r["output_ids"] for r in read_rows(tmp_path / d / "results.jsonl")] for d in ("eager", "graphed")]
    assert outputs[0] == outputs[1] and eager["num_prompts"] == 3
