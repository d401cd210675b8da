"""The self-distillation corpus: the target's own greedy answers (chat template, up to `max_new_tokens`)
to a large, diverse set of prompts made offline, disjoint from every evaluation set. Drafters learn the
target's distribution, so its answers are the data; hidden states are recomputed by teacher-forced
forwards when training, never stored.

    python -m pipeline.train.corpus                       # SmolLM2-135M in bf16, resumable shards
    python -m pipeline.train.corpus corpus.num_prompts=64 corpus.max_new_tokens=32   # a quick one

Prompts, in four sources mixed evenly (pipeline/train/prompts.py has the first three):
- chat: instruction templates x topics;
- code: requests written from the Python standard library's own signatures and docstrings;
- gsm8k: GSM8K test questions outside the reserved evaluation subsets;
- self: questions the model writes itself from seed topics (a first, short generation stage).
Every prompt is checked against the evaluation prompts (MT-Bench turns, the reserved GSM8K subset,
HumanEval): one shared run of 13 words (the GPT-3 contamination test) drops it.

Shards of `batch_size` answers are written as they finish (a killed run resumes after the last one);
`corpus.npz` bundles them compressed (token ids as uint16 where the vocabulary fits), small enough
to ship, so training can be rerun without regenerating.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from omegaconf import MISSING

from pipeline.errors import ConfigError, check_range
from pipeline.models import ModelConfig
from pipeline.tasks.base import TaskConfig
from pipeline.tasks.chat import build_chat
from pipeline.train.prompts import (CHAT_TEMPLATES, CHAT_TOPICS, chat_requests, gsm8k_training_questions,
                                    stdlib_coding_requests)

log = logging.getLogger(__name__)

SHARD = re.compile(r"shard_\d{5}\.npz")  # a finished shard (temp files and other builders' leftovers do not match)
NGRAM = 13  # words shared with an evaluation prompt that make a training prompt contaminated
MORE_TEMPLATES = (
    "Describe a typical day of someone who works with {t}.",
    "Write a haiku and a limerick about {t}.",
    "What are common misconceptions about {t}?",
    "Explain {t} to a ten-year-old, then to an expert.",
    "Write a dialogue between two friends arguing about {t}.",
    "Give a step-by-step guide for getting started with {t}.",
    "Write a product description for a gadget related to {t}.",
    "List the key terms someone should know about {t}, with a one-line definition each.",
)
MORE_TOPICS = (
    "quantum computing", "ancient Egypt", "vegetarian cooking", "the human immune system", "open-source software",
    "mountain hiking", "knitting", "tax returns", "the French Revolution", "solar panels", "dog training",
    "cryptography", "plate tectonics", "origami", "the Olympic Games", "bread baking", "3D printing",
    "the ocean tides", "wind turbines", "classical music", "cybersecurity", "rainforests", "small business marketing",
    "the periodic table", "video game design", "photography", "the Silk Road", "vaccines", "sailing", "podcasting",
    "the Renaissance", "houseplants", "black holes", "carpentry", "mobile app development", "the moon landing",
)
SEED_TOPICS = MORE_TOPICS + ("economics", "biology", "geography", "literature", "statistics", "astronomy",
                             "architecture", "psychology", "chemistry", "music theory", "philosophy", "nutrition")
QUESTION_ASKS = ("Write one question a curious student might ask about {t}. Reply with the question only.",
                 "Ask me a thought-provoking question about {t}. Reply with the question only.",
                 "Write a practical how-to question someone might ask about {t}. Reply with the question only.")


@dataclass
class CorpusConfig:
    out_dir: str = "outputs/corpus/${model.name}"
    num_prompts: int = 11000  # every offline prompt (~8.2k) + the self-written ones: ~2 M tokens at ~180 per answer
    max_new_tokens: int = 256
    batch_size: int = 32  # batched generate in bf16: far cheaper per token than batch 1
    self_questions: int = 3000  # prompts of the "self" source, written by the model in a first stage
    seed: int = 0
    # a second builder on the same out_dir (another core or node) with descending=true takes the shards from the
    # last one down while the first goes up: they meet in the middle and either bundles the result
    descending: bool = False
    # bundle the shards written so far (corpus.npz + stats.json marked partial) and generate nothing: a snapshot
    # to ship or train on while a long build is stopped; no model is loaded
    bundle_only: bool = False

    def __post_init__(self) -> None:
        check_range("corpus.num_prompts", self.num_prompts, 1)
        check_range("corpus.batch_size", self.batch_size, 1)
        check_range("corpus.max_new_tokens", self.max_new_tokens, 1)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def evaluation_prompts() -> list[str]:
    """Every prompt an evaluation run may see: MT-Bench turns, the reserved GSM8K subset, HumanEval."""
    from pipeline.tasks.loaders import load_examples
    from pipeline.train.prompts import RESERVED_GSM8K

    out = []
    for cfg in (TaskConfig(name="mt_bench"), TaskConfig(name="humaneval"),
                TaskConfig(name="gsm8k", limit=RESERVED_GSM8K, shuffle=True, subset_seed=0)):
        try:
            out += [turn for ex in load_examples(cfg) for turn in ex.turns]
        except Exception as err:  # noqa: BLE001 - a task whose data is absent cannot leak either
            log.info("contamination check: %s not available (%s)", cfg.name, type(err).__name__)
    return out


def drop_contaminated(prompts: list[tuple[str, str]], eval_prompts: list[str]) -> tuple[list[tuple[str, str]], int]:
    banned = set().union(*(ngrams(p) for p in eval_prompts)) if eval_prompts else set()
    kept = [(s, p) for s, p in prompts if not (ngrams(p) & banned)]
    return kept, len(prompts) - len(kept)


ANGLES = ("{s}", "the history of {s}", "careers in {s}", "the future of {s}", "common mistakes in {s}")


def chat_prompts() -> list[str]:
    """Templates x (subject x angle): ~12k distinct requests."""
    subjects = dict.fromkeys(CHAT_TOPICS + MORE_TOPICS + SEED_TOPICS)
    out = set(chat_requests())
    for template in CHAT_TEMPLATES + MORE_TEMPLATES:
        for subject in subjects:
            for angle in ANGLES:
                if "history" in template and "history" in angle:
                    continue
                out.add(template.format(t=angle.format(s=subject)))
    return sorted(out)


def offline_prompts(seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    pools = {"chat": chat_prompts(), "code": stdlib_coding_requests() + explain_requests(),
             "gsm8k": gsm8k_training_questions()}
    return {k: rng.sample(v, len(v)) for k, v in pools.items()}


def explain_requests() -> list[str]:
    """'Explain with an example' variants of the stdlib requests: the same functions, prose answers."""
    out = []
    for request in stdlib_coding_requests():
        name = request.split("`")[1]
        module = request.rsplit("without importing ", 1)[1].split(":")[0]
        out.append(f"Explain what `{module}.{name}` does in Python, with a short example and its output.")
    return out


def interleave(pools: dict[str, list[str]], num: int) -> list[tuple[str, str]]:
    """The sources in turn, so every prefix is an even mix (a longer corpus extends a shorter one)."""
    out, i = [], 0
    while len(out) < num and any(i < len(v) for v in pools.values()):
        out += [(k, v[i]) for k, v in pools.items() if i < len(v)]
        i += 1
    return out[:num]


@torch.inference_mode()
def generate_batch(model, tokenizer, messages: list[str], max_new_tokens: int, stop_ids: set[int],
                   template_kwargs=None, temperature: float = 0.0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids up to and including the stop token) for one batch, left-padded; greedy,
    or sampled at `temperature` (seed torch's generator first)."""
    prompts = [build_chat(tokenizer, TaskConfig(), [(m, None)], template_kwargs) for m in messages]
    width = max(len(p) for p in prompts)
    pad = sorted(stop_ids)[0]
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else \
        {"do_sample": False}
    out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                         pad_token_id=pad, eos_token_id=sorted(stop_ids), **sampling)
    pairs = []
    for b, prompt in enumerate(prompts):
        answer = out[b, width:].tolist()
        end = next((i + 1 for i, t in enumerate(answer) if t in stop_ids), len(answer))
        pairs.append((prompt, answer[:end]))
    return pairs


