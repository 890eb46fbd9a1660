"""Annotators: who labels a pair of responses to one prompt (the labelling step of iterative RLHF,
:mod:`lrlhf.run.rounds`).

An annotator is any object with ``label(pairs, round_index) -> list[float]``: for each :class:`Pair` (a prompt record
and two responses ``a`` and ``b``), ``1.0`` when ``a`` is preferred, ``0.0`` when ``b`` is, ``0.5`` for a tie. The
config chooses one by ``_target_`` (``rounds.annotator``):

- :class:`SimulatedAnnotators`: the toy world's label model (:mod:`lrlhf.data.toy.annotators`: logistic noise, a tie
  band, a length bias) on a gold score: the toy world's gold utility of the prompt's task (the same annotators that
  labelled its preference files), or any judge (``gold``: the sentiment world's, ``world.judge``).
- :class:`JudgeAnnotator`: a pointwise judge of :func:`~lrlhf.eval.judges.resolve_judge` (``toy_gold``,
  ``rm:<folder>``, ``<module>:<callable>``) prefers the higher score, a tie within ``tie_margin``.
- :class:`PairwiseAnnotator`: any ``judge(prompt_record, a, b)`` returning 1 / 0 / 0.5 (or ``"a"`` / ``"b"`` /
  ``"tie"``).
- :class:`FileExchange`: people. The run writes the pairs to label as JSONL in the preference format and waits for
  the labelled file (docs/iterative.md).
"""

from __future__ import annotations

import importlib
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from lrlhf.data.records import PromptExample, label_value
from lrlhf.data.toy.annotators import AnnotatorConfig, sample_label
from lrlhf.data.toy.utility import gold_utility, response_tokens
from lrlhf.utils.io import atomic_write_text


class Pair(NamedTuple):
    """Two responses ``a`` and ``b`` to one prompt."""

    prompt: PromptExample
    a: str
    b: str


def as_label(value: Any, where: str) -> float:
    """1.0 / 0.0 / 0.5 from a label (:func:`lrlhf.data.records.label_value`: a number or ``a`` / ``b`` /
    ``tie``); anything else (null too: an annotator must label) names ``where``."""
    try:
        label = label_value(value)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    if label is None:
        raise ValueError(f"{where}: label None must be 1 (a / chosen preferred), 0 (b / rejected preferred) or 0.5 "
                         "(a tie), or 'a', 'b', 'tie'")
    return label


class SimulatedAnnotators:
    """Simulated annotators (:mod:`lrlhf.data.toy.annotators`: logistic noise ``temperature``, a length bias per
    ``length_scale`` words, a tie band; the toy world's defaults 0.18, 0.3 per 10 words, 0.05) on a gold score:
    ``gold`` (a judge of :func:`~lrlhf.eval.judges.resolve_judge`, e.g. ``lrlhf.data.sentiment:sentiment_gold``), or
    without it the toy world's gold utility of ``prompt.meta["task"]``; seeded per round."""

    built_when_planning = True  # cheap: planning builds it to check the config before any work

    def __init__(self, seed: int = 0, gold: str | Callable | None = None, **config: float):
        from lrlhf.eval.judges import resolve_judge

        self.seed = seed
        self.gold = None if gold is None else resolve_judge(gold, key="rounds.annotator.gold")
        self.config = AnnotatorConfig(**config)

    def golds(self, pairs: Sequence[Pair]) -> tuple[list[float], list[float]]:
        """The gold score of each pair's ``a`` and ``b``."""
        if self.gold is not None:
            from lrlhf.eval.judges import score_responses

            prompts = [p.prompt for p in pairs]
            return (score_responses(self.gold, prompts, [p.a for p in pairs]),
                    score_responses(self.gold, prompts, [p.b for p in pairs]))
        for i, pair in enumerate(pairs):
            if pair.prompt.meta.get("task") is None:
                raise ValueError(f"rounds.annotator: SimulatedAnnotators without a gold label by the toy world's gold "
                                 f"utility, but prompt {i} has no task (a world without gold): give "
                                 "rounds.annotator.gold or choose another annotator")
        return ([gold_utility(p.prompt.meta["task"], p.a) for p in pairs],
                [gold_utility(p.prompt.meta["task"], p.b) for p in pairs])

    def label(self, pairs: Sequence[Pair], round_index: int) -> list[float]:
        rng = random.Random(f"lrlhf-annotators:{self.seed}:{round_index}")
        golds_a, golds_b = self.golds(pairs)
        return [sample_label(rng, ga, gb, len(response_tokens(p.a)), len(response_tokens(p.b)), self.config)
                for p, ga, gb in zip(pairs, golds_a, golds_b, strict=True)]


class JudgeAnnotator:
    """A pointwise judge as annotator: ``a`` when its score is higher by more than ``tie_margin``, a tie within it."""

    def __init__(self, judge: str | Callable = "toy_gold", tie_margin: float = 0.0):
        from lrlhf.eval.judges import resolve_judge

        if tie_margin < 0:
            raise ValueError(f"rounds.annotator.tie_margin must be >= 0, got {tie_margin}")
        self.judge = resolve_judge(judge, key="rounds.annotator.judge")
        self.tie_margin = tie_margin

    def label(self, pairs: Sequence[Pair], round_index: int) -> list[float]:
        from lrlhf.eval.judges import score_responses

        prompts = [p.prompt for p in pairs]
        u_a = score_responses(self.judge, prompts, [p.a for p in pairs])
        u_b = score_responses(self.judge, prompts, [p.b for p in pairs])
        return [1.0 if x - y > self.tie_margin else 0.0 if y - x > self.tie_margin else 0.5
                for x, y in zip(u_a, u_b, strict=True)]


