"""Normalised records: the one shape every input format is turned into.

Every reader in :mod:`lrlhf.data` produces these, and everything downstream (tokenisation, datamodules, the
toy world's writers and evaluation) consumes them, so a format is supported once, in one place.

A *message* is a plain ``{"role": str, "content": str}`` dict (roles ``system``, ``user``, ``assistant``),
which is what ``tokenizer.apply_chat_template`` takes. A *conversation* is a list of messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

ROLES = ("system", "user", "assistant", "tool")  # tool: a tool's answer to an assistant's call


class Message(TypedDict):
    role: str
    content: str


Conversation = list[Message]


@dataclass
class SFTExample:
    """A conversation to imitate. Assistant turns are the targets (all of them or the last, by config)."""

    messages: Conversation
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


#: what a person's (or an annotator's) ``label`` on a pair means, everywhere lrlhf reads one: P(``chosen`` as
#: written wins): 1 (``a``) chosen is better, 0 (``b``) rejected is, 0.5 (``tie``) neither; null (None): no label,
#: the pair is not a training pair (the labelling page's skip and both-bad, a pair nobody labelled)
LABEL_VALUES = {1.0: 1.0, 0.0: 0.0, 0.5: 0.5, "a": 1.0, "b": 0.0, "tie": 0.5}


def label_value(value: Any) -> float | None:
    """1.0 / 0.0 / 0.5 from a label (a number or ``a`` / ``b`` / ``tie``), None for null; else ``ValueError``."""
    if value is None:
        return None
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, bool) or not isinstance(key, (int, float, str)) or key not in LABEL_VALUES:
        raise ValueError(f"label {value!r} must be 1 (a / chosen preferred), 0 (b / rejected preferred), 0.5 (a "
                         "tie) or null (no label), or 'a', 'b', 'tie'")
    return LABEL_VALUES[key]


#: the kinds every consumer of preferences reads (``formats.load_records``): pairs or, failing that, rankings
#: (:func:`as_pairs` turns either into pairs)
PREFERENCE_KINDS = ("preference", "ranking")


@dataclass
class PreferencePair:
    """Two continuations of one prompt, with the probability that ``chosen`` is preferred.

    ``prompt`` ends with the turn the continuations answer (normally a user turn); ``chosen`` and
    ``rejected`` hold the continuation messages (normally a single assistant message).
    ``target`` = P(chosen > rejected): 1.0 for a hard label, 0.5 for an explicit tie. ``labelled``: the
    orientation and target are a person's ``label`` (written back as ``label``, so a file made of these pairs
    says so again when read).
    """

    prompt: Conversation
    chosen: Conversation
    rejected: Conversation
    target: float = 1.0
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    labelled: bool = False


@dataclass
class Ranking:
    """K continuations of one prompt with their ranks: 1 is best, equal ranks are ties."""

    prompt: Conversation
    completions: list[Conversation]
    ranks: list[int]
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class UnpairedExample:
    """One answer to a prompt labelled desirable or not (KTO data): ``label`` True = desirable. Read as kind
    ``kto``, for an unpaired loss; never SFT data (its undesirable answers are not to be imitated)."""

    prompt: Conversation
    completion: Conversation
    label: bool
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptExample:
    """A prompt for RL rollouts or evaluation (``meta`` carries task data, e.g. for the toy world's utility)."""

    prompt: Conversation
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def ranking_pairs(ranking: Ranking, which: str = "all") -> list[PreferencePair]:
    """The pairs a ranking implies, better completion first (``target`` 1.0): ``"all"`` of them with distinct ranks
    (in completion order), or only ``"extremes"``: one best against one worst (none when every rank ties). Each
    pair's meta is the ranking's with ``ranking_pair`` = the two completions' positions."""
    if which not in ("all", "extremes"):
        raise ValueError(f"which must be 'all' or 'extremes', got {which!r}")
    order = range(len(ranking.completions))
    if which == "extremes":
        best = min(order, key=lambda i: ranking.ranks[i])
        worst = max(order, key=lambda i: ranking.ranks[i])
        index_pairs = [(best, worst)] if ranking.ranks[best] < ranking.ranks[worst] else []
    else:
        index_pairs = [(i, j) if ranking.ranks[i] < ranking.ranks[j] else (j, i)
                       for i in order for j in order if i < j and ranking.ranks[i] != ranking.ranks[j]]
    return [PreferencePair(ranking.prompt, ranking.completions[i], ranking.completions[j], 1.0, ranking.source,
                           {**ranking.meta, "ranking_pair": [i, j]}) for i, j in index_pairs]


def as_pairs(records, which: str = "all") -> list[PreferencePair]:
    """Preference records as pairs: a ``PreferencePair`` as it is, a ``Ranking`` as :func:`ranking_pairs`."""
    out: list[PreferencePair] = []
    for record in records:
        out.extend(ranking_pairs(record, which) if isinstance(record, Ranking) else [record])
    return out
