"""Generic Optuna studies for `python -m search` (Hydra: conf/search.yaml + the `objective` group).

An objective is a module `search/<name>.py`, listed in OBJECTIVE_MODULES, that defines:
- `CONFIG`: its schema dataclass (`name` = the registry key; the search space `params`, known
  parameter sets `enqueue`, data and metric settings); conf/objective/<name>.yaml is its option;
- `directions(cfg) -> list[str]`: "maximize"/"minimize", one per value the objective returns;
- `prepare(cfg) -> context`: what every trial needs (model, calibration prompts, baselines), built
  once per worker process;
- `objective(trial, context) -> float | tuple[float, ...]`: one trial (a tuple for multi-objective);
- `known_params(context) -> list[dict]` (optional): known parameter sets that need the prepared
  context (e.g. DIMR's masks depend on the layer count), enqueued after `enqueue` on a new study;
- `export(trial, context, cfg) -> Path | None` (optional): write the best parameters where the pipeline
  loads them (e.g. conf/method/ptd_tuned.yaml for `python -m pipeline method=ptd_tuned`);
- `settings(cfg) -> dict` (optional): the fields a trial's value depends on, which a resumed study
  must match (default: every field but `export*`, `enqueue`, `known_masks`);
- `deterministic(cfg) -> bool` (optional): the objective scores a parameter set the same every time (the
  gp sampler then fits no noise term);
- `RESUME_HINTS` (optional): {settings key: how a study that differs only there resumes}, added to the
  refusal;
- `share_measurements(context, study, cfg)` (optional; `cfg` is the StudyConfig): called after `prepare`
  when this worker has trials to run, to fill `context` in place with measurements the trials' values depend
  on, one for the whole study (`shared_measurement`: PTD's forward-cost curve), so that the values of trials
  run by different workers, or before and after a resume, compare.
`suggest(trial, params)` turns a `params` spec ({name: {type: int|float|categorical, low, high,
log, step, choices}}) into trial suggestions.

The study lives in an Optuna JournalStorage file (or an RDB URL), created with load_if_exists, so a
killed search resumes where it stopped and several workers (Slurm array tasks: `worker` defaults to
SLURM_ARRAY_TASK_ID) share one study; `n_trials` counts completed (or pruned) trials of all workers together. A
trial left RUNNING by a killed run of the same worker is marked failed on restart (an enqueued
parameter set is enqueued again). A study remembers its model and objective settings: resuming it
with others (another drafter, calibration set, search space...) stops with one error. Samplers: tpe
(Bayesian), random, gp, seeded by seed + worker.
Every finished trial is logged to the tracker (W&B offline by default); a progress bar shows it.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf

from pipeline.errors import ConfigError, check_choice, check_range, one_line
from pipeline.models import ModelConfig
from pipeline.schema import TrackerConfig

log = logging.getLogger(__name__)

OBJECTIVE_MODULES = ("ptd", "dimr")


class TrialFailed(RuntimeError):
    """A trial raised: the worker stops with this one line (the traceback is in the log above it)."""
SAMPLERS = ("tpe", "random", "gp")


@dataclass
class StudyConfig:
    model: ModelConfig = MISSING
    objective: Any = MISSING  # the objective's own schema (conf/objective/<name>.yaml)
    tracker: TrackerConfig = MISSING
    study_name: str = "study"
    storage: Optional[str] = None  # journal file path or RDB URL (sqlite:///x.db); None = outputs/search/<study>.journal
    sampler: str = "tpe"  # tpe (Bayesian) | random | gp
    n_trials: int = 20  # finished trials wanted in the study, all workers together
    timeout_s: Optional[float] = None  # stop this worker after this many seconds
    worker: int = 0  # this worker's index (Slurm array task); seeds its sampler
    shared_wait_s: float = 600.0  # how long a worker other than 0 waits for worker 0's study-wide measurements
    seed: int = 0
    threads: Optional[int] = None  # torch CPU threads (None = torch's default)
    show_progress: bool = True
    outputs_root: str = "outputs"
    experiment_name: str = "search"  # W&B group

    def __post_init__(self) -> None:
        check_choice("sampler", self.sampler, SAMPLERS)
        check_range("n_trials", self.n_trials, 1)
        check_range("worker", self.worker, 0)
        check_range("shared_wait_s", self.shared_wait_s, 0.0)


def objective_module(name: str):
    if name not in OBJECTIVE_MODULES:
        raise ConfigError(f"objective={name!r} is not registered; choose one of: {', '.join(OBJECTIVE_MODULES)}")
    return importlib.import_module(f"search.{name}")


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    from pipeline.schema import register_configs as register_pipeline

    register_pipeline()  # model / tracker groups
    cs = ConfigStore.instance()
    cs.store(name="base_search", node=StudyConfig)
    for name in OBJECTIVE_MODULES:
        cs.store(group="objective", name=f"{name}_schema", node=objective_module(name).CONFIG)


def suggest(trial, params: dict) -> dict:
    """{name: spec} -> {name: value} through trial.suggest_*; bad specs raise ConfigError."""
    values = {}
    for name, spec in params.items():
        kind = spec.get("type")
        if kind == "int":
            values[name] = trial.suggest_int(name, int(spec["low"]), int(spec["high"]), step=int(spec.get("step", 1)),
                                             log=bool(spec.get("log", False)))
        elif kind == "float":
            values[name] = trial.suggest_float(name, float(spec["low"]), float(spec["high"]),
                                               log=bool(spec.get("log", False)), step=spec.get("step"))
        elif kind == "categorical":
            values[name] = trial.suggest_categorical(name, list(spec["choices"]))
        else:
            raise ConfigError(f"objective.params.{name}.type={kind!r} is not allowed; choose one of: int, float, categorical")
    return values


def make_sampler(name: str, seed: int, deterministic: bool = False):
    """`deterministic`: the objective gives a configuration the same value every time (GP then fits no
    noise term to it)."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():  # deterministic_objective is marked experimental in Optuna 4-5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.GPSampler(seed=seed, deterministic_objective=deterministic)


