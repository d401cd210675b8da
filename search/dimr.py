"""DIMR routing-mask search for VIA-SD's slim verifier (and the `drafter=slim` baseline).

Cost of a mask z: the mean KL(q || q_z) between the full target q and the slim model q_z (layers z
skipped, shared embeddings / head) over every position of calibration sequences, teacher-forced.
Calibration sequences are the target's own greedy continuations of GSM8K test questions that are
NOT in the evaluation subset (task.limit / subset_seed of conf/task/gsm8k.yaml), so the search
never sees evaluation prompts. The skip count k is fixed (the speed budget); the encoding is a
score per inner layer + top-k (SWIFT's trick: every trial is feasible); first and last layers are
always kept. Known masks (every other layer, the last k inner layers) are enqueued as first
trials. Optuna samplers: tpe (Bayesian, multivariate), random, gp. The study lives in an Optuna
JournalStorage file, so a killed search resumes and parallel workers share it.

    python -m search.dimr --skip 10 --trials 60 --sampler tpe --name smollm2-135m-dimr
writes masks/<name>.json (mask, cost, wall time, cost curve), which method=via_sd loads by name.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from decoding.routing import MASK_DIR, kept_layers, save_mask


def calibration_sequences(target, tokenizer, num_prompts: int, new_tokens: int, eval_limit: int = 100,
                          subset_seed: int = 0) -> tuple[list[list[int]], list[str]]:
    from decoding.ar import AR
    from decoding.engine import generate
    from pipeline.tasks import TaskConfig, build_chat, load_examples

    evaluated = {ex.id for ex in load_examples(TaskConfig(name="gsm8k", limit=eval_limit, shuffle=True,
                                                          subset_seed=subset_seed))}
    pool = [ex for ex in load_examples(TaskConfig(name="gsm8k", shuffle=True, subset_seed=subset_seed + 1))
            if ex.id not in evaluated][:num_prompts]
    seqs = []
    for ex in pool:
        prompt = build_chat(tokenizer, TaskConfig(name="gsm8k"), [(ex.turns[0], None)])
        out = generate(AR(), target, prompt, max_new_tokens=new_tokens).new_tokens
        seqs.append(prompt + out)
    return seqs, [ex.id for ex in pool]


class MaskCost:
    """KL(q || q_z) averaged over calibration positions; the full model's log-probs are computed once."""

    def __init__(self, target, sequences: list[list[int]]):
        from decoding.target import TargetModel

        self.model, self.sequences = target.model, sequences
        self.num_layers = target.num_layers
        self.reference = [self._logprobs(TargetModel(self.model), seq) for seq in sequences]
        self.cache: dict[tuple[int, ...], float] = {}

    @staticmethod
    def _logprobs(lm, seq) -> torch.Tensor:
        lm.reset()
        out = lm.forward(torch.tensor(seq), torch.arange(len(seq)), None)
        return torch.log_softmax(out.logits, -1)

    def __call__(self, skip) -> float:
        from decoding.target import TargetModel

        key = tuple(sorted(skip))
        if key not in self.cache:
            slim = TargetModel(self.model, layers=kept_layers(key, self.num_layers))
            total, count = 0.0, 0
            for ref, seq in zip(self.reference, self.sequences):
                logq = self._logprobs(slim, seq)
                total += float((ref.exp() * (ref - logq)).sum())
                count += len(seq)
            self.cache[key] = total / count
        return self.cache[key]


def known_masks(num_layers: int, k: int) -> list[tuple[int, ...]]:
    inner = list(range(1, num_layers - 1))
    every_other = inner[::2][:k]  # SWIFT's initial mask, cut to k
    late = inner[-k:]  # the deepest inner layers (late layers are usually the most redundant)
    return [tuple(every_other), tuple(late)]


def make_sampler(name: str, seed: int):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, deterministic_objective=True)
    raise SystemExit(f"error: --sampler={name!r} is not allowed; choose one of: tpe, random, gp")


def search(cost: MaskCost, k: int, trials: int, sampler: str, storage_path: Path, study_name: str, seed: int = 0):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    L = cost.num_layers
    inner = list(range(1, L - 1))
    storage = JournalStorage(JournalFileBackend(str(storage_path)))
    study = optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True,
                                direction="minimize", sampler=make_sampler(sampler, seed))

    def mask_of(params) -> tuple[int, ...]:
        return tuple(sorted(sorted(inner, key=lambda i: -params[f"s{i}"])[:k]))

    if len(study.trials) == 0:
        for mask in known_masks(L, k):
            study.enqueue_trial({f"s{i}": 1.0 if i in mask else 0.0 for i in inner})

    def objective(trial) -> float:
        mask = mask_of({f"s{i}": trial.suggest_float(f"s{i}", 0.0, 1.0) for i in inner})
        trial.set_user_attr("skip", list(mask))
        return cost(mask)

    remaining = max(0, trials - len([t for t in study.trials if t.state.is_finished()]))
    study.optimize(objective, n_trials=remaining)
    return study


def main(argv=None) -> None:
    from pipeline.models import load_model
    from pipeline.schema import register_configs
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from decoding.target import TargetModel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="conf/model option")
    ap.add_argument("--skip", type=int, default=10, help="number of decoder layers to skip (k)")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "random", "gp"))
    ap.add_argument("--calib-prompts", type=int, default=8)
    ap.add_argument("--calib-tokens", type=int, default=64)
    ap.add_argument("--name", default=None, help="mask name (masks/<name>.json); default <model>-dimr")
    ap.add_argument("--storage", default=None, help="Optuna journal file (default outputs/search/<name>.journal)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    name = args.name or f"{args.model}-dimr"

    register_configs()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        model_cfg = OmegaConf.to_object(compose(config_name="config", overrides=[f"model={args.model}"])).model
    model, tokenizer = load_model(model_cfg)
    target = TargetModel(model, tokenizer)
    t0 = time.perf_counter()
    seqs, ids = calibration_sequences(target, tokenizer, args.calib_prompts, args.calib_tokens)
    cost = MaskCost(target, seqs)
    t_calib = time.perf_counter() - t0
    storage = Path(args.storage or f"outputs/search/{name}.journal")
    storage.parent.mkdir(parents=True, exist_ok=True)
    study = search(cost, args.skip, args.trials, args.sampler, storage, name, args.seed)
    wall = time.perf_counter() - t0
    finished = [t for t in study.trials if t.value is not None]
    curve, best = [], float("inf")
    for t in finished:
        best = min(best, t.value)
        curve.append(round(best, 5))
    top = study.best_trial
    skip = top.user_attrs["skip"]
    save_mask(MASK_DIR / f"{name}.json", skip, target.num_layers, model=args.model, cost_kl=top.value,
              search={"sampler": args.sampler, "trials": len(finished), "skip": args.skip, "wall_s": round(wall, 1),
                      "calibration_s": round(t_calib, 1), "calibration_ids": ids,
                      "calibration_tokens": sum(map(len, seqs)), "best_so_far": curve,
                      "known_masks": {str(list(m)): round(cost(m), 5) for m in known_masks(target.num_layers, args.skip)}})
    print(f"mask {name}: skip {skip}  KL(q||q_z)={top.value:.4f}  trials={len(finished)}  wall {wall:.0f}s "
          f"(calibration {t_calib:.0f}s)")
    print("best-so-far cost curve:", " ".join(f"{c:.3f}" for c in curve))


if __name__ == "__main__":
    main()
