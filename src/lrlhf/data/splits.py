"""Splits by prompt group, and prompt-level and pair-level dedup.

A record's prompt is its ``prompt`` (pairs, rankings, RL prompts) or, for an SFT example, the turns
before its last assistant turn. Prompts are compared by :func:`normalise_prompt`: role-tagged turns,
lower-cased, whitespace collapsed, so that "Sort 3 1 2" and "sort  3 1 2 " are one prompt and can neither
sit in two splits nor survive dedup as two prompts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

from lrlhf.data.records import Conversation, PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.summary import CONTRADICTORY_PAIR, DUPLICATE_PAIR, DUPLICATE_PROMPT, DataSummary

R = TypeVar("R", SFTExample, PreferencePair, Ranking, PromptExample)


def prompt_of(record: SFTExample | PreferencePair | Ranking | PromptExample) -> Conversation:
    """The prompt a record answers: ``record.prompt``, or an SFT example's turns before its last assistant."""
    if isinstance(record, SFTExample):
        last = max((i for i, m in enumerate(record.messages) if m["role"] == "assistant"), default=0)
        return record.messages[:last]
    return record.prompt


def normalise_prompt(prompt: Conversation) -> str:
    """``"role: text"`` per turn, one per line, text lower-cased with runs of whitespace made one space."""
    return "\n".join(f"{m['role']}: {' '.join(m['content'].lower().split())}" for m in prompt)


def _unit_hash(text: str, seed: int) -> float:
    """A number in [0, 1) fixed by (seed, text): the first 8 bytes of a SHA-256, over 2**64."""
    digest = hashlib.sha256(f"{seed}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


#: a record's conversation tree or other group, read from its ``meta`` (a ``group`` field in the data, or
#: OpenAssistant's ``message_tree_id``): all the records of one group land in one split
GROUP_KEYS = ("group", "message_tree_id")


def group_of(record) -> str | None:
    """A record's group (:data:`GROUP_KEYS` in its meta), or None."""
    meta = getattr(record, "meta", None) or {}
    return next((f"{key}={meta[key]}" for key in GROUP_KEYS if meta.get(key) is not None), None)


def split_keys(records: Sequence) -> list[str]:
    """What decides each record's split: the records joined by a shared group or a shared normalised prompt
    (the turns of one conversation tree repeat each other: a later turn's prompt holds an earlier answer) form
    one component, named by its smallest group, else its smallest prompt."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    nodes = []
    for record in records:
        prompt, group = "p" + normalise_prompt(prompt_of(record)), group_of(record)
        nodes.append(prompt)
        find(prompt)
        if group is not None:  # "g" sorts before "p": a component with a group is named by one
            a, b = find(prompt), find("g" + group)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [find(node)[1:] for node in nodes]


def split_by_prompt(
    records: Sequence[R], fractions: Mapping[str, float], seed: int = 0
) -> dict[str, list[R]]:
    """Assign each record to a split by a seeded hash of its :func:`split_keys` (its group, else its prompt).

    ``fractions`` maps split names to shares that sum to 1; a key's hash ``u`` in [0, 1) picks the first split
    whose cumulative share exceeds ``u``, in the mapping's order. Records sharing a group or a prompt always
    land together; without groups the result depends only on (seed, prompt) -- not on record order or on the
    other records -- and each split keeps the input order. Shares are expected, not exact, counts.
    """
    names, bounds = _cumulative(fractions)
    splits: dict[str, list[R]] = {name: [] for name in fractions}
    for record, key in zip(records, split_keys(records), strict=True):
        u = _unit_hash(key, seed)
        # The fallback covers u just below 1.0 when the float sum of shares rounds under it.
        name = next((n for n, bound in zip(names, bounds, strict=True) if u < bound), names[-1])
        splits[name].append(record)
    return splits


def _cumulative(fractions: Mapping[str, float]) -> tuple[list[str], list[float]]:
    bad = {k: v for k, v in fractions.items() if not (isinstance(v, int | float) and 0 <= v < math.inf)}
    total = sum(fractions.values()) if not bad else math.nan
    if not fractions or bad or abs(total - 1.0) > 1e-9:
        raise ValueError(f"fractions must be shares >= 0 summing to 1, got {dict(fractions)}")
    names = [name for name, share in fractions.items() if share > 0]
    bounds = [sum(fractions[n] for n in names[: i + 1]) for i in range(len(names))]
    return names, bounds


def dedup_prompts(records: Sequence[R], summary: DataSummary | None = None) -> list[R]:
    """Keep the first record of each normalised prompt; count the rest as ``duplicate_prompt``."""
    seen: set[str] = set()
    kept = []
    for record in records:
        key = normalise_prompt(prompt_of(record))
        if key not in seen:
            seen.add(key)
            kept.append(record)
    _count(summary, DUPLICATE_PROMPT, len(records) - len(kept))
    return kept


def dedup_pairs(pairs: Sequence[PreferencePair], summary: DataSummary | None = None) -> list[PreferencePair]:
    """Remove duplicate pairs, reversed duplicates included; drop contradictions.

    Two pairs are the same comparison when their normalised prompts are equal and their two continuations
    are equal as a set (continuations compared exactly: case can be what a label is about). Within one
    comparison each pair's label is read as P(first-seen continuation wins): ``target`` or ``1 - target``
    when reversed. If all labels agree, the **first pair in input order is kept, in its own orientation**,
    and the others count as ``duplicate_pair``. If they disagree -- (p, a, b) and (p, b, a) both with
    target 1, or any two different labels -- the data contradicts itself, so **every** pair of that
    comparison is dropped and counted as ``contradictory_pair``.
    """
    groups: dict[tuple, list[int]] = {}
    orientation: list[tuple[str, str]] = []
    for i, pair in enumerate(pairs):
        a, b = _text(pair.chosen), _text(pair.rejected)
        orientation.append((a, b))
        groups.setdefault((normalise_prompt(pair.prompt), frozenset((a, b))), []).append(i)
    keep: list[int] = []
    duplicates = contradictions = 0
    for members in groups.values():
        first = orientation[members[0]]
        labels = {pairs[i].target if orientation[i] == first else 1.0 - pairs[i].target for i in members}
        if len(labels) == 1:
            keep.append(members[0])
            duplicates += len(members) - 1
        else:
            contradictions += len(members)
    _count(summary, DUPLICATE_PAIR, duplicates)
    _count(summary, CONTRADICTORY_PAIR, contradictions)
    return [pairs[i] for i in sorted(keep)]


def _text(continuation: Conversation) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in continuation)


def _count(summary: DataSummary | None, reason: str, n: int) -> None:
    if summary is not None and n:
        summary.drop(reason, n)
        summary.raise_if_empty()
