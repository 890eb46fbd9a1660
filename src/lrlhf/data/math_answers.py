"""Final answers of math problems, checked by HF's math-verify, not by hand-written parsing.

math-verify is an optional dependency (``pip install 'math-verify[antlr4_9_3]'``: its ``antlr4_9_3`` extra matches the
ANTLR runtime hydra-core pins). Its ``parse`` finds an answer in a text (``$72$``, ``\\boxed{72}``, ``72.0``,
``1,080``, the last number of a sentence) and ``verify(gold, answer)`` compares the two as math (``0.5`` equals
``\\frac{1}{2}``).

- :func:`reference_answer`: the reference in a record's answer field. GSM8K's field is a worked solution whose last
  line is ``#### <answer>``: the text after ``####``; any other text is the answer itself (e.g. ``\\frac{1}{2}``).
- :func:`answer_matches`: whether a response's final answer equals a reference.
- :func:`math_answer_judge`: a pointwise judge ``(prompt record, response) -> 1.0 | 0.0`` for ``eval.judge`` and early
  stopping (``world=gsm8k``'s judge): its mean over held-out responses is the exact-answer rate.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import lru_cache

INSTALL = "pip install 'math-verify[antlr4_9_3]'"


def require_math_verify():
    """The ``math_verify`` module; an ImportError naming the install command when it is missing."""
    try:
        import math_verify
    except ImportError as err:
        raise ImportError(f"the math-answer check needs HF's math-verify, which is not installed: {INSTALL} (the "
                          "antlr4_9_3 extra matches the ANTLR runtime hydra-core pins)") from err
    return math_verify


def reference_answer(text: str) -> str:
    """The reference answer in ``text``: after ``####`` when its last line starts so (GSM8K), else all of it."""
    lines = str(text).strip().splitlines()
    last = lines[-1].strip() if lines else ""
    return last[4:].strip() if last.startswith("####") else str(text).strip()


def _in_main_thread() -> bool:
    """math-verify bounds each parse and comparison with ``signal.alarm``, which works in the main thread only; in
    another thread it gives up and returns "no answer" (read as wrong, silently), so the bound is off there."""
    return threading.current_thread() is threading.main_thread()


def _parse(text: str):
    math_verify = require_math_verify()
    return math_verify.parse(text) if _in_main_thread() else math_verify.parse(text, parsing_timeout=None)


@lru_cache(maxsize=65536)
def _parsed_reference(reference: str):
    gold = _parse(reference)
    if not gold:
        raise ValueError(f"the reference answer {reference!r} holds no number or expression math-verify can read")
    return gold


def answer_matches(response: str, reference: str) -> bool:
    """Whether the final answer of ``response`` (math-verify's ``parse``) equals ``reference`` (``verify``); a
    response without an answer does not match. A reference math-verify cannot read raises ValueError."""
    math_verify = require_math_verify()
    gold, answer = _parsed_reference(reference), _parse(response)
    if not answer:
        return False
    if _in_main_thread():
        return bool(math_verify.verify(gold, answer))
    return bool(math_verify.verify(gold, answer, timeout_seconds=None))


def record_field(meta: Mapping | None, key: str, where: str) -> str:
    """The text of a prompt record's reference field ``meta[key]``; a ValueError naming ``where`` (the reward or judge
    and the sample), the key and the fields the record has, when it is missing or empty."""
    if meta is None:
        raise ValueError(f"{where}: no prompt records were given, and the reference answer is the record's {key!r} "
                         "field; score with the records' meta")
    if key not in meta or meta[key] is None or not str(meta[key]).strip():
        raise ValueError(f"{where}: the prompt record has no reference answer {key!r} (its fields: "
                         f"{sorted(meta) or 'none'}); give every prompt an {key!r} field, or set the key that holds it")
    return str(meta[key])


def record_reference(meta: Mapping | None, key: str, where: str) -> str:
    """The reference answer (:func:`reference_answer`) of the record's field ``key`` (:func:`record_field`)."""
    return reference_answer(record_field(meta, key, where))


def math_answer_judge(key: str = "answer"):
    """A pointwise judge (:mod:`lrlhf.eval.judges`): 1.0 when a response's final answer equals its prompt record's
    reference (``record.meta[key]``), else 0.0. A factory (``eval.judge=lrlhf.data.math_answers:math_answer_judge``):
    a missing math-verify fails when the judge is resolved, before any sampling."""
    require_math_verify()

    def judge(record, response: str) -> float:
        where = f"the math-answer judge on the response {response[:80]!r} to {_prompt_text(record)!r}"
        return float(answer_matches(response, record_reference(getattr(record, "meta", None), key, where)))

    judge.__name__ = "math_answer"
    judge.exact = True  # a verifier: no held-out accuracy to report (lrlhf.eval.judges.judge_accuracy)
    return judge


math_answer_judge.factory = True


def _prompt_text(record) -> str:
    prompt = getattr(record, "prompt", record)
    if isinstance(prompt, list) and prompt:
        prompt = prompt[-1].get("content", "") if isinstance(prompt[-1], dict) else prompt[-1]
    return str(prompt)[-80:]


__all__ = ["INSTALL", "answer_matches", "math_answer_judge", "record_field", "record_reference", "reference_answer",
           "require_math_verify"]
