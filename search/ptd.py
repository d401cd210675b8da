"""PTD objective for `python -m search objective=ptd`: tune PTD's width, depth, seeds, seed mode,
pool size and budgets on calibration prompts.

Calibration prompts are examples of `task` (GSM8K by default) that are NOT in its evaluation subset
(the `limit`/`shuffle`/`subset_seed` of conf/task/<task>.yaml, i.e. GSM-100), picked with
`calibration_seed`; their ids are recorded in the exported file. Metrics (`metric`):
- `speedup`: PTD tokens/s over AR tokens/s on the calibration prompts, AR re-measured in every
  trial right after PTD on each prompt (interleaved, so machine-load drift hits both alike);
- `tau_per_cost`: new tokens per AR-forward-equivalent, i.e. sum over steps of the measured cost
  of a forward with that step's rows relative to a one-row forward. The forward-cost curve is measured
  once per study (by worker 0, stored in the study, `share_measurements`) and every worker and resume
  scores with it.
  Wall-clock-free, so it ranks configurations stably on a busy machine;
- `tau`: mean accepted length per step, blind to cost (how far the drafts can go at all).
Every trial also records tau, rows per step, tokens/s and whether the greedy output equals AR.
The best parameters are written to <export_dir>/method/<export_name>.yaml (default: the user's
config folder, ~/.config/specdec/conf/method/ptd_tuned.yaml, with a copy in the run dir), which
`python -m pipeline method=ptd_tuned` loads by name ahead of the shipped conf/method/ptd_tuned.yaml.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from pipeline.errors import ConfigError, check_choice, check_range
from pipeline.resources import user_conf

log = logging.getLogger(__name__)

METRICS = ("speedup", "tau_per_cost", "tau")


def default_space() -> dict:
    return {
        "width": {"type": "int", "low": 1, "high": 4},
        "depth": {"type": "int", "low": 2, "high": 8},
        "num_seeds": {"type": "int", "low": 1, "high": 8},
        "seed_mode": {"type": "categorical", "choices": ["stochastic", "context"]},
        "pool_size": {"type": "int", "low": 2, "high": 32, "log": True},
        "verification_budget": {"type": "int", "low": 2, "high": 48, "log": True},
        "drafting_budget": {"type": "int", "low": 2, "high": 48, "log": True},
        "context_subtrees": {"type": "categorical", "choices": [True, False]},
        "recycle": {"type": "categorical", "choices": [True, False]},
        "graft": {"type": "categorical", "choices": [True, False]},
        "candidate_depth": {"type": "int", "low": 2, "high": 12},
    }


def default_enqueue() -> list:
    return [{"width": 3, "depth": 4, "num_seeds": 2, "seed_mode": "stochastic", "pool_size": 8,
             "verification_budget": 32, "drafting_budget": 8, "context_subtrees": True, "recycle": True,
             "graft": True, "candidate_depth": 8}]  # PTDConfig's defaults


@dataclass
class PTDObjectiveConfig:
    name: str = "ptd"
    metric: str = "speedup"  # speedup | tau_per_cost | tau
    task: str = "gsm8k"  # calibration examples come from this task, outside its evaluation subset
    calibration_prompts: int = 6
    calibration_seed: int = 1
    max_new_tokens: int = 64
    temperature: float = 0.0
    params: dict[str, Any] = field(default_factory=default_space)  # search space (search.study.suggest)
    enqueue: list[Any] = field(default_factory=default_enqueue)  # known parameter sets tried first
    fixed: dict[str, Any] = field(default_factory=dict)  # PTD fields held fixed in every trial
    export_name: str = "ptd_tuned"
    export_dir: Optional[str] = None  # <export_dir>/method/<export_name>.yaml; None = the user's config folder

    def __post_init__(self) -> None:
        check_choice("objective.metric", self.metric, METRICS)
        check_range("objective.calibration_prompts", self.calibration_prompts, 1)
        check_range("objective.max_new_tokens", self.max_new_tokens, 1)
        check_range("objective.temperature", self.temperature, 0.0)


@dataclass
class Context:
    cfg: PTDObjectiveConfig
    target: Any
    prompts: list[list[int]]
    ids: list[str]
    stop_ids: set[int]
    ar_outputs: list[list[int]]
    cost_curve: dict[int, float]  # rows -> ms of one forward


def deterministic(cfg: PTDObjectiveConfig) -> bool:
    """τ repeats exactly (seeded at T > 0), and so does τ per cost with the study's stored cost curve, which
    every worker scores with (`share_measurements`). A measured speedup does not."""
    return cfg.metric in ("tau", "tau_per_cost")


def directions(cfg: PTDObjectiveConfig) -> list[str]:
    return ["maximize"]


def calibration_examples(task: str, count: int, seed: int):
    """Examples of `task` outside its evaluation subset (as configured in conf/task/<task>.yaml)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from pipeline.schema import register_configs
    from pipeline.tasks import load_examples

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        eval_cfg = OmegaConf.to_object(compose("config", overrides=[f"task={task}"])).task
    GlobalHydra.instance().clear()
    evaluated = {ex.id for ex in load_examples(eval_cfg)}
    everything = load_examples(type(eval_cfg)(**{**vars(eval_cfg), "limit": None, "shuffle": False}))
    pool = [ex for ex in everything if ex.id not in evaluated]
    if len(pool) < count:
        raise ConfigError(f"objective.task={task}: only {len(pool)} examples lie outside its evaluation subset, "
                          f"{count} calibration prompts asked")
    return eval_cfg, random.Random(seed).sample(pool, count)


