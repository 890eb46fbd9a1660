"""Held-out gold utility of a policy on the toy world, measured by sampling."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from lrlhf.data.records import PromptExample
from lrlhf.data.toy import gold_utility
from lrlhf.functional.stats import bootstrap_interval
from lrlhf.models.generation import SamplingConfig, generate_responses


class UtilityEstimate(NamedTuple):
    """Mean gold utility of sampled responses.

    mean: over all prompts (each prompt's ``n_samples`` averaged first).
    stderr: standard error of ``mean`` across prompts (``std(per-prompt means, ddof=1) / sqrt(P)``): samples
        of one prompt are correlated, so the prompt is the independent unit; 0 for a single prompt.
    by_kind: mean per request kind (``meta["task"]["kind"]``).
    per_prompt: each prompt's mean, in prompt order (for paired comparisons and bootstrap intervals).
    """

    mean: float
    stderr: float
    by_kind: dict[str, float]
    per_prompt: tuple[float, ...] = ()


def sample_gold_utility(
    model,
    tokenizer,
    prompts: Sequence[PromptExample],
    n_samples: int = 1,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    seed: int = 0,
    batch_size: int = 64,
) -> UtilityEstimate:
    """Sample ``n_samples`` responses per prompt and score them with :func:`lrlhf.data.toy.gold_utility`.

    Prompts are rendered with the chat template plus generation prompt and left-padded; sampling is plain
    (``do_sample=True``, ``top_k=0``, ``top_p=1.0``) at ``temperature`` (0 = greedy); only generated tokens
    are decoded, cut at EOS. Deterministic from ``seed`` (the caller's RNG state is left untouched).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if not prompts:
        raise ValueError("sample_gold_utility needs at least one prompt")
    repeated = [p for p in prompts for _ in range(n_samples)]  # the n samples of a prompt are adjacent
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    responses = generate_responses(model, tokenizer, repeated, sampling, batch_size=batch_size)
    per_prompt = []
    kinds: dict[str, list[float]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        task = prompt.meta["task"]
        scores = [gold_utility(task, r) for r in responses[i * n_samples:(i + 1) * n_samples]]
        per_prompt.append(sum(scores) / n_samples)
        kinds[task["kind"]].append(per_prompt[-1])
    n = len(per_prompt)
    mean = sum(per_prompt) / n
    var = sum((u - mean) ** 2 for u in per_prompt) / (n - 1) if n > 1 else 0.0
    by_kind = {kind: sum(v) / len(v) for kind, v in sorted(kinds.items())}
    return UtilityEstimate(mean, math.sqrt(var / n), by_kind, tuple(per_prompt))


def compare_with_sft(model, sft_model, tokenizer, prompts: str | Sequence[PromptExample], name: str, *,
                     n_samples: int, temperature: float, max_new_tokens: int, seed: int, judge="toy_gold",
                     max_prompts: int | None = None, max_prompt_length: int = 1024) -> dict:
    """``judge``'s mean score of ``sft_model``'s and of ``model``'s (reported as ``name``) responses to the same
    prompts with the same seed, the paired difference and ``model``'s win rate against SFT (sample i of a prompt
    against sample i; a tie counts half), each with its 95% prompt-bootstrap interval (``_interval``); with gold,
    the fraction of responses solved exactly (utility 1: ``gold/sft_solved``, ``gold/<name>_solved``) and the paired
    gain ``gold/<name>_solved_gain`` with its interval.

    ``judge``: ``toy_gold`` (keys ``gold/...``: the toy world's gold utility), or any judge of
    :func:`lrlhf.eval.judges.resolve_judge` (keys ``judge/...``: a world without gold reports no "gold"), with the
    judge's own held-out accuracy where it is known (:func:`lrlhf.eval.judges.judge_accuracy`).
    ``prompts``: records or a file read as prompts; ``max_prompts``: the first N only (None: all), each cut from the
    left to ``max_prompt_length`` tokens."""
    from lrlhf.eval.judges import judge_accuracy, judge_pairs, resolve_judge

    label = "gold" if judge == "toy_gold" else "judge"
    judge = resolve_judge(judge, key="eval.judge")
    if isinstance(prompts, str):
        from lrlhf.data.formats import load_records

        prompts, _ = load_records(prompts, "prompt", verbose=False)
    prompts = list(prompts)[:max_prompts]
    repeated = [p for p in prompts for _ in range(n_samples)]  # the n samples of a prompt are adjacent
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    sft_texts = generate_responses(sft_model, tokenizer, repeated, sampling, batch_size=64,
                                   max_prompt_length=max_prompt_length)
    texts = generate_responses(model, tokenizer, repeated, sampling, batch_size=64, max_prompt_length=max_prompt_length)
    u_sft, u_model, _ = judge_pairs(repeated, sft_texts, texts, judge, seed=seed)

    def per_prompt(values: Sequence[float]) -> list[float]:
        return [sum(values[i:i + n_samples]) / n_samples for i in range(0, len(values), n_samples)]

    sft, trained = per_prompt(u_sft), per_prompt(u_model)
    diff = [b - a for a, b in zip(sft, trained, strict=True)]
    wins = per_prompt([1.0 if b > a else 0.5 if b == a else 0.0 for a, b in zip(u_sft, u_model, strict=True)])
    out = judge_accuracy(judge)  # what the judge itself can see, printed next to its verdict
    if label == "gold":  # the toy world's exact solutions: a verifiable reward's solve rate
        solved_sft = per_prompt([float(u >= 1.0) for u in u_sft])
        solved = per_prompt([float(u >= 1.0) for u in u_model])
        gain = [b - a for a, b in zip(solved_sft, solved, strict=True)]
        out |= {"gold/sft_solved": sum(solved_sft) / len(solved_sft), f"gold/{name}_solved": sum(solved) / len(solved),
               f"gold/{name}_solved_gain": sum(gain) / len(gain),
               f"gold/{name}_solved_gain_interval": bootstrap_interval(gain)}
    return out | {f"{label}/sft": sum(sft) / len(sft), f"{label}/sft_interval": bootstrap_interval(sft),
            f"{label}/{name}": sum(trained) / len(trained), f"{label}/{name}_interval": bootstrap_interval(trained),
            f"{label}/{name}_minus_sft": sum(diff) / len(diff),
            f"{label}/{name}_minus_sft_interval": bootstrap_interval(diff),
            f"{label}/{name}_win_rate": sum(wins) / len(wins),
            f"{label}/{name}_win_rate_interval": bootstrap_interval(wins)}
