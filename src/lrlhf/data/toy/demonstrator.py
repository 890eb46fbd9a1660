"""The demonstrator (SFT data) and the candidate generator (preference data).

The demonstrator answers right with probability ``p_correct``; otherwise it makes one plausible mistake
(sort: a swapped neighbour pair, a dropped number, a duplicated number, only half the list, the list left
unsorted; count: off by one or two, the list repeated back), and independently it sometimes pads its
answer with a little filler. Its mean gold utility is middling (docs/toy_world.md), so the SFT policy has
room to improve under RL, and best-of-16 of its samples shows how much.

Candidates for preference data mix: the ideal answer, demonstrator samples, *long filler answers*
(a right or wrong answer wrapped in many filler words, so annotators' length bias is learnable by a reward
model and exploitable by PPO) and degenerate outputs (a repeated word, filler only, the prompt echoed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .tasks import check_task, ideal_tokens
from .vocab import FILLER_WORDS

FILLER_PREFIXES = (
    "sure", "ok", "well", "sure here is the answer :", "let me see", "great question", "the answer is",
    "ok so the result is", "i think it is",
)  # fmt: skip
FILLER_SUFFIXES = (
    "done", "i hope this helps", "that is my answer", "thanks for asking", "i think", "hope this helps you",
    "and that is the list", "let me know", "of course",
)  # fmt: skip


@dataclass(frozen=True)
class DemonstratorConfig:
    """How good the SFT demonstrator is (calibrated for a mean gold utility of about 0.5)."""

    p_correct: float = 0.15
    """Probability that the demonstrator's answer content is exactly right."""
    p_filler: float = 0.4
    """Probability that it wraps its answer in a short filler prefix or suffix."""

    def __post_init__(self):
        for name in ("p_correct", "p_filler"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class CandidateConfig:
    """The mixture that preference candidates are drawn from (weights need not sum to 1)."""

    w_ideal: float = 0.2
    """Weight of the ideal answer."""
    w_demonstrator: float = 0.4
    """Weight of a demonstrator sample."""
    w_long_filler: float = 0.25
    """Weight of a long filler answer (an answer inside 4-24 filler words)."""
    w_degenerate: float = 0.15
    """Weight of a degenerate output (repetition, filler only, the prompt echoed)."""

    def __post_init__(self):
        names = ("w_ideal", "w_demonstrator", "w_long_filler", "w_degenerate")
        weights = tuple(getattr(self, name) for name in names)
        for name, value in zip(names, weights, strict=True):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if sum(weights) <= 0:
            raise ValueError("candidate weights w_* must not all be 0")


def _mistake(rng: random.Random, task: dict) -> list[str]:
    """A plausible wrong answer for the task, as words."""
    ideal = ideal_tokens(task)
    if task["kind"] == "count":
        k = len(task["items"])
        choice = rng.randrange(4)
        if choice == 0:
            return [str(k + 1)]
        if choice == 1:
            return [str(max(0, k - 1))]
        if choice == 2:
            return [str(k + 2)]
        return [str(x) for x in task["items"]]
    n = len(ideal)
    choice = rng.randrange(5)
    if choice == 0:  # a swapped neighbour pair
        i = rng.randrange(n - 1) if n > 1 else 0
        out = list(ideal)
        if n > 1:
            out[i], out[i + 1] = out[i + 1], out[i]
        return out
    if choice == 1:  # a dropped number
        i = rng.randrange(n)
        return ideal[:i] + ideal[i + 1:]
    if choice == 2:  # a duplicated number
        i = rng.randrange(n)
        return ideal[: i + 1] + ideal[i:]
    if choice == 3:  # half the list
        return ideal[: max(1, n // 2)]
    return [str(x) for x in task["items"]]  # left unsorted


def _wrap_short(rng: random.Random, words: list[str]) -> list[str]:
    """Words with one short filler prefix or suffix."""
    if rng.random() < 0.5:
        return rng.choice(FILLER_PREFIXES).split() + words
    return words + rng.choice(FILLER_SUFFIXES).split()


def demonstrate(rng: random.Random, task: dict, cfg: DemonstratorConfig) -> str:
    """One demonstration for ``task``."""
    check_task(task)
    words = ideal_tokens(task) if rng.random() < cfg.p_correct else _mistake(rng, task)
    if rng.random() < cfg.p_filler:
        words = _wrap_short(rng, words)
    return " ".join(words)


def long_filler(rng: random.Random, task: dict, cfg: DemonstratorConfig) -> str:
    """An answer (ideal half the time, else a demonstration) inside 4-24 words of filler."""
    words = ideal_tokens(task) if rng.random() < 0.5 else demonstrate(rng, task, cfg).split()
    n_filler = rng.randint(4, 24)
    prefix = rng.choice(FILLER_PREFIXES).split()
    suffix: list[str] = []
    while len(prefix) + len(suffix) < n_filler:
        suffix += rng.choice(FILLER_SUFFIXES).split()
    return " ".join(prefix + words + suffix)


def degenerate(rng: random.Random, task: dict) -> str:
    """A degenerate output: one word repeated, filler only, or the prompt's items echoed twice."""
    choice = rng.randrange(3)
    if choice == 0:
        word = rng.choice(ideal_tokens(task) + list(FILLER_WORDS[:6]))
        return " ".join([word] * rng.randint(3, 12))
    if choice == 1:
        return " ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(2, 10)))
    return " ".join(str(x) for x in task["items"] * 2)


def candidate(rng: random.Random, task: dict, demo: DemonstratorConfig, cfg: CandidateConfig) -> str:
    """One preference candidate drawn from the mixture in ``cfg``."""
    check_task(task)
    kind = rng.choices(range(4), weights=(cfg.w_ideal, cfg.w_demonstrator, cfg.w_long_filler,
                                          cfg.w_degenerate))[0]
    if kind == 0:
        return " ".join(ideal_tokens(task))
    if kind == 1:
        return demonstrate(rng, task, demo)
    if kind == 2:
        return long_filler(rng, task, demo)
    return degenerate(rng, task)


def distinct_candidates(
    rng: random.Random, task: dict, k: int, demo: DemonstratorConfig, cfg: CandidateConfig,
    max_tries: int = 200,
) -> list[str]:
    """``k`` pairwise-distinct candidates (raises if ``max_tries`` draws do not yield them)."""
    out: list[str] = []
    for _ in range(max_tries):
        text = candidate(rng, task, demo, cfg)
        if text not in out:
            out.append(text)
            if len(out) == k:
                return out
    raise RuntimeError(f"could not draw {k} distinct candidates for task {task!r} in {max_tries} tries")