def forward_cost_curve(target, context_len: int, sizes=(1, 2, 4, 8, 16, 32, 64, 128), repeats: int = 3) -> dict:
    from decoding.engine.transfer import synchronize

    vocab = target.config.vocab_size
    ctx = torch.randint(0, vocab, (context_len,), generator=torch.Generator().manual_seed(0)).tolist()
    target.prefill(ctx)
    curve = {}
    for n in sizes:
        times = []
        ids = torch.randint(0, vocab, (n,)).to(target.device)
        depths = torch.arange(n, device=target.device)
        # one row unmasked, as AR's step runs (the cheapest path); a block with the explicit mask a tree forward has
        visible = None if n == 1 else torch.ones(n, n, dtype=torch.bool, device=target.device).tril()
        for _ in range(repeats + 1):
            synchronize(target.device)
            t0 = time.perf_counter()
            target.forward(ids, depths, visible)
            synchronize(target.device)
            times.append(time.perf_counter() - t0)
            target.truncate(context_len)
        curve[n] = statistics.median(times[1:]) * 1000
    return curve


def relative_cost(curve: dict[int, float], rows: int, padded: bool = False) -> float:
    """Cost of a forward with `rows` rows over a one-row forward (linear between measured sizes). `padded`: the
    target replays CUDA graphs (model.cuda_graph), where a forward costs its power-of-two bucket's rows."""
    if padded:
        from decoding.engine.static_forward import MAX_ROWS, bucket

        rows = bucket(rows) if rows <= MAX_ROWS else rows
    sizes = sorted(curve)
    if rows <= sizes[0]:
        return curve[sizes[0]] / curve[1]
    for lo, hi in zip(sizes, sizes[1:]):
        if rows <= hi:
            ms = curve[lo] + (curve[hi] - curve[lo]) * (rows - lo) / (hi - lo)
            return ms / curve[1]
    lo, hi = sizes[-2], sizes[-1]
    return (curve[hi] + (curve[hi] - curve[lo]) * (rows - hi) / (hi - lo)) / curve[1]


def check_fixed(obj) -> None:
    """A bad `objective.fixed` value is the user's: one line before any trial, not every trial pruned later.
    Each value alone, with the fields of PTDConfig's one rule across fields (drafting_budget >= num_seeds) out
    of its way; then all of them together with the defaults, unless a field of that rule is searched (the
    trials decide it)."""
    neutral = {"num_seeds": 1, "drafting_budget": 2**31}
    checks = [(f"objective.fixed.{k}={v}", {**neutral, k: v}) for k, v in obj.fixed.items()]
    if not set(neutral) & set(obj.params):
        checks.append((f"objective.fixed={dict(obj.fixed)}", dict(obj.fixed)))
    for what, values in checks:
        try:
            ptd_config({}, values)
        except (ConfigError, TypeError) as err:
            raise ConfigError(f"{what}: {err}") from None