def self_questions(model, tokenizer, cfg: CorpusConfig, out_dir: Path, stop_ids, template_kwargs) -> list[str]:
    """Questions the model writes from seed topics, sampled at T = 0.8 under a fixed seed (greedy would
    write one question per topic); kept in questions.json, built once."""
    path = out_dir / "questions.json"
    if path.exists():
        return json.loads(path.read_text())
    if cfg.descending:  # a second builder must use the first one's questions, or the prompt lists differ
        raise ConfigError(f"{path} does not exist yet: start the first builder (ascending) and add the second one "
                          "with corpus.descending=true once it has written its questions")
    asks = [a.format(t=t) for a in QUESTION_ASKS for t in SEED_TOPICS]
    rng = random.Random(cfg.seed)
    questions: list[str] = []
    attempt = 0
    while len(questions) < cfg.self_questions and attempt < 4 * cfg.self_questions:
        batch = [asks[(attempt + i) % len(asks)] for i in range(cfg.batch_size)]
        torch.manual_seed(cfg.seed * 100_003 + attempt)
        attempt += cfg.batch_size
        for _, answer in generate_batch(model, tokenizer, batch, 48, stop_ids, template_kwargs, temperature=0.8):
            text = tokenizer.decode(answer, skip_special_tokens=True).strip().split("\n")[0].strip()
            if text.endswith("?") and 20 <= len(text) <= 300 and text not in questions:
                questions.append(text)
        log.info("self-written questions: %d of %d after %d attempts", len(questions), cfg.self_questions, attempt)
    rng.shuffle(questions)
    tmp = temp_path(path)
    tmp.write_text(json.dumps(questions, indent=1))
    tmp.replace(path)
    return questions


