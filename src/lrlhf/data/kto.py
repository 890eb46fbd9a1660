"""Unpaired preference data for KTO (``recipe=kto_lora``): each answer labelled desirable or not.

A KTO file (kind ``kto``: ``{prompt, completion, label}`` or ``{messages, label}``) is read as it is. Preference
pairs and rankings are read too, as TRL turns paired data into unpaired data: a pair's preferred answer is
desirable and the other undesirable (a tie says neither: left out), a ranking's best answer desirable and its worst
undesirable (:func:`lrlhf.data.records.ranking_pairs` ``"extremes"``).

KTO's reference point is a KL estimate on *mismatched* (prompt, answer) pairs. Each example is encoded with its
own answer and with the answer of the next example of its split (the last wraps to the first), the prompt cut alike
for both (:func:`lrlhf.data.tokenize.encode_chat`). A batch is the pair layout of :func:`collate_pairs`: rows
``[0, B)`` the examples, rows ``[B, 2B)`` their mismatched sequences, ``pair_targets`` 1.0 for a desirable answer
and 0.0 for an undesirable one.
"""

from __future__ import annotations

from dataclasses import dataclass

from lrlhf.data.collate import collate_pairs
from lrlhf.data.datamodules import ChatDataModule
from lrlhf.data.records import PREFERENCE_KINDS, Conversation, UnpairedExample, as_pairs
from lrlhf.data.tokenize import EncodedPair, encode_chat

TIE = 0.5


@dataclass
class MismatchedExample:
    """An unpaired example and the answer of another example of its split (for KTO's KL estimate)."""

    example: UnpairedExample
    other: Conversation


def unpaired(records) -> list[UnpairedExample]:
    """KTO records as they are; pairs and rankings as one desirable and one undesirable answer each (ties none)."""
    out: list[UnpairedExample] = []
    for record in records:
        if isinstance(record, UnpairedExample):
            out.append(record)
            continue
        for pair in as_pairs([record], "extremes"):
            if pair.target == TIE:
                continue
            better, worse = (pair.chosen, pair.rejected) if pair.target > TIE else (pair.rejected, pair.chosen)
            out += [UnpairedExample(pair.prompt, better, True, pair.source, dict(pair.meta)),
                    UnpairedExample(pair.prompt, worse, False, pair.source, dict(pair.meta))]
    return out


class KTODataModule(ChatDataModule):
    """KTO batches (module docstring): each example with its answer and with the next example's answer."""

    record_kind = ("kto", *PREFERENCE_KINDS)

    def _records(self, split: str):
        records, summary = super()._records(split)
        examples = unpaired(records)
        return [MismatchedExample(e, examples[(i + 1) % len(examples)].completion)
                for i, e in enumerate(examples)], summary

    def encode(self, record: MismatchedExample, stats):
        example = record.example
        out = encode_chat(self.tokenizer, example.prompt, [example.completion, record.other], stats=stats,
                          **self._encode_kwargs())
        return None if out is None else EncodedPair(out[0], out[1], 1.0 if example.label else 0.0,
                                                    example.source, dict(example.meta))

    def collate(self, items):
        return collate_pairs(items, self.pad_token_id)


__all__ = ["KTODataModule", "MismatchedExample", "unpaired"]