def prepare(cfg) -> Context:
    from decoding.methods.ar import AR
    from decoding.engine.loop import generate
    from pipeline.models import load_model, target_model, stop_token_ids
    from pipeline.tasks import build_chat

    obj = cfg.objective
    check_fixed(obj)
    model, tokenizer = load_model(cfg.model)
    target = target_model(model, tokenizer, cfg.model)  # model.cuda_graph as the runs have it
    task_cfg, examples = calibration_examples(obj.task, obj.calibration_prompts, obj.calibration_seed)
    prompts = [build_chat(tokenizer, task_cfg, [(ex.turns[0], None)], cfg.model.chat_template_kwargs) for ex in examples]
    stops = stop_token_ids(model, tokenizer)
    generate(AR(), target, prompts[0], max_new_tokens=4)  # warm-up
    ar_outputs = [generate(AR(), target, p, max_new_tokens=obj.max_new_tokens, stop_ids=stops).new_tokens
                  for p in prompts] if obj.temperature == 0 else []
    return Context(obj, target, prompts, [ex.id for ex in examples], stops, ar_outputs, {})


COST_CURVE_KEY = "ptd_cost_curve"


def share_measurements(ctx: Context, study, cfg) -> None:
    """`tau_per_cost`: the study's forward-cost curve (`search.study.shared_measurement`), measured by worker 0
    on its machine and read by every other worker and resume, so that trials compare whoever ran them.
    `cfg`: the StudyConfig (worker, shared_wait_s)."""
    if ctx.cfg.metric != "tau_per_cost":
        return
    from decoding.drafting.verify_cost import machine_key
    from search.study import finished, shared_measurement

    context_len = int(statistics.mean(map(len, ctx.prompts)))
    machine = machine_key(ctx.target)
    scored_before = len(finished(study)) if COST_CURVE_KEY not in study.user_attrs else 0
    if scored_before:
        log.warning("study %r: its %d finished trials were scored before studies stored one cost curve (each "
                    "worker timed its own); the trials from now on use the stored one", study.study_name,
                    scored_before)

    def measure() -> dict:
        curve = forward_cost_curve(ctx.target, context_len)
        return {"ms": {str(rows): ms for rows, ms in curve.items()},  # JSON keys are strings
                "context_len": context_len, "machine": machine, "worker": cfg.worker}

    stored = shared_measurement(study, COST_CURVE_KEY, cfg.worker, measure, cfg.shared_wait_s)
    ctx.cost_curve = {int(rows): ms for rows, ms in stored["ms"].items()}
    if stored["worker"] != cfg.worker or stored["machine"] != machine:
        log.info("tau_per_cost: the study's cost curve, measured by worker %d on %s", stored["worker"],
                 stored["machine"])


def ptd_config(params: dict, fixed: dict):
    from decoding.methods.ptd import PTDConfig

    return PTDConfig(**{**fixed, **params})