class PairwiseAnnotator:
    """``judge(prompt_record, a, b)`` (``judge``: ``<module>:<callable>`` or the callable) returns each label."""

    built_when_planning = True  # cheap: planning builds it to check the config before any work

    def __init__(self, judge: str | Callable):
        if isinstance(judge, str):
            module, _, attribute = judge.partition(":")
            try:
                judge = getattr(importlib.import_module(module), attribute)
            except (ImportError, AttributeError, ValueError) as err:
                raise ValueError(f"rounds.annotator.judge={judge!r}: {err}") from err
        if not callable(judge):
            raise ValueError(f"rounds.annotator.judge must be a callable (prompt_record, a, b) -> label, got {judge!r}")
        self.judge = judge

    def label(self, pairs: Sequence[Pair], round_index: int) -> list[float]:
        return [as_label(self.judge(p.prompt, p.a, p.b), f"rounds.annotator.judge, pair {i}")
                for i, p in enumerate(pairs)]


def preference_record(pair: Pair, label: float, **extra: Any) -> dict:
    """The pair as a record of the preference format: ``chosen`` the preferred response (``a`` for a tie, with
    ``target`` 0.5), the prompt record's own fields (e.g. the toy world's ``task``) kept."""
    chosen, rejected = (pair.b, pair.a) if label == 0.0 else (pair.a, pair.b)
    return {"prompt": pair.prompt.prompt, "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}], "target": 0.5 if label == 0.5 else 1.0,
            **pair.prompt.meta, **extra}


class FileExchange:
    """People label through files. Round ``r`` writes ``<folder>/round_<r>.to_label.jsonl``: one pair per line in the
    preference format, ``chosen`` = a and ``rejected`` = b as drawn, with an ``id`` and ``"label": null``. A labeller
    writes ``<folder>/round_<r>.labelled.jsonl``: the same lines (any order), each ``label`` set to 1 (``chosen``
    as written is better), 0 (``rejected`` is) or 0.5 (a tie); lines may also be dropped (unlabelled pairs are
    left out). The run polls every ``poll_seconds`` for at most ``timeout_seconds`` (0: only look once), then
    stops with a message naming the file; ``ckpt_path=last`` resumes at this round once it is there.

    ``folder``: ``rounds/annotator=file_exchange`` sets ``<run folder>/labelling``.
    """

    built_when_planning = True  # cheap: planning builds it to check the config before any work

    def __init__(self, folder: str, timeout_seconds: float = 0.0, poll_seconds: float = 10.0):
        self.folder = Path(folder)
        self.timeout_seconds, self.poll_seconds = timeout_seconds, poll_seconds

    def files(self, round_index: int) -> tuple[Path, Path]:
        return (self.folder / f"round_{round_index}.to_label.jsonl",
                self.folder / f"round_{round_index}.labelled.jsonl")

    def write_pairs(self, pairs: Sequence[Pair], round_index: int) -> tuple[Path, Path]:
        """Write round ``round_index``'s to-label file (once: a resumed round keeps it); its and the labelled file's
        paths."""
        out, back = self.files(round_index)
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            lines = [json.dumps({"id": i, **preference_record(p, 1.0), "label": None}, ensure_ascii=False)
                     for i, p in enumerate(pairs)]
            atomic_write_text(out, "".join(line + "\n" for line in lines))
        return out, back

    def label(self, pairs: Sequence[Pair], round_index: int) -> list[float | None]:
        """Labels by pair; None for a pair the labelled file leaves out."""
        out, back = self.write_pairs(pairs, round_index)
        deadline = time.monotonic() + self.timeout_seconds
        while not back.is_file():
            if time.monotonic() >= deadline:
                raise FileNotFoundError(
                    f"rounds.annotator: waiting for labels: label the {len(pairs)} pairs of {out} and write them to "
                    f"{back} (each line's `label`: 1, 0 or 0.5), then resume with ckpt_path=last")
            time.sleep(self.poll_seconds)
        return read_labels(back, pairs)


def read_labels(path: Path, pairs: Sequence[Pair]) -> list[float | None]:
    """The labels of a labelled file by ``id`` (None where a pair has none). A bad line names its file and line: one
    whose ``chosen`` / ``rejected`` are not pair ``id``'s responses as written (edited, or another draw's) too."""
    n_pairs = len(pairs)
    labels: list[float | None] = [None] * n_pairs
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON: {err}") from err
        pair_id = row.get("id") if isinstance(row, dict) else None
        if not isinstance(pair_id, int) or not 0 <= pair_id < n_pairs:
            raise ValueError(f"{where}: `id` must be the id of one of the {n_pairs} pairs written, got {pair_id!r}")
        written = (_text(row.get("chosen")), _text(row.get("rejected")))
        if written != (pairs[pair_id].a, pairs[pair_id].b):
            raise ValueError(f"{where}: pair {pair_id}'s `chosen` and `rejected` are not the responses written to "
                             "label (keep them as written and set `label`)")
        if row.get("label") is None:
            continue
        if labels[pair_id] is not None:
            raise ValueError(f"{where}: pair {pair_id} is labelled twice")
        labels[pair_id] = as_label(row["label"], where)
    return labels


def _text(turns) -> str | None:
    """The content of a one-message conversation (``[{"role": "assistant", "content": ...}]``), else None."""
    if isinstance(turns, list) and len(turns) == 1 and isinstance(turns[0], dict):
        return turns[0].get("content")
    return None


__all__ = ["FileExchange", "JudgeAnnotator", "Pair", "PairwiseAnnotator", "SimulatedAnnotators", "as_label",
           "preference_record", "read_labels"]
