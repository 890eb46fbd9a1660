"""Rule rewards (``reward=rules``): small programs, each with a name, that check a response's text.

A rule's :meth:`Rule.check` gives 1.0 (holds) or 0.0 (violated) for one ``(prompt, response)`` pair; a rule that
reads the prompt record's fields (a reference answer) writes :meth:`Rule.check_record` instead, given the record's
``meta`` too. A :class:`RuleReward` scores a response by the weighted mean of its rules, and each rule's pass is a
component of the reward (logged per rollout as ``reward/<rule name>``, its pass rate). A rule marked ``gate`` scores
nothing itself: when it is violated the reward is ``floor`` whatever the rest (an unparseable answer gets no partial
credit).

Shipped: :class:`JsonParses` (optionally with required keys), :class:`Regex` (must / must not match),
:class:`Forbidden` (strings that must not appear), :class:`LengthWords` (a range of words), :class:`ToolCall` (a
JSON tool call with the right name), :class:`MathAnswer` (the final answer equals the record's reference, by HF's
math-verify). Any object with ``name``, ``gate`` and ``check(prompt, response)`` is a rule (a :class:`Rule` may write
``check_record`` instead).
Mixed with a reward model, a rule's scale must be calibrated first (:class:`lrlhf.rewards.mixture.Mixture`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lrlhf.data.math_answers import answer_matches, record_reference, require_math_verify
from lrlhf.rewards.protocol import Meta, TextReward


class Rule:
    """One check of a response's text; see the module docstring."""

    name: str
    gate: bool = False

    def check(self, prompt: str, response: str) -> float:
        """1.0 when the rule holds for ``response`` (to ``prompt``), else 0.0."""
        raise NotImplementedError

    def check_record(self, prompt: str, response: str, meta: Mapping | None) -> float:
        """:meth:`check` given the prompt record's ``meta`` too (None: not at hand); here the texts alone. A rule
        that reads the record's fields overrides this."""
        return self.check(prompt, response)


def _json(text: str):
    """The JSON value of ``text`` (a fenced ```json block's content counts), or None when it does not parse."""
    fenced = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", text, flags=re.S)
    try:
        return json.loads(fenced.group(1) if fenced else text)
    except (json.JSONDecodeError, ValueError):
        return None


@dataclass
class JsonParses(Rule):
    """The response is a JSON value (an object with every key of ``required_keys`` when given)."""

    required_keys: Sequence[str] = ()
    name: str = "json"
    gate: bool = False

    def check(self, prompt: str, response: str) -> float:
        value = _json(response)
        if value is None:
            return 0.0
        keys = self.required_keys
        return float(not keys or (isinstance(value, dict) and all(k in value for k in keys)))


@dataclass
class Regex(Rule):
    """``pattern`` (Python ``re``, searched anywhere) must match (``must=True``) or must not."""

    pattern: str
    must: bool = True
    name: str = "regex"
    gate: bool = False

    def __post_init__(self):
        try:
            self._compiled = re.compile(self.pattern)
        except re.error as error:
            raise ValueError(f"reward rule {self.name!r}: pattern {self.pattern!r} is not a regular expression: "
                             f"{error}") from None

    def check(self, prompt: str, response: str) -> float:
        return float(bool(self._compiled.search(response)) == self.must)


@dataclass
class Forbidden(Rule):
    """None of ``strings`` appears in the response (case-insensitive unless ``case_sensitive``)."""

    strings: Sequence[str]
    case_sensitive: bool = False
    name: str = "forbidden"
    gate: bool = False

    def check(self, prompt: str, response: str) -> float:
        text = response if self.case_sensitive else response.lower()
        return float(not any((s if self.case_sensitive else s.lower()) in text for s in self.strings))


@dataclass
class LengthWords(Rule):
    """The response has between ``min_words`` and ``max_words`` whitespace-separated words (None: no bound)."""

    min_words: int | None = None
    max_words: int | None = None
    name: str = "length"
    gate: bool = False

    def __post_init__(self):
        if self.min_words is None and self.max_words is None:
            raise ValueError(f"reward rule {self.name!r}: set min_words, max_words or both")

    def check(self, prompt: str, response: str) -> float:
        words = len(response.split())
        return float((self.min_words is None or words >= self.min_words)
                     and (self.max_words is None or words <= self.max_words))


@dataclass
class ToolCall(Rule):
    """The response is a JSON tool call ``{"name": tool, "arguments": {...}}`` with ``name == tool`` (a list of
    calls passes when one of them does)."""

    tool: str
    name: str = "tool_call"
    gate: bool = False

    def check(self, prompt: str, response: str) -> float:
        value = _json(response)
        calls = value if isinstance(value, list) else [value]
        return float(any(isinstance(c, dict) and c.get("name") == self.tool and isinstance(c.get("arguments", {}),
                                                                                           dict) for c in calls))


