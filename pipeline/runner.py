"""One job: load model and task, run the AR reference (or reuse a matching one) and the method, or
compare several methods interleaved per prompt (`methods=[...]`); write results.jsonl /
summary.json / summary.md, print the results table and log to the tracker."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import platform
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from decoding.drafting.dflash_drafter import forget_resolved
from decoding.engine.loop import Method
from decoding.engine.packed_linear import pack_like_target
from decoding.engine.target import TargetModel
from pipeline import provenance, table
from pipeline.errors import named_line
from pipeline.generation import (GenerationSettings, append_result, diagnose_mismatches, generate_example,
                                 read_results, run_examples, warm_up)
from pipeline.models import load_model, stop_token_ids, target_model
from pipeline.progress import RunProgress
from pipeline.report import summary_row
from pipeline.schema import RunConfig
from pipeline.summary import add_tie_diagnosis, summarize
from pipeline.tasks.loaders import load_task, repeat_examples
from pipeline.tasks.sandbox import configure as configure_sandbox
from pipeline.tasks.scoring import CODE_TASKS
from pipeline.tracking import make_tracker

log = logging.getLogger(__name__)


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Instantiate the dataclasses, which runs every schema's value checks (__post_init__)."""
    return OmegaConf.to_object(cfg)


def build_method(method_cfg, target: TargetModel, drafter_cfg=None) -> Method:
    cls = get_class(method_cfg._target_)
    method = cls(method_cfg, drafter=drafter_cfg) if getattr(cls, "uses_drafter", False) else cls(method_cfg)
    method.setup(target)
    pack_like_target(method, target)  # the drafters it loaded run as the target does
    return method


