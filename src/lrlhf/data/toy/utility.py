r"""The gold utility g(prompt, response) in [0, 1]: what the toy world's "humans" really want.

Definition. The response is cut at the first end-of-turn token ``<|end|>`` (if any) and split on whitespace
into ``tokens`` (the tokenizer's own pre-tokenisation). ``numbers`` are the tokens that are decimal numbers,
in order. With the ideal answer's tokens ``ideal`` (see :func:`~.tasks.ideal_tokens`):

.. math::

    g = \text{correctness} \times \text{brevity}

- **sort** (``S`` = sorted items, ``n = |S|``, ``A`` = numbers, ``m = \max(|A|, n)``)::

      correctness = (#{i : A[i] = S[i]} + LCS(A, S)) / (2 m)     (0 if A is empty)

  half exact positions, half longest common subsequence (credit for a right order with a slip); dividing
  by ``max(|A|, n)`` charges both missing and extra (repeated) numbers.
- **count** (``k`` = number of items, ``a`` = the first number in the response)::

      correctness = max(0, 1 - |a - k| / 3)                       (0 if there is no number)

  so off by one gives 2/3, off by two 1/3, off by three or more 0.
- **brevity** (``L* = |ideal|``, ``excess = max(0, |tokens| - L*)``, slack ``s`` = :data:`BREVITY_SLACK`)::

      brevity = (L* + s) / (L* + s + excess)

  every word beyond what is needed (filler, repetition, a restated list) costs, smoothly: a one-word
  count answer with 4 filler words keeps 5/9, a 6-number sort with 4 filler words 10/14.

Degenerate outputs score low: an empty or number-free answer 0; repetition through the denominators and
``brevity``; filler through ``brevity``. The ideal answer scores exactly 1 and nothing scores more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .tasks import check_task, ideal_tokens, task_from_prompt
from .vocab import EOS

BREVITY_SLACK = 4
"""Words of slack in the brevity factor's scale (larger = gentler on long answers)."""
COUNT_TOLERANCE = 3
"""A count answer off by this much or more gets no credit."""


def task_of(task_or_record: Any) -> dict:
    """The task dict from a task, a JSONL record (``{"task": ...}``), a record with ``meta["task"]``
    (e.g. :class:`~lrlhf.data.records.PromptExample`) or a dict with ``"meta"``."""
    if isinstance(task_or_record, dict):
        if "kind" in task_or_record:
            return task_or_record
        if "task" in task_or_record:
            return task_or_record["task"]
        if "meta" in task_or_record and "task" in task_or_record["meta"]:
            return task_or_record["meta"]["task"]
    meta = getattr(task_or_record, "meta", None)
    if isinstance(meta, dict) and "task" in meta:
        return meta["task"]
    raise ValueError(f"cannot find a toy-world task in {type(task_or_record).__name__}: expected a task "
                     "dict, a record with a 'task' key, or an object whose meta holds 'task'")


def response_tokens(response_text: str) -> list[str]:
    """Whitespace tokens of the response up to (not including) the first end-of-turn token."""
    return response_text.split(EOS, 1)[0].split()


def numbers_in(tokens: Iterable[str]) -> list[int]:
    """The tokens that are non-negative decimal numbers, as ints, in order."""
    return [int(t) for t in tokens if t.isascii() and t.isdigit()]


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (O(|a| |b|) dynamic programme)."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def sort_correctness(numbers: Sequence[int], items: Sequence[int]) -> float:
    """(exact positions + LCS) / (2 max(|numbers|, |items|)) against the sorted items; 0 if no numbers."""
    if not numbers:
        return 0.0
    target = sorted(items)
    positions = sum(a == s for a, s in zip(numbers, target, strict=False))
    return (positions + lcs_length(numbers, target)) / (2 * max(len(numbers), len(target)))


def count_correctness(numbers: Sequence[int], items: Sequence[Any]) -> float:
    """max(0, 1 - |first number - len(items)| / COUNT_TOLERANCE); 0 if no numbers."""
    if not numbers:
        return 0.0
    return max(0.0, 1.0 - abs(numbers[0] - len(items)) / COUNT_TOLERANCE)


def brevity(n_tokens: int, n_ideal: int) -> float:
    """(n_ideal + s) / (n_ideal + s + max(0, n_tokens - n_ideal)) with s = BREVITY_SLACK."""
    scale = n_ideal + BREVITY_SLACK
    return scale / (scale + max(0, n_tokens - n_ideal))


def gold_utility(task_or_prompt_record: Any, response_text: str) -> float:
    """The gold utility in [0, 1] of ``response_text`` for a task or prompt record (see the module doc)."""
    task = task_of(task_or_prompt_record)
    check_task(task)
    tokens = response_tokens(response_text)
    numbers = numbers_in(tokens)
    if task["kind"] == "sort":
        correctness = sort_correctness(numbers, task["items"])
    else:
        correctness = count_correctness(numbers, task["items"])
    return correctness * brevity(len(tokens), len(ideal_tokens(task)))


def gold_utilities(tasks_or_records: Sequence[Any], responses: Sequence[str]) -> list[float]:
    """:func:`gold_utility` for each (task, response) pair; the two sequences must have equal length."""
    if len(tasks_or_records) != len(responses):
        raise ValueError(f"got {len(tasks_or_records)} tasks but {len(responses)} responses")
    return [gold_utility(t, r) for t, r in zip(tasks_or_records, responses, strict=True)]


def verifiable_reward(prompt_text: str, response_text: str) -> float:
    """The gold utility of ``response_text`` for the request in ``prompt_text`` (read by
    :func:`~.tasks.task_from_prompt`): the toy world's verifier, a reward computed by a program from the texts
    alone (``reward=gold``)."""
    return gold_utility(task_from_prompt(prompt_text), response_text)
