"""Judges of responses, and pairwise judging with the A/B order randomised.

A **pointwise judge** is any callable ``judge(prompt, response) -> float`` (higher is better): the toy world's gold
utility (:func:`lrlhf.eval.toy_gold_judge`), a held-out reward model (:func:`reward_model_judge`), a rule set; or an
object with ``score_batch(prompt_records, response_texts) -> list[float]`` that scores a batch at once
(:func:`score_responses`). A **pairwise judge** (e.g. an LLM asked "which answer is better?") sees two responses at
once and may favour the first or the second position; mark it with ``pairwise = True`` and make it return the
utilities of ``(first, second)``. :func:`judge_pairs` shows it A and B in a seeded random order and un-swaps the
answer, so a position bias cannot favour either policy. Pointwise judges see one response at a time and need no
such care. :func:`resolve_judge` turns a config value into a judge, for ``eval.judge`` and for the early-stopping
callback's ``utility`` alike.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lrlhf.data.records import PromptExample

Judge = Callable[[PromptExample, str], float]
JUDGE_NAMES = "toy_gold, rm:<folder> or <module>:<callable>"


def is_pairwise(judge) -> bool:
    return bool(getattr(judge, "pairwise", False))


def judge_pairs(prompts: Sequence[PromptExample], a: Sequence[str], b: Sequence[str], judge,
                seed: int = 0) -> tuple[list[float], list[float], list[bool]]:
    """Utilities of A's and B's responses to the same prompts: ``(u_a, u_b, swapped)``.

    A pointwise judge scores each response alone. A pairwise judge (``judge.pairwise``) is called as
    ``judge(prompt, first, second) -> (u_first, u_second)`` with A first unless ``swapped[i]`` (a fair coin per
    comparison from ``random.Random(seed)``), and its answer is mapped back to (A, B).
    """
    if not len(prompts) == len(a) == len(b):
        raise ValueError(f"{len(prompts)} prompts, {len(a)} responses of A and {len(b)} of B; need one each")
    if not is_pairwise(judge):
        return score_responses(judge, prompts, a), score_responses(judge, prompts, b), [False] * len(a)
    rng = random.Random(seed)
    u_a, u_b, swapped = [], [], []
    for prompt, ra, rb in zip(prompts, a, b, strict=True):
        swap = rng.random() < 0.5
        first, second = judge(prompt, rb, ra) if swap else judge(prompt, ra, rb)
        u_a.append(float(second if swap else first))
        u_b.append(float(first if swap else second))
        swapped.append(swap)
    return u_a, u_b, swapped


def reward_model_judge(folder: str, max_length: int = 1024) -> Judge:
    """A held-out reward model (the folder of :meth:`RewardModule.export`) as a pointwise judge: its raw score
    of the (prompt, response) rendered with the chat template. Use one trained on other data than the proxy."""
    import torch

    from lrlhf.models import ModelConfig, load_tokenizer
    from lrlhf.models.reward import load_reward_model
    from lrlhf.rewards.text import reward_model_scorer

    with torch.random.fork_rng(devices=[]):  # building it must not move the run's RNG (nor its rollouts)
        scorer = reward_model_scorer(load_reward_model(folder), load_tokenizer(ModelConfig(folder)), max_length)

    def judge(prompt: PromptExample, response: str) -> float:
        return scorer([prompt], [response])[0]

    judge.score_batch = scorer  # batched: (prompt_records, response_texts) -> scores
    judge.__name__ = f"rm:{folder}"
    judge.folder = folder  # where its own held-out accuracy is found (judge_accuracy)
    return judge


def judge_accuracy(judge) -> dict:
    """What is known of a judge's own held-out accuracy, as ``judge/*`` summary keys printed next to every verdict
    it gives (:func:`lrlhf.utils.console.judge_lines`). For a reward-model judge (``rm:<folder>``) built by an RM
    stage, that stage's ``summary.json`` (in the folder or beside it): ``judge/accuracy`` (pairwise accuracy on its
    held-out pairs), ``judge/accuracy_interval``, ``judge/pairs``, ``judge/longer_wins`` (what "the longer answer
    wins" scores on the same pairs) and ``judge/source``. A judge of the user's may carry them itself as a
    ``heldout`` dict (``accuracy``, ``accuracy_interval``, ``pairs``, ``longer_wins``). ``{"judge/accuracy": None}``
    when nothing is known; ``{}`` for a judge marked ``exact = True``: a world's gold or a verifier (the toy world's
    gold utility, world=sentiment's gold, the constraint and math checks), the definition of what it measures."""
    if getattr(judge, "exact", False):
        return {}
    own = getattr(judge, "heldout", None)
    if isinstance(own, dict) and "accuracy" in own:
        return {f"judge/{key}": own.get(key) for key in ("accuracy", "accuracy_interval", "pairs", "longer_wins")} | {
            "judge/source": f"{getattr(judge, '__name__', type(judge).__name__)}.heldout"}
    folder = getattr(judge, "folder", None)
    for candidate in (Path(folder), Path(folder).parent) if folder else ():
        path = candidate / "summary.json"
        summary = json.loads(path.read_text()) if path.is_file() else {}
        if "test/pair_accuracy" in summary:
            return {"judge/accuracy": summary["test/pair_accuracy"],
                    "judge/accuracy_interval": summary.get("test/accuracy_interval"),
                    "judge/pairs": summary.get("test/pairs"), "judge/longer_wins": summary.get("test/longer_wins"),
                    "judge/source": str(path)}
    return {"judge/accuracy": None}


def resolve_judge(spec: str | Callable | Any, key: str = "eval.judge") -> Any:
    """A judge from its config value: ``toy_gold``, ``rm:<reward model folder>``, ``<module>:<attribute>`` (a
    callable, or a zero-argument factory marked ``factory = True``), or the judge itself: a callable
    ``(prompt_record, response_text) -> float`` or an object with ``score_batch(prompt_records, response_texts)``.

    The one resolver of ``eval.judge`` and ``callbacks.early_stopping.utility``: ``key`` is the config key an
    error names.
    """
    if not isinstance(spec, str):
        if callable(spec) or hasattr(spec, "score_batch"):
            return spec
        raise ValueError(f"{key} must be {JUDGE_NAMES}, a callable (prompt_record, response_text) -> float or an "
                         f"object with score_batch; got {spec!r}")
    if spec == "toy_gold":
        from lrlhf.eval.best_of_n import toy_gold_judge

        return toy_gold_judge
    if spec.startswith("rm:"):
        return reward_model_judge(spec[3:])
    module, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"{key} must be {JUDGE_NAMES}, got {spec!r}")
    try:
        judge = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{key}={spec!r}: {err}") from err
    if getattr(judge, "factory", False):
        judge = judge()
    if not callable(judge) and not hasattr(judge, "score_batch"):
        raise ValueError(f"{key}={spec!r} is not callable and has no score_batch")
    return judge


def score_responses(judge, records: Sequence[PromptExample], texts: Sequence[str]) -> list[float]:
    """A pointwise judge's score of each (record, text): ``judge.score_batch(records, texts)`` when it has one,
    else ``judge(record, text)`` one at a time."""
    if hasattr(judge, "score_batch"):
        return [float(u) for u in judge.score_batch(records, texts)]
    return [float(judge(record, text)) for record, text in zip(records, texts, strict=True)]