def write_shard(path: Path, pairs, sources) -> None:
    lengths = np.array([[len(p), len(a)] for p, a in pairs], dtype=np.int32)
    ids = np.array([t for p, a in pairs for t in p + a], dtype=np.int32)
    tmp = temp_path(path)  # two builders may finish the same shard: no shared temp file
    with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a name
        np.savez(f, ids=ids, lengths=lengths, sources=np.array(sources))
    tmp.replace(path)


def temp_path(path: Path) -> Path:
    """A per-process temp name that no shard pattern matches (shard_00001.npz.<pid>.tmp)."""
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def read_shards(paths: list[Path]) -> list[dict]:
    samples = []
    for path in paths:
        with np.load(path) as data:
            # one read of each array: every `data[key]` decompresses the whole member again
            all_ids, lengths, sources = data["ids"], data["lengths"], data["sources"]
            offset = 0
            for (n_prompt, n_answer), source in zip(lengths, sources):
                ids = torch.from_numpy(all_ids[offset:offset + n_prompt + n_answer].astype(np.int64))
                samples.append({"ids": ids, "prompt_len": int(n_prompt), "source": str(source)})
                offset += n_prompt + n_answer
    return samples


def bundle(out_dir: Path, samples: list[dict], vocab_size: int) -> Path:
    """corpus.npz: every sample's token ids (uint16 where they fit), lengths and source, compressed."""
    dtype = np.uint16 if vocab_size <= 65536 else np.int32
    path = out_dir / "corpus.npz"
    ids = np.concatenate([s["ids"].numpy().astype(dtype) for s in samples])
    tmp = temp_path(path)
    with open(tmp, "wb") as f:
        np.savez_compressed(f, ids=ids,
                            lengths=np.array([[s["prompt_len"], len(s["ids"]) - s["prompt_len"]] for s in samples],
                                             dtype=np.int32),
                            sources=np.array([s["source"] for s in samples]))
    tmp.replace(path)
    return path


def load_corpus(location: str) -> list[dict]:
    """Samples of a corpus: its corpus.npz (a file, or a folder holding it), else its shards."""
    path = Path(location)
    bundled = path if path.suffix == ".npz" else path / "corpus.npz"
    paths = [bundled] if bundled.is_file() else sorted(p for p in path.glob("shard_*.npz") if SHARD.fullmatch(p.name))
    if not paths:
        raise ConfigError(f"corpus {location}: no corpus.npz and no shard_*.npz "
                          "(build it: python -m pipeline.train.corpus)")
    try:
        return read_shards(paths)
    except (OSError, KeyError, ValueError) as err:
        raise ConfigError(f"corpus {location}: unreadable ({type(err).__name__}: {err})") from None


