"""Build the toy world: prompt sets, SFT / preference / ranking / prompt files, tokenizer, model, yardsticks.

Everything is a function of the seed: each part draws from its own ``random.Random`` keyed by
``(seed, part)``, so the files are byte-identical across runs, and changing one part's size does not
reshuffle the random draws of another part's *content*.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lrlhf.utils.io import atomic_save_folder, atomic_write_text, write_json_lines

from .annotators import (
    AnnotatorConfig,
    accuracy_ceiling,
    expected_agreement,
    observed_agreement,
    sample_label,
    sample_ranks,
)
from .demonstrator import CandidateConfig, DemonstratorConfig, demonstrate, distinct_candidates
from .model import TinyModelConfig, build_model
from .tasks import KINDS, TaskConfig, ideal_answer, prompt_messages, prompt_text, sample_task
from .utility import gold_utility, response_tokens
from .vocab import build_tokenizer

PROMPT_SETS = ("sft_train", "sft_val", "pref_train", "pref_val", "pref_test", "rl", "eval")
BEST_OF = 16


@dataclass(frozen=True)
class WorldSizes:
    """Number of prompts in each set (all sets are disjoint by prompt text). Defaults build in seconds."""

    sft_train: int = 2000
    """SFT training prompts (one demonstration each)."""
    sft_val: int = 200
    """SFT validation prompts."""
    pref_train: int = 4000
    """Preference training prompts (``pairs_per_prompt`` pairs and one ranking each)."""
    pref_val: int = 200
    """Preference validation prompts."""
    pref_test: int = 200
    """Preference test prompts."""
    rl: int = 500
    """RL rollout prompts."""
    eval: int = 200
    """Held-out evaluation prompts (gold utility, best-of-N, win rates)."""
    candidates_per_prompt: int = 4
    """K: distinct candidates drawn per preference prompt (the ranking's size)."""
    pairs_per_prompt: int = 2
    """Labelled pairs per preference prompt, each two distinct candidates out of the K."""

    def __post_init__(self):
        for name in PROMPT_SETS:
            if getattr(self, name) < 0:
                raise ValueError(f"sizes.{name} must be >= 0, got {getattr(self, name)}")
        if self.candidates_per_prompt < 2:
            raise ValueError(f"sizes.candidates_per_prompt must be >= 2, got {self.candidates_per_prompt}")
        if self.pairs_per_prompt < 1:
            raise ValueError(f"sizes.pairs_per_prompt must be >= 1, got {self.pairs_per_prompt}")


@dataclass(frozen=True)
class WorldConfig:
    """Everything that defines a toy world (with the seed)."""

    seed: int = 0
    """Master seed: all randomness derives from it."""
    sizes: WorldSizes = field(default_factory=WorldSizes)
    """How many prompts each set holds."""
    tasks: TaskConfig = field(default_factory=TaskConfig)
    """How requests are sampled."""
    demonstrator: DemonstratorConfig = field(default_factory=DemonstratorConfig)
    """The SFT demonstrator's quality."""
    candidates: CandidateConfig = field(default_factory=CandidateConfig)
    """The preference candidates' mixture."""
    annotators: AnnotatorConfig = field(default_factory=AnnotatorConfig)
    """The simulated annotators' label model."""
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    """The tiny Llama's shape."""

    def __post_init__(self):
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")


@dataclass(frozen=True)
class ToyWorldPaths:
    """Where :func:`build_world` wrote each artefact (all under ``root``)."""

    root: Path
    tokenizer: Path
    model: Path
    sft_train: Path
    sft_val: Path
    pref_train: Path
    pref_val: Path
    pref_test: Path
    rank_train: Path
    rank_val: Path
    rank_test: Path
    rl_prompts: Path
    eval_prompts: Path
    world_json: Path

    @classmethod
    def under(cls, root: str | os.PathLike) -> ToyWorldPaths:
        root = Path(root)
        files = {name: root / f"{name}.jsonl" for name in (
            "sft_train", "sft_val", "pref_train", "pref_val", "pref_test", "rank_train", "rank_val",
            "rank_test", "rl_prompts", "eval_prompts")}  # fmt: skip
        return cls(root=root, tokenizer=root / "tokenizer", model=root / "model",
                   world_json=root / "world.json", **files)


def _rng(seed: int, part: str):
    import random

    return random.Random(f"lrlhf-toy:{seed}:{part}")


def sample_prompt_sets(cfg: WorldConfig, extra: int = 0) -> dict[str, list[dict]]:
    """Tasks for every prompt set; no prompt text appears twice, so the sets are disjoint. ``extra`` more prompts,
    disjoint from all of them, come as ``sets["extra"]`` (the sets themselves do not change)."""
    rng = _rng(cfg.seed, "prompts")
    total = sum(getattr(cfg.sizes, name) for name in PROMPT_SETS) + extra
    seen: set[str] = set()
    pool: list[dict] = []
    while len(pool) < total:
        task = sample_task(rng, cfg.tasks)
        text = prompt_text(task)
        if text not in seen:
            seen.add(text)
            pool.append(task)
    sets, start = {}, 0
    for name in PROMPT_SETS:
        size = getattr(cfg.sizes, name)
        sets[name] = pool[start:start + size]
        start += size
    sets["extra"] = pool[start:]
    return sets


def judge_records(cfg: WorldConfig) -> dict[str, list[dict]]:
    """Preference pairs for a held-out judge reward model (``judge_train``: half as many prompts as
    ``pref_train``; ``judge_val``: as many as ``pref_val``), labelled by the same annotators on prompts that are in
    no other file of the world: the toy world's counterpart of a real world's judge split (lrlhf.data.worlds)."""
    n_train, n_val = max(1, cfg.sizes.pref_train // 2), max(1, cfg.sizes.pref_val)
    extra = sample_prompt_sets(cfg, extra=n_train + n_val)["extra"]
    return {"judge_train": preference_records(extra[:n_train], cfg, "judge_train")[0],
            "judge_val": preference_records(extra[n_train:], cfg, "judge_val")[0]}


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def sft_records(tasks: list[dict], cfg: WorldConfig, part: str) -> list[dict]:
    """SFT records: the prompt and one demonstration."""
    rng = _rng(cfg.seed, part)
    return [{"messages": prompt_messages(t) + _assistant(demonstrate(rng, t, cfg.demonstrator)), "task": t}
            for t in tasks]


def preference_records(tasks: list[dict], cfg: WorldConfig, part: str) -> tuple[list[dict], list[dict]]:
    """(pair records, ranking records) for the preference prompts ``tasks``."""
    rng = _rng(cfg.seed, part)
    ann, sizes = cfg.annotators, cfg.sizes
    pairs, rankings = [], []
    for task in tasks:
        texts = distinct_candidates(rng, task, sizes.candidates_per_prompt, cfg.demonstrator, cfg.candidates)
        golds = [gold_utility(task, t) for t in texts]
        lengths = [len(response_tokens(t)) for t in texts]
        for _ in range(sizes.pairs_per_prompt):
            a, b = rng.sample(range(len(texts)), 2)
            label = sample_label(rng, golds[a], golds[b], lengths[a], lengths[b], ann)
            chosen, rejected = (b, a) if label == 0.0 else (a, b)
            pairs.append({
                "prompt": prompt_messages(task), "chosen": _assistant(texts[chosen]),
                "rejected": _assistant(texts[rejected]), "target": 0.5 if label == 0.5 else 1.0,
                "both_bad": golds[a] < ann.bad_threshold and golds[b] < ann.bad_threshold, "task": task,
            })
        rankings.append({"prompt": prompt_messages(task), "completions": [_assistant(t) for t in texts],
                         "ranks": sample_ranks(rng, golds, lengths, ann), "task": task})
    return pairs, rankings


def prompt_records(tasks: list[dict]) -> list[dict]:
    """RL / evaluation prompt records."""
    return [{"prompt": prompt_messages(t), "task": t} for t in tasks]


def generate_world_data(cfg: WorldConfig) -> dict[str, list[dict]]:
    """Every data file's records, keyed by file stem (see :class:`ToyWorldPaths`)."""
    sets = sample_prompt_sets(cfg)
    data = {"sft_train": sft_records(sets["sft_train"], cfg, "sft_train"),
            "sft_val": sft_records(sets["sft_val"], cfg, "sft_val")}
    for split in ("train", "val", "test"):
        data[f"pref_{split}"], data[f"rank_{split}"] = preference_records(sets[f"pref_{split}"], cfg,
                                                                          f"pref_{split}")
    data["rl_prompts"] = prompt_records(sets["rl"])
    data["eval_prompts"] = prompt_records(sets["eval"])
    return data


def _pair_stats(records: list[dict]) -> tuple[list[float], list[float], list[int], list[int], list[float]]:
    """Golds, lengths and labels of pair records with A = chosen, B = rejected (label 1, or 0.5 for ties)."""
    ga, gb, la, lb, labels = [], [], [], [], []
    for r in records:
        a, b = r["chosen"][0]["content"], r["rejected"][0]["content"]
        ga.append(gold_utility(r, a))
        gb.append(gold_utility(r, b))
        la.append(len(response_tokens(a)))
        lb.append(len(response_tokens(b)))
        labels.append(r["target"])
    return ga, gb, la, lb, labels


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def yardsticks(cfg: WorldConfig, data: dict[str, list[dict]], tokenizer) -> dict:
    """The figures ``describe`` prints and ``world.json`` stores (see docs/toy_world.md)."""
    rng = _rng(cfg.seed, "yardsticks")
    eval_tasks = [r["task"] for r in data["eval_prompts"]]
    demo, best = [], []
    for task in eval_tasks:
        samples = [gold_utility(task, demonstrate(rng, task, cfg.demonstrator)) for _ in range(BEST_OF)]
        demo.append(samples[0])
        best.append(max(samples))
    examples = {}
    for kind in KINDS:
        task = next((t for t in eval_tasks if t["kind"] == kind), None)
        if task is not None:
            answer = ideal_answer(task)
            examples[kind] = {
                "prompt": tokenizer.apply_chat_template(prompt_messages(task), tokenize=False,
                                                        add_generation_prompt=True),
                "ideal_answer": answer, "gold": gold_utility(task, answer),
            }
    ga, gb, la, lb, labels = _pair_stats(data["pref_train"])
    ann = cfg.annotators
    return {
        "vocab_size": len(tokenizer),
        "examples": examples,
        "demonstrator_mean_gold": _mean(demo),
        "demonstrator_mean_gold_by_kind": {
            k: _mean([g for t, g in zip(eval_tasks, demo, strict=True) if t["kind"] == k]) for k in KINDS},
        "demonstrator_best_of_16_gold": _mean(best),
        "sft_train_mean_gold": _mean([gold_utility(r, r["messages"][-1]["content"])
                                      for r in data["sft_train"]]),
        "annotator_agreement_expected": expected_agreement(ga, gb, la, lb, ann),
        "annotator_agreement_observed": observed_agreement(ga, gb, labels),
        "annotator_accuracy_ceiling": accuracy_ceiling(ga, gb, la, lb, ann),
        "pref_train_pairs": len(labels),
        "pref_train_tie_fraction": _mean([float(x == 0.5) for x in labels]),
        "pref_train_both_bad_fraction": _mean([float(r["both_bad"]) for r in data["pref_train"]]),
    }


def _save_folder_atomic(obj, target: Path) -> None:
    """``obj.save_pretrained`` into a temp folder next to ``target``, then swap it in."""
    atomic_save_folder(target, obj.save_pretrained)


def world_summary(cfg: WorldConfig, data: dict[str, list[dict]], tokenizer) -> dict:
    """The content of ``world.json``: config, file names, record counts and yardsticks."""
    return {
        "config": asdict(cfg),
        "files": {name: f"{name}.jsonl" for name in data} | {"tokenizer": "tokenizer", "model": "model"},
        "counts": {name: len(records) for name, records in data.items()},
        "yardsticks": yardsticks(cfg, data, tokenizer),
    }


def build_world(out_dir: str | os.PathLike, seed: int = 0, sizes: WorldSizes | None = None,
                config: WorldConfig | None = None) -> ToyWorldPaths:
    """Write the toy world for ``seed`` under ``out_dir`` and return where everything is.

    ``config`` overrides the whole world definition (its ``seed`` and ``sizes`` then win over the arguments).
    """
    cfg = config if config is not None else WorldConfig(seed=seed, sizes=sizes or WorldSizes())
    paths = ToyWorldPaths.under(out_dir)
    tokenizer = build_tokenizer(model_max_length=cfg.model.max_position_embeddings)
    data = generate_world_data(cfg)
    for name, records in data.items():
        write_json_lines(getattr(paths, name), records)
    _save_folder_atomic(tokenizer, paths.tokenizer)
    model = build_model(cfg.model, tokenizer, cfg.seed)

    def save_model(folder: Path) -> None:
        # The tokenizer goes with the model too, so `model/` loads like any hub checkpoint.
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    atomic_save_folder(paths.model, save_model)
    summary = world_summary(cfg, data, tokenizer)
    text = json.dumps(summary, ensure_ascii=False, sort_keys=True, indent=2) + "\n"
    atomic_write_text(paths.world_json, text)
    return paths


def describe(cfg: WorldConfig) -> str:
    """The yardsticks of the world ``cfg`` as text (computed in memory; nothing is written)."""
    tokenizer = build_tokenizer(model_max_length=cfg.model.max_position_embeddings)
    y = yardsticks(cfg, generate_world_data(cfg), tokenizer)
    by_kind = ", ".join(f"{k} {v:.3f}" for k, v in y["demonstrator_mean_gold_by_kind"].items())
    lines = [f"toy world, seed {cfg.seed}", f"vocabulary size: {y['vocab_size']}"]
    for kind, ex in y["examples"].items():
        lines += [f"example ({kind}):", f"  prompt: {ex['prompt']}", f"  ideal answer: {ex['ideal_answer']}",
                  f"  gold: {ex['gold']:.3f}"]
    lines += [
        f"demonstrator mean gold: {y['demonstrator_mean_gold']:.3f} ({by_kind})",
        f"demonstrator best-of-{BEST_OF} gold: {y['demonstrator_best_of_16_gold']:.3f}",
        f"annotator agreement with gold: {y['annotator_agreement_expected']:.3f} expected, "
        f"{y['annotator_agreement_observed']:.3f} observed on {y['pref_train_pairs']} pairs",
        f"annotator accuracy ceiling: {y['annotator_accuracy_ceiling']:.3f}",
        f"ties: {y['pref_train_tie_fraction']:.3f} of pairs; "
        f"both bad: {y['pref_train_both_bad_fraction']:.3f}",
    ]
    return "\n".join(lines)
