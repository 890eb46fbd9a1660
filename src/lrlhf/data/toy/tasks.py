"""Request kinds: what a prompt asks, its ideal answer, and how it is sampled from a seed.

A *task* is a plain JSON-able dict that holds everything :func:`~.utility.gold_utility` needs:

- ``{"kind": "sort", "items": [5, 3, 8, 1]}``: "sort these numbers : 5 3 8 1" -> ``"1 3 5 8"``;
- ``{"kind": "count", "items": ["fig", "cat", "fig"]}``: "how many items : fig cat fig" -> ``"3"``.

Both answers depend on the prompt's content, so a policy must read the prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .vocab import ITEMS

KINDS = ("sort", "count")
_PROMPT_HEADS = {"sort": "sort these numbers :", "count": "how many items :"}


@dataclass(frozen=True)
class TaskConfig:
    """How prompts are sampled. The defaults follow docs/architecture.md: sort harder (longer lists) and count
    easier (shorter lists) than the calibration run (sort 3-6, count 3-8)."""

    sort_min_len: int = 4
    """Fewest numbers in a sort request."""
    sort_max_len: int = 8
    """Most numbers in a sort request."""
    sort_max_value: int = 9
    """Numbers to sort are drawn uniformly from 0..sort_max_value (with repeats)."""
    count_min_len: int = 2
    """Fewest items in a count request."""
    count_max_len: int = 6
    """Most items in a count request (counts stay below 21, the largest number word)."""
    sort_fraction: float = 0.5
    """Probability that a sampled request is a sort request (else count)."""

    def __post_init__(self):
        if not 1 <= self.sort_min_len <= self.sort_max_len:
            raise ValueError(f"sort_min_len must be in 1..sort_max_len, got {self.sort_min_len}")
        if not 0 <= self.sort_max_value <= 20:
            raise ValueError(f"sort_max_value must be in 0..20 (the number words), got {self.sort_max_value}")
        if not 1 <= self.count_min_len <= self.count_max_len:
            raise ValueError(f"count_min_len must be in 1..count_max_len, got {self.count_min_len}")
        if self.count_max_len > 17:
            raise ValueError(f"count_max_len must be <= 17 (wrong counts up to +3 stay words), got "
                             f"{self.count_max_len}")
        if not 0.0 <= self.sort_fraction <= 1.0:
            raise ValueError(f"sort_fraction must be in [0, 1], got {self.sort_fraction}")


def sample_task(rng: random.Random, cfg: TaskConfig) -> dict:
    """One task drawn from ``rng`` (a fixed number of draws per branch, so streams stay aligned)."""
    if rng.random() < cfg.sort_fraction:
        n = rng.randint(cfg.sort_min_len, cfg.sort_max_len)
        return {"kind": "sort", "items": [rng.randint(0, cfg.sort_max_value) for _ in range(n)]}
    n = rng.randint(cfg.count_min_len, cfg.count_max_len)
    return {"kind": "count", "items": [rng.choice(ITEMS) for _ in range(n)]}


def check_task(task: dict) -> None:
    """Raise ``ValueError`` naming the problem if ``task`` is not a well-formed task dict."""
    kind = task.get("kind") if isinstance(task, dict) else None
    if kind not in KINDS:
        raise ValueError(f"task kind must be one of {KINDS}, got {kind!r} (task={task!r})")
    items = task.get("items")
    if not isinstance(items, list) or not items:
        raise ValueError(f"task 'items' must be a non-empty list, got {items!r}")


def prompt_text(task: dict) -> str:
    """The user turn's text, e.g. ``"sort these numbers : 5 3 8"``."""
    check_task(task)
    return " ".join([_PROMPT_HEADS[task["kind"]], *(str(x) for x in task["items"])])


def prompt_messages(task: dict) -> list[dict]:
    """The prompt as a conversation (one user message)."""
    return [{"role": "user", "content": prompt_text(task)}]


def task_from_prompt(text: str) -> dict:
    """The task a prompt's text asks (the inverse of :func:`prompt_text`): the last request head in ``text``
    (a chat transcript may hold other turns before it) and the words after it. ``ValueError`` when ``text`` holds no
    request of the toy world, naming the heads it looks for."""
    found = [(text.rfind(head), kind, head) for kind, head in _PROMPT_HEADS.items() if head in text]
    if not found:
        raise ValueError(f"no toy-world request in the prompt {text[-80:]!r}: expected one of "
                         f"{sorted(_PROMPT_HEADS.values())}")
    start, kind, head = max(found)
    words = text[start + len(head):].split()
    items: list = [int(w) for w in words if w.isascii() and w.isdigit()] if kind == "sort" else words
    task = {"kind": kind, "items": items}
    check_task(task)
    return task


def ideal_tokens(task: dict) -> list[str]:
    """The ideal answer as words: the sorted numbers, or the number of items."""
    check_task(task)
    if task["kind"] == "sort":
        return [str(x) for x in sorted(task["items"])]
    return [str(len(task["items"]))]


def ideal_answer(task: dict) -> str:
    """The ideal answer's text (gold utility exactly 1)."""
    return " ".join(ideal_tokens(task))