def build_corpus(model, tokenizer, cfg: CorpusConfig, stop_ids: set[int], template_kwargs=None,
                 show_progress: bool = True) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"max_new_tokens": cfg.max_new_tokens, "batch_size": cfg.batch_size, "seed": cfg.seed,
            "self_questions": cfg.self_questions}
    meta_path = out_dir / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()) != meta:
        raise ConfigError(f"{out_dir} holds a corpus built with other settings; remove it or choose corpus.out_dir")
    meta_path.write_text(json.dumps(meta, indent=2))
    pools = offline_prompts(cfg.seed)
    if cfg.self_questions:
        pools["self"] = self_questions(model, tokenizer, cfg, out_dir, stop_ids, template_kwargs)
    prompts, dropped = drop_contaminated(interleave(pools, cfg.num_prompts), evaluation_prompts())
    batches = range(0, len(prompts), cfg.batch_size)
    progress = Progress(TextColumn("[bold]corpus"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        disable=not show_progress)
    with progress:
        task = progress.add_task("corpus", total=len(batches))
        shards = [out_dir / f"shard_{index:05d}.npz" for index in range(len(batches))]
        order = range(len(batches) - 1, -1, -1) if cfg.descending else range(len(batches))
        for done, index in enumerate(order):
            path, first = shards[index], batches[index]
            if not path.exists():
                batch = prompts[first:first + cfg.batch_size]
                pairs = generate_batch(model, tokenizer, [p for _, p in batch], cfg.max_new_tokens, stop_ids,
                                       template_kwargs)
                write_shard(path, pairs, [s for s, _ in batch])
                log.info("corpus shard %d/%d: %d answer tokens", index + 1, len(batches), sum(len(a) for _, a in pairs))
            progress.update(task, completed=done + 1)
    samples = read_shards(shards)
    bundled = bundle(out_dir, samples, model.config.vocab_size)
    return write_stats(out_dir, samples, bundled, {"complete": True, "shards": len(shards),
                                                   "dropped_contaminated": dropped})


def write_stats(out_dir: Path, samples: list[dict], bundled: Path, extra: dict) -> dict:
    stats = {"prompts": len(samples), "answer_tokens": sum(len(s["ids"]) - s["prompt_len"] for s in samples),
             "by_source": {k: sum(s["source"] == k for s in samples) for k in sorted({s["source"] for s in samples})},
             "bundle_mb": round(bundled.stat().st_size / 2**20, 2), **extra}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    log.info("corpus: %s", stats)
    return stats


def bundle_written(out_dir: Path) -> dict:
    """corpus.npz and stats.json of the shards written so far (`complete: false`: a build still to resume)."""
    paths = sorted(p for p in out_dir.glob("shard_*.npz") if SHARD.fullmatch(p.name))
    if not paths:
        raise ConfigError(f"corpus.bundle_only: {out_dir} holds no shard_*.npz (build it: python -m pipeline.train.corpus)")
    samples = read_shards(paths)
    bundled = bundle(out_dir, samples, max(int(s["ids"].max()) for s in samples) + 1)
    return write_stats(out_dir, samples, bundled, {"complete": False, "shards": len(paths),
                                                   "shard_ids": id_ranges([int(p.stem[6:]) for p in paths])})


def id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8\"."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


# ------------------------------------------------------------------------------------------- the command
@dataclass
class CorpusJob:
    model: ModelConfig = MISSING
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    threads: Optional[int] = None


def main() -> None:
    import sys

    import hydra
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from pipeline.cli import USER_ERRORS, exit_on_user_error

    ConfigStore.instance().store(name="base_corpus", node=CorpusJob)
    ConfigStore.instance().store(group="model", name="base_model", node=ModelConfig)

    @hydra.main(version_base="1.3", config_path="../../conf/train", config_name="corpus")
    def run(cfg) -> None:
        from pipeline.models import load_model, stop_token_ids

        job: CorpusJob = OmegaConf.to_object(cfg)
        logging.getLogger().setLevel(logging.INFO)
        with exit_on_user_error(USER_ERRORS):
            if job.threads:
                torch.set_num_threads(job.threads)
            if job.corpus.bundle_only:
                bundle_written(Path(job.corpus.out_dir))
                return
            model, tokenizer = load_model(job.model)
            build_corpus(model, tokenizer, job.corpus, stop_token_ids(model, tokenizer),
                         dict(job.model.chat_template_kwargs), show_progress=sys.stderr.isatty())

    run()


if __name__ == "__main__":
    main()