def make_storage(cfg: StudyConfig):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    location = cfg.storage or str(Path(cfg.outputs_root) / "search" / f"{cfg.study_name}.journal")
    if "://" in location:
        return location  # an RDB URL: Optuna builds the storage
    path = Path(location).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


# recorded since 2026-12-05: a study saved before has none of them, and is not refused for that
MODEL_SETTINGS_SINCE_2026_12_05 = ("model.path", "model.revision", "model.dtype", "model.attn_implementation",
                                   "model.cuda_graph")


def study_settings(cfg: StudyConfig) -> dict:
    """What a trial's value depends on: the model and the objective's `settings(cfg)` if it defines
    one, else every objective field but the export target and the parameter sets tried first (those
    only seed a new study)."""
    import dataclasses

    module = objective_module(cfg.objective.name)
    if hasattr(module, "settings"):
        objective = module.settings(cfg.objective)
    else:
        fields = dataclasses.asdict(cfg.objective) if dataclasses.is_dataclass(cfg.objective) else dict(cfg.objective)
        objective = {k: v for k, v in fields.items() if not k.startswith("export") and k not in ("enqueue", "known_masks")}
    from pipeline.models import resolve_dtype

    model = cfg.model
    settings = {"model": model.name, "model.path": model.path, "model.revision": model.revision,
                # `auto` is bf16 on one machine and fp32 on another: two scales of cost in one study
                "model.dtype": str(resolve_dtype(model.dtype, model.device_map)).removeprefix("torch."),
                "model.attn_implementation": model.attn_implementation, "model.cuda_graph": model.cuda_graph,
                **{f"objective.{k}": v for k, v in objective.items()}}
    return json.loads(json.dumps(settings, default=str))


def open_study(cfg: StudyConfig, directions: list[str]):
    import optuna

    module = objective_module(cfg.objective.name)
    deterministic = bool(getattr(module, "deterministic", lambda _: False)(cfg.objective))
    study = optuna.create_study(study_name=cfg.study_name, storage=make_storage(cfg), load_if_exists=True,
                                directions=directions,
                                sampler=make_sampler(cfg.sampler, cfg.seed + cfg.worker, deterministic))
    own = [t for t in study.trials if t.user_attrs.get("worker") == cfg.worker]
    if own:  # this worker resumes: seeded as at its start, its sampler would propose its first trials again
        study.sampler = make_sampler(cfg.sampler, cfg.seed + cfg.worker + 7919 * len(own), deterministic)
    if list(study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
        raise ConfigError(f"study {cfg.study_name!r} exists with other directions; choose another study_name")
    # a resumed study must score trials the same way, or its best trial would mix two costs
    settings, saved = study_settings(cfg), study.user_attrs.get("settings")
    if saved is None:
        study.set_user_attr("settings", settings)
        return study
    missing = object()
    changed = sorted(k for k in settings.keys() | saved.keys()
                     if not (k in MODEL_SETTINGS_SINCE_2026_12_05 and k not in saved)
                     and settings.get(k, missing) != saved.get(k, missing))
    if changed:
        hints = getattr(module, "RESUME_HINTS", {})
        hint = f"; {hints[changed[0]]}" if len(changed) == 1 and changed[0] in hints else ""
        raise ConfigError(f"study {cfg.study_name!r} exists with other settings ({', '.join(changed)}); "
                          f"choose another study_name (or objective.metric) or remove its storage{hint}")
    if saved != settings:  # saved before the model's settings were recorded: they are from now on
        study.set_user_attr("settings", settings)
    return study


def shared_measurement(study, key: str, worker: int, measure, wait_s: float, poll_s: float = 1.0):
    """The study's one value of a measurement (a JSON-able dict) under user attribute `key`: the stored one when
    the study has it (a resume, or another worker's); else worker 0 measures and stores it, while every other
    worker waits for it, up to `wait_s` seconds, and then stops with one line. Only worker 0 ever stores it, so
    no two workers can store different values (Optuna's storages have no compare-and-set)."""
    deadline = time.monotonic() + wait_s
    while True:
        stored = study.user_attrs.get(key)  # read from the storage each time
        if stored is not None:
            return stored
        if worker == 0:
            study.set_user_attr(key, measure())
            return study.user_attrs[key]
        if time.monotonic() >= deadline:
            raise ConfigError(f"worker {worker}: study {study.study_name!r} has no {key} yet, which worker 0 "
                              f"measures; waited shared_wait_s={wait_s:g} s. Start worker 0, or raise shared_wait_s")
        time.sleep(poll_s)


def recover_stale_trials(study, worker: int) -> int:
    """Trials this worker left RUNNING when it was killed: fail them, re-enqueue enqueued ones."""
    from optuna.trial import TrialState

    stale = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
             if t.user_attrs.get("worker") == worker]
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        if t.system_attrs.get("fixed_params"):
            study.enqueue_trial(t.system_attrs["fixed_params"])
    return len(stale)


