"""DIMR objective for `python -m search objective=dimr`: the routing mask z of VIA-SD's slim verifier
(and of the self-speculative baseline `method=sd drafter=slim`), searched offline per model.

Cost of a mask z: the mean KL(q || q_z) between the full target q and the slim model q_z (layers z
skipped, shared embeddings / head) over the positions of calibration sequences, teacher-forced, with q_z
computed as VIA-SD's slim verifier computes it (`calibration=decode`) or as the slim drafter does
(`calibration=prefill`).
Calibration sequences are the target's own greedy continuations of GSM8K test questions that are
NOT in the evaluation subset (the first `eval_limit` of the `eval_subset_seed` shuffle, i.e.
GSM-100 of conf/task/gsm8k.yaml), so the search never sees evaluation prompts. First and last
layers are always kept; only inner layers can be skipped.

Encodings (`encoding`):
- `topk`: a score per inner layer, the mask is the `skip` highest (SWIFT's trick): every trial skips
  exactly k layers, so every trial is feasible.
- `bool`: a boolean per inner layer; the skip ratio |z| / L must lie in [min_skip, max_skip].
  A trial outside it is *pruned* before any forward pass (user attr `infeasible`): it costs
  nothing, never becomes the best trial or enters the Pareto front, and it counts toward n_trials
  like any pruned trial (so n_trials bounds the proposals). TPE ranks it with the bad trials once
  enough trials completed (before that its good group holds pruned ones too); at 30 layers and a
  ratio in [0.1, 0.3] about 4% of random masks are feasible.
  GPSampler fits only completed trials, so it learns nothing from a pruned one.

Cost (`objective`):
- `kl`: minimise KL(q || q_z);
- `kl+ratio`: minimise KL + ratio_weight * (1 - skip ratio) (encoding=bool: the skip count varies);
- `pareto`: two objectives, minimise KL and maximise the skip ratio (encoding=bool). The exported
  mask is the lowest-KL trial of the Pareto front that skips at least `skip` layers (the target);
  if no front trial reaches it, the front trial that skips the most layers.
- `between`: minimise KL(p || q_z) + KL(q_z || q), p = the early-exit drafter (the target's first
  `drafter_exit_layer` layers + norm + head, with the trained exit head `drafter_head` if one is
  given, as decoding does with `drafter=exit_head`): the paper's KL geometry (KL(p||q) = KL(p||q') +
  KL(q'||q) for an I-projection) read as "put q' between the drafter and the target", so that
  drafts pass q' more often than q while q' stays close to q (research/viasd.md §1, our reading).

Known masks (`known_masks`: every other inner layer, the deepest k inner layers, or explicit
layer lists) are enqueued as the study's first trials. The study, samplers, storage, resume and
workers are search/study.py's. `export` writes <user folder>/masks/<export_name>.json (decoding/drafting/routing.py's
format), which `method=via_sd` and `drafter=slim` load by name, with the search's wall time, the
best-so-far cost curve and the known masks' costs, read from the study's trials.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from decoding.drafting.routing import kept_layers, save_mask
from pipeline.errors import ConfigError, check_choice, check_range
from pipeline.resources import SHIPPED_MASKS, user_masks

log = logging.getLogger(__name__)

ENCODINGS = ("topk", "bool")
OBJECTIVES = ("kl", "kl+ratio", "pareto", "between")
KNOWN_MASKS = ("every_other", "deepest")


@dataclass
class DIMRObjectiveConfig:
    name: str = "dimr"
    encoding: str = "topk"  # topk (score per inner layer + top-k, exactly `skip`) | bool (boolean per inner layer)
    objective: str = "kl"  # kl | kl+ratio | pareto (two objectives) | between; kl+ratio and pareto need encoding=bool
    skip: int = 6  # k: layers skipped (topk); bool: the known masks' size and the skip target of a pareto export
    min_skip: float = 0.1  # encoding=bool: lowest allowed skip ratio |z| / L (others are pruned)
    max_skip: float = 0.3  # encoding=bool: highest allowed skip ratio |z| / L
    ratio_weight: float = 1.0  # λ of objective=kl+ratio: KL + λ * (1 - skip ratio)
    drafter_exit_layer: int = 6  # objective=between: the early-exit drafter p (conf/drafter/early_exit.yaml's k)
    drafter_head: Optional[str] = None  # objective=between: p's trained exit head (conf/drafter/exit_head.yaml's head)
    calibration_prompts: int = 4  # GSM8K questions outside the evaluation subset
    calibration_tokens: int = 48  # the target's greedy continuation of each, teacher-forced
    # the continuation ends at the model's end-of-turn token, as decoding does (false: always calibration_tokens,
    # how studies before 2026-12-05 calibrated; set it to resume one)
    calibration_stop_at_eos: bool = True
    # decode: q_z as VIA-SD's slim verifier runs it, blocks of `calibration_block` rows through the kept layers
    # over the full model's cached prefix, on the answers' positions | prefill: the slim model over whole
    # sequences from an empty cache (every position's KV through the kept layers), as `drafter=slim` runs it
    # with its own cache: the cost for a slim drafter's mask (how the shipped smollm2-135m-dimr was searched)
    calibration: str = "decode"
    calibration_block: int = 6  # decode: rows per slim pass (γ + 1 of the default drafter, γ = 5)
    eval_limit: int = 100  # the evaluation subset excluded from calibration: first eval_limit of the
    eval_subset_seed: int = 0  # eval_subset_seed shuffle (GSM-100 of conf/task/gsm8k.yaml)
    known_masks: list[Any] = field(default_factory=lambda: list(KNOWN_MASKS))  # names or layer lists, tried first
    metric: str = "kl"  # label in the default study_name (conf/objective/dimr.yaml derives it from the above)
    export_name: str = "dimr"  # <export_dir>/<export_name>.json; conf/objective/dimr.yaml: <model>-dimr
    export_dir: Optional[str] = None  # None = the user's folder (pipeline.resources.user_masks), loaded by name

    def __post_init__(self) -> None:
        check_choice("objective.encoding", self.encoding, ENCODINGS)
        check_choice("objective.objective", self.objective, OBJECTIVES)
        check_range("objective.skip", self.skip, 1)
        check_range("objective.min_skip", self.min_skip, 0.0, 1.0)
        check_range("objective.max_skip", self.max_skip, self.min_skip, 1.0)
        check_range("objective.ratio_weight", self.ratio_weight, 0.0)
        check_range("objective.drafter_exit_layer", self.drafter_exit_layer, 1)
        check_range("objective.calibration_prompts", self.calibration_prompts, 1)
        check_range("objective.calibration_tokens", self.calibration_tokens, 1)
        check_choice("objective.calibration", self.calibration, ("decode", "prefill"))
        check_range("objective.calibration_block", self.calibration_block, 1)
        if self.objective in ("kl+ratio", "pareto") and self.encoding == "topk":
            raise ConfigError(f"objective.objective={self.objective} needs objective.encoding=bool "
                              "(topk skips exactly objective.skip layers, so the skip ratio cannot vary)")
        for mask in self.known_masks:
            if isinstance(mask, str) and mask not in KNOWN_MASKS:
                raise ConfigError(f"objective.known_masks: {mask!r} is not allowed; choose one of: "
                                  f"{', '.join(KNOWN_MASKS)}, or a list of layer indices")


@dataclass
class Context:
    cfg: DIMRObjectiveConfig
    cost: "MaskCost"
    num_layers: int
    calibration: dict  # ids, tokens, seconds: recorded in the study and the exported file
    recorded: bool = False


def calibration_sequences(target, tokenizer, num_prompts: int, new_tokens: int, eval_limit: int = 100,
                          subset_seed: int = 0, template_kwargs=None,
                          stop_ids: frozenset[int] = frozenset()) -> tuple[list[list[int]], list[str], list[int]]:
    """The target's greedy answers to GSM8K questions outside the evaluation subset: (prompt + answer
    sequences, example ids, prompt lengths). An answer ends before a token of `stop_ids` or after
    `new_tokens`: the row of the answer's last token predicts the stop token, and a stop token's own row
    would predict past the end of the turn, a context decoding never reaches."""
    from decoding.methods.ar import AR
    from decoding.engine.loop import generate
    from pipeline.tasks import TaskConfig, build_chat, load_examples

    evaluated = {ex.id for ex in load_examples(TaskConfig(name="gsm8k", limit=eval_limit, shuffle=True,
                                                          subset_seed=subset_seed))}
    pool = [ex for ex in load_examples(TaskConfig(name="gsm8k", shuffle=True, subset_seed=subset_seed + 1))
            if ex.id not in evaluated][:num_prompts]
    seqs, prompt_lengths = [], []
    for ex in pool:
        prompt = build_chat(tokenizer, TaskConfig(name="gsm8k"), [(ex.turns[0], None)], template_kwargs)
        out = generate(AR(), target, prompt, max_new_tokens=new_tokens, stop_ids=stop_ids).new_tokens
        if out and out[-1] in stop_ids:
            out = out[:-1]
        seqs.append(prompt + out)
        prompt_lengths.append(len(prompt))
    return seqs, [ex.id for ex in pool], prompt_lengths


class MaskCost:
    """KL(q || q_z) averaged over calibration positions; the full model's log-probs are computed once.
    With a `drafter` (objective=between; a TargetModel, e.g. an early exit): KL(p || q_z) + KL(q_z || q).

    `block=None`: q_z is the slim model over each whole sequence from an empty cache. `block=b`: q_z as
    VIA-SD's slim verifier computes it while decoding: blocks of b rows (a root and its drafts) run through
    the kept layers only, over the full model's KV of everything before them, at every position from
    `starts[k]` on (the last prompt token, whose row predicts the answer's first token). Decoding also runs
    the tokens that zones A-B settled since the last full pass through the kept layers; here every token
    before a block has the full model's KV (as after an escalation)."""

    def __init__(self, target, sequences: list[list[int]], drafter=None, block: int | None = None,
                 starts: list[int] | None = None):
        from decoding.engine.target import TargetModel

        self.model, self.sequences, self.block = target.model, sequences, block
        self.starts = [0] * len(sequences) if block is None or starts is None else [max(0, s) for s in starts]
        self.num_layers = target.num_layers
        full = TargetModel(self.model)
        self.full = full if block is not None else None  # decode: restores the full model's cached KV
        self.reference, self.snapshots = [], []
        for seq, start in zip(sequences, self.starts):
            self.reference.append(self._logprobs(full, seq)[start:])  # leaves every key of the sequence cached
            if block is not None:
                if not full.can_cut_to(start):
                    raise RuntimeError("DIMR decode calibration: the full model's cache cannot be cut back "
                                       "to the answer's start (a sliding layer dropped keys)")
                self.snapshots.append(full.snapshot())
        self.drafter = None if drafter is None else [self._logprobs(drafter, seq)[start:]
                                                     for seq, start in zip(sequences, self.starts)]
        self.cache: dict[tuple[int, ...], float] = {}

    @staticmethod
    def _logprobs(lm, seq) -> torch.Tensor:
        lm.reset()
        out = lm.forward(torch.tensor(seq), torch.arange(len(seq)), None)
        return torch.log_softmax(out.logits, -1)

    def _decode_logprobs(self, layers: tuple[int, ...], k: int) -> torch.Tensor:
        """Rows start.. of q_z as decoding computes them (`block`): for each block, one read-only pass
        through `layers` over the full model's KV of everything before it. The full model's passes are the
        same for every mask: its cache of the whole sequence (`snapshots`, from the reference pass) is
        restored and cut back to each block's start. The blocks run last first, so one restore serves them
        all: a pass writes only at and after its block's start. A sliding layer cut to one block's start keeps
        only its window, so where the next block needs older keys the snapshot is restored again."""
        full, seq = self.full, self.sequences[k]
        out = []
        for i, c in enumerate(reversed(range(self.starts[k], len(seq), self.block))):
            if i == 0 or not full.can_cut_to(c):
                full.restore(self.snapshots[k])
            full.truncate(c)
            rows = seq[c:c + self.block]
            out.append(torch.log_softmax(full.forward(rows, list(range(len(rows))), None,
                                                      active_layers=layers).logits, -1))
        return torch.cat(out[::-1])

    def __call__(self, skip) -> float:
        from decoding.engine.target import TargetModel

        key = tuple(sorted(skip))
        if key not in self.cache:
            layers = kept_layers(key, self.num_layers)
            slim = TargetModel(self.model, layers=layers) if self.block is None else None
            total, count = 0.0, 0
            for k, (ref, seq) in enumerate(zip(self.reference, self.sequences)):
                logq = self._logprobs(slim, seq) if slim is not None else self._decode_logprobs(layers, k)
                if self.drafter is None:
                    total += float((ref.exp() * (ref - logq)).sum())
                else:  # KL(p || q_z) + KL(q_z || q)
                    logp = self.drafter[k]
                    total += float((logp.exp() * (logp - logq)).sum() + (logq.exp() * (logq - ref)).sum())
                count += len(ref)
            self.cache[key] = total / count
        return self.cache[key]


def inner_layers(num_layers: int) -> list[int]:
    return list(range(1, num_layers - 1))


def known_masks(num_layers: int, k: int, entries=KNOWN_MASKS) -> list[tuple[int, ...]]:
    """Masks tried first: `every_other` (SWIFT's initial mask, cut to k), `deepest` (the last k inner
    layers: late layers are usually the most redundant), or an explicit list of inner layers."""
    inner = inner_layers(num_layers)
    masks = []
    for entry in entries:
        if entry == "every_other":
            mask = inner[::2][:k]
        elif entry == "deepest":
            mask = inner[-k:]
        else:
            mask = sorted(int(i) for i in entry)
            if not set(mask) <= set(inner):
                raise ConfigError(f"objective.known_masks: {mask} must list inner layers of {inner[0]}..{inner[-1]} "
                                  "(the first and last layers are always kept)")
        masks.append(tuple(mask))
    return masks


def skip_ratio(skip, num_layers: int) -> float:
    return len(skip) / num_layers


def feasible(cfg: DIMRObjectiveConfig, skip, num_layers: int) -> bool:
    if cfg.encoding == "topk":
        return len(skip) == cfg.skip
    return cfg.min_skip - 1e-9 <= skip_ratio(skip, num_layers) <= cfg.max_skip + 1e-9


def params_of(cfg: DIMRObjectiveConfig, mask, num_layers: int) -> dict:
    """The trial parameters that encode `mask` (for enqueueing)."""
    if cfg.encoding == "topk":
        return {f"s{i}": 1.0 if i in mask else 0.0 for i in inner_layers(num_layers)}
    return {f"z{i}": i in mask for i in inner_layers(num_layers)}


def suggest_mask(trial, cfg: DIMRObjectiveConfig, num_layers: int) -> tuple[int, ...]:
    inner = inner_layers(num_layers)
    if cfg.encoding == "topk":
        scores = {i: trial.suggest_float(f"s{i}", 0.0, 1.0) for i in inner}
        return tuple(sorted(sorted(inner, key=lambda i: -scores[i])[:cfg.skip]))
    return tuple(i for i in inner if trial.suggest_categorical(f"z{i}", [False, True]))


# search/study.py adds these to its refusal to resume a study that differs only in that setting
RESUME_HINTS = {"objective.calibration_stop_at_eos":
                "a DIMR study from before 2026-12-05 resumes with objective.calibration_stop_at_eos=false"}


def deterministic(cfg: DIMRObjectiveConfig) -> bool:
    """A mask's KL is teacher-forced on fixed sequences: the same every time it is scored."""
    return True


def directions(cfg: DIMRObjectiveConfig) -> list[str]:
    return ["minimize", "maximize"] if cfg.objective == "pareto" else ["minimize"]


def prepare(cfg) -> Context:
    import time

    from decoding.engine.target import TargetModel
    from pipeline.models import load_model, stop_token_ids, target_model

    obj = cfg.objective
    model, tokenizer = load_model(cfg.model)
    target = target_model(model, tokenizer, cfg.model)  # model.cuda_graph as the runs have it
    L = target.num_layers
    if obj.skip > L - 2:
        raise ConfigError(f"objective.skip={obj.skip}: model {cfg.model.name} has only {L - 2} inner layers to skip")
    if obj.encoding == "bool":
        counts = [n for n in range(L - 1) if obj.min_skip - 1e-9 <= n / L <= obj.max_skip + 1e-9]
        if not counts:
            raise ConfigError(f"objective.min_skip={obj.min_skip}, objective.max_skip={obj.max_skip}: no skip count "
                              f"of model {cfg.model.name}'s {L} layers (at most {L - 2}) has a ratio in that range")
        if obj.skip not in counts:  # the known masks skip k layers; a pareto export aims at k
            raise ConfigError(f"objective.skip={obj.skip} ({obj.skip}/{L} = {obj.skip / L:.3f} of model "
                              f"{cfg.model.name}'s layers) is outside [objective.min_skip, objective.max_skip] = "
                              f"[{obj.min_skip}, {obj.max_skip}]: allowed skip counts are {counts}")
    drafter = None  # p of objective=between, built (and its exit head loaded) before the calibration
    if obj.objective == "between":
        from decoding.drafting.exit_head import load_exit_head

        if obj.drafter_exit_layer >= L:
            raise ConfigError(f"objective.drafter_exit_layer={obj.drafter_exit_layer}: model {cfg.model.name} "
                              f"has {L} layers")

        head = load_exit_head(obj.drafter_head, target, obj.drafter_exit_layer, "objective.drafter_head") \
            if obj.drafter_head else None
        drafter = TargetModel(model, layers=range(obj.drafter_exit_layer), exit_head=head)
    for mask in known_masks(L, obj.skip, obj.known_masks):  # checked here, before the calibration
        if not feasible(obj, mask, L):
            raise ConfigError(f"objective.known_masks: {list(mask)} skips {len(mask)} layers, " + (
                f"encoding=topk needs objective.skip={obj.skip}" if obj.encoding == "topk" else
                f"a ratio outside [objective.min_skip, objective.max_skip] = [{obj.min_skip}, {obj.max_skip}]"))
    t0 = time.perf_counter()
    seqs, ids, prompt_lengths = calibration_sequences(target, tokenizer, obj.calibration_prompts,
                                                      obj.calibration_tokens, obj.eval_limit, obj.eval_subset_seed,
                                                      cfg.model.chat_template_kwargs,
                                                      frozenset(stop_token_ids(model, tokenizer))
                                                      if obj.calibration_stop_at_eos else frozenset())
    decode = obj.calibration == "decode"
    cost = MaskCost(target, seqs, drafter, block=obj.calibration_block if decode else None,
                    starts=[n - 1 for n in prompt_lengths] if decode else None)
    calibration = {"num_layers": L, "calibration_ids": ids, "calibration_tokens": sum(map(len, seqs)),
                   "calibration": obj.calibration, "calibration_rows": sum(map(len, cost.reference)),
                   "calibration_s": round(time.perf_counter() - t0, 1)}
    return Context(obj, cost, L, calibration)


def settings(cfg: DIMRObjectiveConfig) -> dict:
    """The fields a trial's cost depends on (search/study.py refuses to resume a study with others)."""
    from decoding.drafting.exit_head import head_folder

    out = {k: getattr(cfg, k) for k in ("encoding", "objective", "calibration_prompts", "calibration_tokens",
                                        "eval_limit", "eval_subset_seed")}
    if cfg.calibration_stop_at_eos:  # false adds no key: the calibration of studies from before the option
        out["calibration_stop_at_eos"] = True
    if cfg.calibration == "decode":  # prefill adds no key: a study from before the option resumes with it
        out |= {"calibration": cfg.calibration, "calibration_block": cfg.calibration_block}
    out |= {"skip": cfg.skip} if cfg.encoding == "topk" else {"min_skip": cfg.min_skip, "max_skip": cfg.max_skip}
    if cfg.objective == "kl+ratio":
        out["ratio_weight"] = cfg.ratio_weight
    if cfg.objective == "between":
        out["drafter_exit_layer"] = cfg.drafter_exit_layer
        out["drafter_head"] = str(head_folder(cfg.drafter_head).resolve()) if cfg.drafter_head else None
    return out


def known_params(ctx: Context) -> list[dict]:
    """Parameter sets of the known masks, enqueued by search/study.py as the first trials."""
    return [params_of(ctx.cfg, mask, ctx.num_layers) for mask in known_masks(ctx.num_layers, ctx.cfg.skip,
                                                                             ctx.cfg.known_masks)]


def objective(trial, ctx: Context):
    import optuna

    obj, L = ctx.cfg, ctx.num_layers
    if not ctx.recorded:  # read by export when the exporting worker did not calibrate (study complete)
        trial.study.set_user_attr("dimr_calibration", ctx.calibration)
        ctx.recorded = True
    skip = suggest_mask(trial, obj, L)
    ratio = skip_ratio(skip, L)
    trial.set_user_attr("skip", list(skip))
    trial.set_user_attr("num_skipped", len(skip))
    trial.set_user_attr("skip_ratio", ratio)
    if not feasible(obj, skip, L):
        trial.set_user_attr("infeasible", 1)
        raise optuna.TrialPruned(f"skip ratio {ratio:.3f} outside [{obj.min_skip}, {obj.max_skip}]")
    kl = ctx.cost(skip)
    trial.set_user_attr("kl", kl)
    if obj.objective == "pareto":
        return kl, ratio
    if obj.objective == "kl+ratio":
        return kl + obj.ratio_weight * (1.0 - ratio)
    return kl


def trial_cost(obj: DIMRObjectiveConfig, trial) -> Optional[float]:
    """The scalar cost of the curve: the study's value, or (pareto) KL of trials reaching the skip target."""
    from optuna.trial import TrialState

    if trial.state != TrialState.COMPLETE:
        return None
    if obj.objective == "pareto":
        return trial.values[0] if trial.user_attrs["num_skipped"] >= obj.skip else None
    return trial.value


def pick(study, obj: DIMRObjectiveConfig, best):
    """The exported trial: the best one, or (pareto) the lowest-KL front trial reaching the skip target."""
    if obj.objective != "pareto":
        return best
    front = study.best_trials
    reaching = [t for t in front if t.user_attrs["num_skipped"] >= obj.skip]
    if reaching:
        return min(reaching, key=lambda t: t.values[0])
    log.warning("no Pareto-front trial skips %d layers; exporting the front trial that skips the most", obj.skip)
    return max(front, key=lambda t: (t.values[1], -t.values[0]))


def export(trial, ctx: Optional[Context], cfg) -> Path:
    """Write the chosen mask where decoding/drafting/routing.py loads it by name (the user's masks/<export_name>.json)."""
    import optuna

    from search.study import finished, make_storage

    obj = cfg.objective
    study = optuna.load_study(study_name=cfg.study_name, storage=make_storage(cfg))
    calibration = ctx.calibration if ctx else study.user_attrs["dimr_calibration"]
    L = calibration["num_layers"]
    chosen = pick(study, obj, trial)
    done = sorted(finished(study), key=lambda t: t.number)
    curve, best = [], math.inf
    for t in done:
        cost = trial_cost(obj, t)
        best = min(best, cost) if cost is not None else best
        curve.append(round(best, 5) if best < math.inf else None)
    starts = [t.datetime_start for t in done if t.datetime_start]
    ends = [t.datetime_complete for t in done if t.datetime_complete]
    search_s = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    trials_s = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in done
                   if t.datetime_start and t.datetime_complete)
    known = {str(t.user_attrs["skip"]): round(t.user_attrs["kl"], 5) for t in done
             if t.system_attrs.get("fixed_params") and "kl" in t.user_attrs}
    root = Path(obj.export_dir).expanduser() if obj.export_dir else user_masks()
    path = root / f"{obj.export_name}.json"
    skip, kl = chosen.user_attrs["skip"], chosen.user_attrs["kl"]
    save_mask(path, skip, L, model=cfg.model.name, cost_kl=kl, search={
        "study_name": cfg.study_name, "trial": chosen.number, "sampler": cfg.sampler, "encoding": obj.encoding,
        "objective": obj.objective, "values": chosen.values, "trials": len(done),
        "pruned_infeasible": sum(1 for t in done if t.user_attrs.get("infeasible")),
        "skip": obj.skip if obj.encoding == "topk" else len(skip), "skip_ratio": round(skip_ratio(skip, L), 4),
        **({"min_skip": obj.min_skip, "max_skip": obj.max_skip} if obj.encoding == "bool" else {}),
        **({"ratio_weight": obj.ratio_weight} if obj.objective == "kl+ratio" else {}),
        **({"drafter_exit_layer": obj.drafter_exit_layer, "drafter_head": obj.drafter_head}
           if obj.objective == "between" else {}),
        "wall_s": round(calibration["calibration_s"] + search_s, 1),  # calibration + first trial start .. last end
        "calibration_s": calibration["calibration_s"], "search_s": round(search_s, 1),
        "trials_s": round(trials_s, 1),  # summed over trials (and workers)
        "calibration_ids": calibration["calibration_ids"], "calibration_tokens": calibration["calibration_tokens"],
        "best_so_far": curve, "known_masks": known})
    shipped = SHIPPED_MASKS / path.name
    if not obj.export_dir and shipped.exists():  # routing loads the user's export before the shipped mask
        log.warning("mask %s now takes the place of the shipped %s wherever a run names %s (method.mask, "
                    "drafter.mask; searched with calibration=%s); objective.export_name=<other> keeps both",
                    path, shipped, obj.export_name, obj.calibration)
    label = "KL(p||q_z)+KL(q_z||q)" if obj.objective == "between" else "KL(q||q_z)"
    print(f"mask {obj.export_name}: skip {skip}  {label}={kl:.4f}  trials={len(done)}  "
          f"wall {calibration['calibration_s'] + search_s:.0f}s (calibration {calibration['calibration_s']:.0f}s)")
    print("best-so-far cost curve:", " ".join("-" if c is None else f"{c:.3f}" for c in curve))
    return path


CONFIG = DIMRObjectiveConfig