def objective(trial, ctx: Context) -> float:
    import optuna

    from decoding.methods.ar import AR
    from decoding.engine.loop import generate
    from decoding.methods.ptd import PTD
    from search.study import suggest

    obj = ctx.cfg
    params = suggest(trial, obj.params)
    try:
        method = PTD(ptd_config(params, obj.fixed))
    except ConfigError as err:
        trial.set_user_attr("invalid", str(err))
        raise optuna.TrialPruned(str(err)) from None
    if obj.metric == "tau_per_cost" and not ctx.cost_curve:
        raise ConfigError("objective.metric=tau_per_cost: no cost curve in the context; search.study runs "
                          "share_measurements(context, study, cfg) after prepare, which stores the study's curve")
    tokens = steps = accepted = rows = 0
    cost = ptd_s = ar_s = ar_tokens = 0.0
    matches = []
    if obj.metric == "speedup":  # untimed: the configuration's first-use costs (buffers, a CUDA graph bucket)
        generate(method, ctx.target, ctx.prompts[0], max_new_tokens=8, temperature=obj.temperature,
                 stop_ids=ctx.stop_ids)
    for i, prompt in enumerate(ctx.prompts):
        row_counts: list[int] = []

        def on_step(state, seen=[0]):
            total = int(state.stats.extra.get("forward_rows", 0))
            row_counts.append(total - seen[0])
            seen[0] = total

        def timed_ar() -> None:
            nonlocal ar_s, ar_tokens
            t0 = time.perf_counter()
            ar = generate(AR(), ctx.target, prompt, max_new_tokens=obj.max_new_tokens, temperature=obj.temperature,
                          stop_ids=ctx.stop_ids, seed=i)
            ar_s += time.perf_counter() - t0
            ar_tokens += len(ar.new_tokens)

        if obj.metric == "speedup" and i % 2:  # AR first on odd prompts, second on even ones: no order bias
            timed_ar()
        t0 = time.perf_counter()
        state = generate(method, ctx.target, prompt, max_new_tokens=obj.max_new_tokens, temperature=obj.temperature,
                         stop_ids=ctx.stop_ids, seed=i, on_step=on_step)
        ptd_s += time.perf_counter() - t0
        tokens += len(state.new_tokens)
        steps += state.stats.num_steps
        accepted += state.stats.num_accepted_tokens
        rows += sum(row_counts)
        if ctx.cost_curve:
            cost += sum(relative_cost(ctx.cost_curve, r, ctx.target.graphs is not None) for r in row_counts)
        if ctx.ar_outputs:
            matches.append(state.new_tokens == ctx.ar_outputs[i])
        if obj.metric == "speedup" and not i % 2:
            timed_ar()
    attrs = {"tau": (accepted + steps) / steps, "rows_per_step": rows / steps, "tokens_per_s": tokens / ptd_s}
    if ar_s:
        attrs.update(ar_tokens_per_s=ar_tokens / ar_s, speedup=(tokens / ptd_s) / (ar_tokens / ar_s))
    if cost:
        attrs["tau_per_cost"] = tokens / cost
    if matches:
        attrs["match_rate"] = sum(matches) / len(matches)
        if attrs["match_rate"] < 1:  # lossless at T = 0: a bf16 near-tie, or a bug; either way not hidden
            log.warning("trial %d (%s): %d of %d outputs differ from AR's", trial.number, params,
                        len(matches) - sum(matches), len(matches))
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return attrs[obj.metric]


def export(trial, ctx: Optional[Context], cfg) -> Path:
    """Write the best parameters as a method option of the pipeline (method=<export_name>): into the user's
    config folder (pipeline.resources.user_conf), which Hydra searches before the shipped conf/."""
    obj = cfg.objective
    root = Path(obj.export_dir).expanduser() if obj.export_dir else user_conf()
    path = root / "method" / f"{obj.export_name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {**obj.fixed, **trial.params}
    attrs = {k: round(v, 4) for k, v in trial.user_attrs.items() if isinstance(v, float)}
    lines = [
        f"# PTD tuned by `python -m search objective=ptd` (search/ptd.py): study {cfg.study_name}, "
        f"trial {trial.number}, sampler {cfg.sampler}, {obj.metric}={trial.values[0]:.4f}",
        f"# measured on model {cfg.model.name}: {attrs}",
        f"# calibration: {obj.calibration_prompts} {obj.task} prompts outside its evaluation subset "
        f"(calibration_seed {obj.calibration_seed}), {obj.max_new_tokens} new tokens, T={obj.temperature:g}",
        "defaults:",
        "  - ptd_schema",
        "  - _self_",
        "",
        f"name: {obj.export_name}",
        *(f"{k}: {v}" for k, v in values.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


CONFIG = PTDObjectiveConfig