def machine_id() -> dict:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or platform.machine()
    return {"host": platform.node(), "device": device, "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def reference_fingerprint(cfg: RunConfig, settings: GenerationSettings) -> tuple[str, dict]:
    """What makes an AR reference reusable: same model, task, decoding settings and machine."""
    payload = {
        "model": OmegaConf.to_container(OmegaConf.structured(cfg.model)),
        # fields added later are left out at their defaults, so older cached references stay valid
        "task": {k: v for k, v in OmegaConf.to_container(OmegaConf.structured(cfg.task)).items()
                 if not (k == "categories" and not v)},
        "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature, "seed": settings.seed,
        **({"repeats": cfg.repeats} if cfg.repeats > 1 else {}),  # (absent for 1: older references stay valid)
        "warmup": settings.warmup,
        "machine": machine_id(),
        # a reference timed on other engine code would credit (or charge) methods with the engine's changes
        "engine": engine_digest(),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return digest, payload


def engine_digest() -> str:
    """The source of the decoding engine and of AR, which an AR reference's times depend on."""
    import decoding

    root = Path(decoding.__file__).parent
    digest = hashlib.sha256()
    for path in sorted([*(root / "engine").glob("*.py"), root / "methods" / "ar.py"]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@contextmanager
def file_lock(path: Path):
    """Serialise jobs that share an AR reference (e.g. a Slurm array over methods)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_reference(cfg: RunConfig, target, examples, settings, run_dir: Path, show_progress: bool) -> list[dict]:
    from decoding.methods.ar import AR, ARConfig

    digest, payload = reference_fingerprint(cfg, settings)
    ref_dir = (Path(cfg.outputs_root) / "ar_reference" / digest) if cfg.reference.reuse else run_dir / "ar_reference"
    ref_dir.mkdir(parents=True, exist_ok=True)
    (ref_dir / "fingerprint.json").write_text(json.dumps(payload, indent=2))
    results_path = ref_dir / "results.jsonl"
    with file_lock(ref_dir / ".lock"):
        done = len(read_results(results_path))
        with RunProgress("AR reference", len(examples), min(done, len(examples)), show_progress) as progress:
            rows = run_examples(AR(ARConfig()), target, cfg.task, examples, settings, results_path, progress=progress)
    (run_dir / "reference.json").write_text(json.dumps({"dir": str(ref_dir), "fingerprint": digest}))
    return rows


def run(cfg: DictConfig, run_dir: Path, show_progress: bool = True) -> dict:
    """One job. With `method` set it runs that method against AR and returns its summary; without, it
    compares `methods` (AR first) interleaved per prompt and returns {"methods": [summary, ...]}."""
    rc = to_run_config(cfg)
    if rc.threads:
        torch.set_num_threads(rc.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_resume(cfg, run_dir)
    comparing = rc.method is None
    forget_resolved()  # this job's checkpoints only, in provenance (several jobs may share a process)
    method_cfgs, labels, drafter_cfgs = compose_methods(rc.methods, cfg) if comparing else ([rc.method], [], [None])

    sandbox = None
    if rc.task.name in CODE_TASKS:  # generated code will run: check its isolation before generating
        sandbox = configure_sandbox(rc.task.sandbox)
    examples, data_origin = load_task(rc.task)
    examples = repeat_examples(examples, rc.repeats)
    model, tokenizer = load_model(rc.model)
    target = target_model(model, tokenizer, rc.model)
    settings = GenerationSettings(
        max_new_tokens=rc.max_new_tokens or rc.task.max_new_tokens, temperature=rc.temperature,
        seed=rc.seed, stop_ids=stop_token_ids(model, tokenizer), warmup=rc.warmup,
        chat_template_kwargs=dict(rc.model.chat_template_kwargs))
    methods = [build_method(m, target, d or rc.drafter) for m, d in zip(method_cfgs, drafter_cfgs)]

    label = "compare" if comparing else methods[0].name
    origin = provenance.record(rc.model, model, data_origin, target)
    tracker = make_tracker(rc.tracker, {**OmegaConf.to_container(cfg, resolve=True), "provenance": origin}, run_dir,
                           job_type=label, tags=[rc.model.name, rc.task.name, f"T{rc.temperature:g}"])
    failed = {}
    try:
        if comparing:
            summaries, failed = compare(rc, cfg, methods, labels, target, examples, settings, run_dir, show_progress,
                                tracker)
        else:
            summaries = [run_one(rc, methods[0], target, examples, settings, run_dir, show_progress, tracker)]
        for summary, summary_dir in summaries:
            summary.update(dtype=str(target.dtype).removeprefix("torch."), packed_linears=target.packed_linears,
                           chat_template_kwargs=dict(rc.model.chat_template_kwargs), sandbox=sandbox,
                           provenance=origin, run_dir=str(summary_dir))
            (summary_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if comparing:
            tracker.log_summary({**{f"{d.name}/{k}": v for s, d in summaries for k, v in s.items()},
                                 **{f"{label}/failed": error for label, (error, _) in failed.items()}})
        else:
            tracker.log_summary(summaries[0][0])
        rows = [summary_row(s, d) for s, d in summaries]
        if comparing:  # a row is named by its `methods` entry (ptd_tuned, spec_cascade_alpha=0.05)
            rows = [{**r, "method": d.name, "settings": ""} for r, (_, d) in zip(rows, summaries)]
            rows += [{"method": f"{label} (failed)", "task": rc.task.name, "num_prompts": n}
                     for label, (_, n) in failed.items()]
        tracker.log_table("comparison", rows)
        categories = table.category_rows([(d.name if comparing else s["method"], s) for s, d in summaries])
        if categories:
            tracker.log_table("categories", categories)
    finally:
        tracker.finish()
    finish_table(rows, categories, rc, run_dir)
    for summary, summary_dir in summaries:
        if summary.get("divergent_ids"):
            log.warning("%s: %d prompt(s) diverge from AR beyond a numeric near-tie (not explained by %s rounding): "
                        "%s", summary_dir.name if comparing else summary["method"], len(summary["divergent_ids"]),
                        summary["dtype"], ", ".join(summary["divergent_ids"]))
    for label, (error, n) in failed.items():  # again below the table, where a reader looks
        log.error("%s failed after %d prompt(s): %s (traceback in %s)", label, n, error, run_dir / label / "failed.json")
    if comparing:
        comparison = {"methods": [s for s, _ in summaries], "run_dir": str(run_dir),
                      **({"failed": {label: error for label, (error, _) in failed.items()}} if failed else {})}
        (run_dir / "comparison.json").write_text(json.dumps(comparison, indent=2))
        return comparison
    return summaries[0][0]


def run_one(rc: RunConfig, method: Method, target, examples, settings, run_dir: Path, show_progress: bool,
            tracker) -> tuple[dict, Path]:
    """`method` over every example, against the AR reference (run first, or reused)."""
    reference = None
    if method.name != "ar" and rc.reference.enabled:
        reference = run_reference(rc, target, examples, settings, run_dir, show_progress)
    results_path = run_dir / "results.jsonl"
    done = len(read_results(results_path))
    with RunProgress(method.name, len(examples), min(done, len(examples)), show_progress) as progress:
        rows = run_examples(method, target, rc.task, examples, settings, results_path,
                            on_row=tracker.log_prompt, progress=progress)
    tracker.log_table("prompts", [{k: v for k, v in r.items() if k != "output_ids"} for r in rows])
    return finish_summary(rc, method, target, examples, rows, reference, settings), run_dir


def compare(rc: RunConfig, cfg: DictConfig, methods: list[Method], labels: list[str], target, examples, settings,
            run_dir: Path, show_progress: bool, tracker) -> tuple[list[tuple[dict, Path]], dict]:
    """Every method on every prompt, interleaved per prompt with AR first, so each ratio is measured
    under the same machine load (the machine may be shared); one results.jsonl per method in
    <run dir>/<method>/, resumable like a single run. A method that raises is stopped and recorded
    (<its dir>/failed.json; returned as {label: (error, prompts finished)}), the others go on."""
    dirs = [run_dir / label for label in labels]
    done = []
    for method, method_dir in zip(methods, dirs):
        method_dir.mkdir(exist_ok=True)
        (method_dir / "failed.json").unlink(missing_ok=True)  # a resumed comparison tries it again
        config = OmegaConf.to_container(cfg, resolve=True)  # as a single run of this method would have it
        config.update(method=OmegaConf.to_container(OmegaConf.structured(method.config)), methods=[])
        if getattr(method, "uses_drafter", False) and method.drafter_config is not None:  # its own or the job's
            config["drafter"] = OmegaConf.to_container(OmegaConf.structured(method.drafter_config))
        (method_dir / "run_config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
        done.append(read_results(method_dir / "results.jsonl", repair=True))
    failed: dict[str, str] = {}  # label -> one line: a failing method stops, the others go on

    def attempt(method: Method, method_dir: Path, action):
        if method_dir.name in failed:
            return None
        try:
            return action()
        except Exception as err:  # noqa: BLE001 - recorded, shown in the table, the comparison goes on
            if method.name == "ar":
                raise  # AR is every other method's reference
            failed[method_dir.name] = named_line(err)
            (method_dir / "failed.json").write_text(json.dumps(
                {"error": failed[method_dir.name], "traceback": traceback.format_exc()}, indent=2))
            log.error("%s failed (%s); its finished prompts stay in %s, the other methods go on",
                      method_dir.name, failed[method_dir.name], method_dir / "results.jsonl")
            return None

    if settings.warmup:
        for method, method_dir, rows in zip(methods, dirs, done):
            todo = [ex for ex in examples if ex.id not in rows]
            if todo:
                attempt(method, method_dir, lambda: warm_up(method, target, rc.task, todo[0], settings))
    total = len(examples) * len(methods)
    finished = sum(len([ex for ex in examples if ex.id in rows]) for rows in done)
    with RunProgress(" vs ".join(labels), total, finished, show_progress) as progress:
        for example in examples:
            for method, method_dir, rows in zip(methods, dirs, done):
                if example.id in rows:
                    continue
                row = attempt(method, method_dir, lambda: generate_example(
                    method, target, rc.task, example, settings, progress.step_callback()))
                if row is None:
                    continue
                append_result(method_dir / "results.jsonl", row)
                rows[example.id] = row
                progress.finish_example(row, method_dir.name)
                tracker.log_prompt({"method": method_dir.name, **row})
    ordered = [[rows[ex.id] for ex in examples if ex.id in rows] for rows in done]
    tracker.log_table("prompts", [{"method": label, **{k: v for k, v in r.items() if k != "output_ids"}}
                                  for label, rows in zip(labels, ordered) for r in rows])
    reference = ordered[0]  # AR's rows (compose_methods puts AR first)
    finished_runs = [(finish_summary(rc, method, target, examples, rows, None if method.name == "ar" else reference,
                                     settings), method_dir)
                     for method, method_dir, rows in zip(methods, dirs, ordered) if method_dir.name not in failed]
    return finished_runs, {label: (failed[label], len(rows)) for label, rows in zip(labels, ordered)
                           if label in failed}


def finish_summary(rc: RunConfig, method: Method, target, examples, rows: list[dict], reference, settings) -> dict:
    summary = summarize(rc, method, examples, rows, reference)
    if "mismatched_ids" in summary:  # a lossless method at T=0: tell near-ties from real divergences
        add_tie_diagnosis(summary, diagnose_mismatches(target, rc.task, examples, rows, reference, settings)
                          if summary["mismatched_ids"] else [])
    return summary


def compose_methods(entries: list[str], job: DictConfig) -> tuple[list, list[str], list]:
    """The method configs for `methods` entries, AR first (added if missing), a label for each (its
    folder in the run dir) and its drafter config (None: the job's). An entry is an option name
    (conf/method/<name>.yaml), optionally with settings: "spec_cascade alpha=0.05" (label
    spec_cascade_alpha=0.05); a setting `drafter=<option>` or `drafter.<field>=<value>` gives that
    entry its own drafter ("sd drafter=eagle3"), except for a method whose config has its own
    `drafter` field (a checkpoint: eagle3, dflash, domino...), where it sets that field
    ("eagle3 drafter=<folder>": two checkpoints in one job). Each option is placed into the job's own config before
    it is resolved, so `${model...}` in it (drafters, masks) is the job's model."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from pipeline.cli import describe, group_options
    from pipeline.errors import ConfigError

    parsed = [(e.split()[0], e.split()[1:]) for e in entries if e.split()]
    ordered = [("ar", ()), *dict.fromkeys((n, tuple(s)) for n, s in parsed if (n, tuple(s)) != ("ar", ()))]

    def load():
        known = group_options("method")
        configs, drafters = [], []
        for name, settings in ordered:
            if name not in known:
                raise ConfigError(f"methods: '{name}' is not a method option; choose from: {', '.join(known)}")
            own_drafter = [s for s in settings if s.split("=")[0].split(".")[0] == "drafter"]
            # a method with its own `drafter` field takes these settings as its own (one more compose, only then)
            if own_drafter and "drafter" in compose("config", overrides=[f"method={name}"]).method:
                own_drafter = []
            option = [s for s in own_drafter if s.startswith("drafter=")]  # another drafter option
            overrides = [f"method={name}", *option, *(f"method.{s}" for s in settings if s not in own_drafter)]
            try:
                composed = compose("config", overrides=overrides)
                placed = job.copy()
                with open_dict(placed):
                    placed.method = composed.method
                    if own_drafter:  # fields apply to that option, else to the job's own drafter
                        base = composed.drafter if option or placed.get("drafter") is None else placed.drafter
                        fields = [s.removeprefix("drafter.") for s in own_drafter if s not in option]
                        placed.drafter = OmegaConf.merge(base, OmegaConf.from_dotlist(fields))
                resolved = OmegaConf.to_object(placed)
                configs.append(resolved.method)
                drafters.append(resolved.drafter if own_drafter else None)
            except Exception as err:  # a bad setting: the same one line as on the command line
                raise ConfigError(f"methods: '{' '.join([name, *settings])}': {describe(err, overrides)}") from None
        return configs, drafters

    labels = ["_".join([name, *settings]).replace("/", "-") for name, settings in ordered]
    if GlobalHydra.instance().is_initialized():  # inside the Hydra app (or the override precheck)
        configs, drafters = load()
    else:
        with initialize_config_module(config_module="conf", version_base="1.3"):
            configs, drafters = load()
    return configs, labels, drafters


def finish_table(rows: list[dict], categories: list[dict], rc: RunConfig, run_dir: Path) -> None:
    """The end-of-run table (and the per-category one, where the task has categories): printed (rich on
    a terminal), written to the job's log file and to summary.md."""
    title = f"{rc.model.name} on {rc.task.name}, T={rc.temperature:g}"
    tables = [(title, rows, table.RUN_COLUMNS)]
    if categories:
        tables.append((f"{title}, by category", categories, table.CATEGORY_COLUMNS))
    markdown = []
    for name, body, columns in tables:
        table.show(body, name, columns)
        # into the job's log file (Hydra's <run dir>/<app>.log), not again onto the console
        record = log.makeRecord(log.name, logging.INFO, __file__, 0, "results (%s):\n%s",
                                (name, table.plain(body, columns)), None)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)
        markdown.append(f"# {name}\n\n{table.markdown(body, columns)}")
    (run_dir / "summary.md").write_text("\n".join(markdown) + f"\nRun dir: `{run_dir}`. {table.LEGEND}\n")


def _check_resume(cfg: DictConfig, run_dir: Path) -> None:
    """Resuming into a run dir is only safe with the same config: refuse a different one."""
    saved = run_dir / "run_config.yaml"
    current = OmegaConf.to_yaml(cfg, resolve=True)
    has_results = (run_dir / "results.jsonl").exists() or any(run_dir.glob("*/results.jsonl"))  # (a comparison)
    if saved.exists() and has_results and saved.read_text() != current:
        from pipeline.errors import ConfigError

        raise ConfigError(f"{run_dir} holds results of a different config; choose another hydra.run.dir")
    saved.write_text(current)