def finished(study) -> list:
    """Trials that count toward n_trials (failed ones, e.g. killed, do not)."""
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def best_trials(study) -> list:
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return study.best_trials if len(study.directions) > 1 else ([study.best_trial] if done else [])


def run_study(cfg: StudyConfig, tracker=None) -> dict:
    """Open (or resume) the study, run this worker's share of trials, export the best parameters."""
    import optuna
    import torch

    from pipeline.tracking import NoTracker

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tracker = tracker or NoTracker()
    module = objective_module(cfg.objective.name)
    directions = list(module.directions(cfg.objective))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(cfg, directions)
    recovered = recover_stale_trials(study, cfg.worker)
    fresh = cfg.worker == 0 and not study.trials
    if fresh:
        for params in getattr(cfg.objective, "enqueue", []) or []:
            study.enqueue_trial(dict(params), skip_if_exists=True)
    remaining = cfg.n_trials - len(finished(study))
    context = module.prepare(cfg) if remaining > 0 else None
    if context is not None and hasattr(module, "share_measurements"):
        module.share_measurements(context, study, cfg)
    if fresh and context is not None and hasattr(module, "known_params"):
        for params in module.known_params(context):
            study.enqueue_trial(params, skip_if_exists=True)

    def objective(trial):
        trial.set_user_attr("worker", cfg.worker)
        value = module.objective(trial, context)
        values = value if isinstance(value, (list, tuple)) else [value]
        if not all(math.isfinite(v) for v in values):  # Optuna would record FAIL and go on, unseen
            raise ValueError(f"the objective returned {value} (not finite) for {trial.params}")
        return value

    def on_trial(study, trial) -> None:
        row = {"number": trial.number, "worker": cfg.worker, **{k: v for k, v in trial.params.items()},
               **{k: v for k, v in trial.user_attrs.items() if isinstance(v, (int, float))}}
        for i, value in enumerate(trial.values or []):
            row[f"value_{i}" if len(directions) > 1 else "value"] = value
        tracker.log_row("trial", row)
        if len(finished(study)) >= cfg.n_trials:
            study.stop()

    if remaining > 0:
        # Nothing is caught: a trial that raises (a CUDA error, a bug) is recorded as FAIL in the study and
        # stops this worker with one line; finished trials stay in the storage. Invalid parameter
        # combinations are pruned by the objectives (optuna.TrialPruned), not raised.
        with TrialProgress(cfg.n_trials, len(finished(study)), cfg.show_progress) as progress:
            try:
                study.optimize(objective, n_trials=remaining, timeout=cfg.timeout_s, callbacks=[on_trial, progress])
            except Exception as err:
                failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL
                          and t.user_attrs.get("worker") == cfg.worker]
                number = failed[-1].number if failed else "?"
                raise TrialFailed(f"trial {number} of study {cfg.study_name!r} failed ({type(err).__name__}: "
                                  f"{one_line(err)}); the study keeps its {len(finished(study))} finished trials "
                                  f"and resumes from them") from err
    best = best_trials(study)
    exported = None
    if best and hasattr(module, "export"):
        exported = module.export(best[0], context, cfg)
    summary = {"study_name": cfg.study_name, "objective": cfg.objective.name, "sampler": cfg.sampler,
               "worker": cfg.worker, "finished_trials": len(finished(study)), "recovered_stale_trials": recovered,
               "best": [{"number": t.number, "values": t.values, "params": t.params, "user_attrs": t.user_attrs}
                        for t in best],
               "exported": str(exported) if exported else None}
    tracker.log_summary({"best_value": best[0].values[0] if best else math.nan,
                         "finished_trials": summary["finished_trials"]})
    return summary


class TrialProgress:
    """A rich progress bar over the study's finished trials, with the best value so far."""

    def __init__(self, total: int, done: int, enabled: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), disable=not enabled)
        self._task = self._progress.add_task("trials", total=total, completed=done, best="-")

    def __enter__(self) -> "TrialProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def __call__(self, study, trial) -> None:
        best = best_trials(study)
        shown = ", ".join(f"{v:.4g}" for v in best[0].values) if best else "-"
        self._progress.update(self._task, completed=len(finished(study)), best=shown)


def to_container(cfg) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))