@dataclass
class MathAnswer(Rule):
    """The response's final answer equals the prompt record's reference answer ``meta[key]`` (GSM8K's ``answer``
    field: the text after its last line's ``####``; any other field: all of it), as HF's math-verify parses and
    compares them (:mod:`lrlhf.data.math_answers`: ``$72$``, ``\\boxed{72}`` and ``72.0`` match ``#### 72``; a
    response without a number does not). A record without the key raises, naming the rule, the key and the sample.
    Needs ``pip install 'math-verify[antlr4_9_3]'`` (checked when the rule is built)."""

    key: str = "answer"
    name: str = "math_answer"
    gate: bool = False

    def __post_init__(self):
        try:
            require_math_verify()
        except ImportError as err:
            raise ImportError(f"reward rule {self.name!r}: {err}") from err

    def check(self, prompt: str, response: str) -> float:
        return self.check_record(prompt, response, None)

    def check_record(self, prompt: str, response: str, meta: Mapping | None) -> float:
        where = f"reward rule {self.name!r} (key {self.key!r}) on the response {response[:80]!r} to {prompt[-80:]!r}"
        reference = record_reference(meta, self.key, where)
        try:
            return float(answer_matches(response, reference))
        except ValueError as err:  # a reference math-verify cannot read: the data's fault, named with its sample
            raise ValueError(f"{where}: {err}") from err


def _check(rule, prompt: str, response: str, meta: Mapping | None) -> float:
    """A rule's check with the prompt record (:meth:`Rule.check_record`), or the texts alone for a rule object that
    has only ``check`` (not a :class:`Rule`)."""
    if hasattr(rule, "check_record"):
        return float(rule.check_record(prompt, response, meta))
    return float(rule.check(prompt, response))


@dataclass
class RuleReward(TextReward):
    """The weighted mean of the non-gate rules' checks (1.0 when every rule is a gate); ``floor`` when a gate is
    violated. Components: each rule's check, by its name (names must differ).

    Args:
        rules: the rules (``reward.rules`` in a config: a list of ``_target_`` nodes).
        weights: one per rule (gates' are unused); None = equal.
        floor: the reward of a response that violates a gate.
    """

    rules: Sequence[Rule] = ()
    weights: Sequence[float] | None = None
    floor: float = 0.0
    name: str = "rules"
    tokenizer: object = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.rules = list(self.rules)
        for i, rule in enumerate(self.rules):  # checked when planning, before any stage is built
            if not callable(getattr(rule, "check", None)) and not callable(getattr(rule, "check_record", None)) \
                    or not isinstance(getattr(rule, "name", None), str):
                hint = (" (a reward: put it in module.reward_model itself, or as a part of reward=mixture)"
                        if callable(getattr(rule, "score", None)) else "")
                raise TypeError(f"module.reward_model.rules[{i}] is a {type(rule).__name__}, not a rule{hint}: a rule "
                                "has `name`, `gate` and check(prompt, response) -> 1.0 or 0.0 "
                                "(lrlhf.rewards.rules.Rule)")
        names = [r.name for r in self.rules]
        if not self.rules:
            raise ValueError("module.reward_model.rules must hold at least one rule")
        if len(set(names)) != len(names):
            raise ValueError(f"module.reward_model.rules: two rules share a name ({names}); give each its own name")
        if self.weights is not None and (len(self.weights) != len(self.rules) or any(w < 0 for w in self.weights)):
            raise ValueError(f"module.reward_model.weights must be {len(self.rules)} numbers >= 0, got "
                             f"{list(self.weights)}")

    def score_texts(self, prompts, responses):
        return self.score_records(prompts, responses, None)

    def score_records(self, prompts, responses, meta: Meta):
        weights = list(self.weights) if self.weights is not None else [1.0] * len(self.rules)
        records = [None] * len(responses) if meta is None else meta
        checks = {r.name: [_check(r, p, t, m) for p, t, m in zip(prompts, responses, records, strict=True)]
                  for r in self.rules}
        scored = [(r, w) for r, w in zip(self.rules, weights, strict=True) if not r.gate]
        total = sum(w for _, w in scored)
        scores = []
        for i in range(len(responses)):
            if any(checks[r.name][i] < 1.0 for r in self.rules if r.gate):
                scores.append(float(self.floor))
            else:
                scores.append(sum(w * checks[r.name][i] for r, w in scored) / total if total > 0 else 1.0)
        return scores, checks


__all__ = ["Forbidden", "JsonParses", "LengthWords", "MathAnswer", "Regex", "Rule", "RuleReward", "ToolCall"]
