"""Input formats -> normalised records (:mod:`lrlhf.data.records`), with a summary of counts.

One format is one small reader function, registered for one record kind with the fields it needs.
:func:`load_records` reads a source, picks the format from the first record's keys (or ``format=``),
runs the reader on every row and returns the records and a :class:`~lrlhf.data.summary.DataSummary`.

Kinds and formats (``FORMATS[kind]`` lists them in detection order):

- ``sft``: ``messages`` ``{"messages": [{role, content}]}``; ``sharegpt`` ``{"conversations":
  [{from, value}], "system"?}`` (from: human/user, gpt/assistant, system); ``alpaca`` ``{instruction,
  input?, output, system?, history?}`` (user turn = instruction, then a newline and the input when it is
  not blank, as LLaMA-Factory joins them); ``self_instruct`` ``{instruction, instances: [{input, output}]}``
  (the *first* instance only, joined like alpaca, so one instruction never yields several prompts that a
  prompt split could separate); ``prompt_completion`` ``{prompt, completion}`` (strings or message lists).
- ``preference``: ``sharegpt_pairwise`` ``{conversations, chosen: {from, value}, rejected: {...}}``;
  ``hh_rlhf`` ``{chosen: transcript, rejected: transcript}`` with ``\\n\\nHuman:`` / ``\\n\\nAssistant:``
  markers; ``pairwise`` ``{prompt?, chosen, rejected, tie?, target?}``. ``target`` is P(chosen wins) in
  [0, 1]; ``"tie": true`` means 0.5.
- ``ranking``: ``{prompt, completions: [...], ranks: [int, ...]}``, lower is better (0- or 1-based: only the
  order counts), equal ranks are ties.
- ``prompt``: ``{"prompt": str | messages}``, or any SFT format, whose prompt is everything before the
  last assistant turn.

Rules every reader follows:

- A string prompt becomes one user message, a string completion one assistant message.
- Top-level keys a format does not use are kept in the record's ``meta`` (the toy world keeps task data
  there); ``source`` is the file or dataset name.
- A prompt must end with a user turn; a continuation must start with an assistant turn; ``system`` may
  only come first. Consecutive turns of one role are accepted (real data has them, e.g. 4 HH-RLHF prompts);
  a chat template that insists on alternation will say so at tokenisation.
- **Shared-prefix rule** (``hh_rlhf``, and ``pairwise`` given full conversations and no prompt): each side
  is cut before its *last* assistant turn; when both cut-off prefixes are equal, that prefix is the prompt
  and the rest of each side (the last assistant turn) is the continuation. Otherwise the pair has no
  shared prompt and is dropped, counted as ``no_shared_prefix``: its two sides answer different
  conversations, so its label is not a preference between two answers to one prompt. (HH-RLHF
  harmless-base test: 2,307 of 2,312 pairs share a prefix, 5 are dropped.) HH turns are stripped of
  surrounding whitespace.
- Skippable records are dropped and counted: identical chosen and rejected (``drop_identical``), an SFT
  example whose last assistant turn is blank (nothing to imitate), a ranking whose candidates all share one
  rank (``all_ranks_tied``: it orders nothing; a ranking with one strict preference is kept whole, its equal
  ranks are ties). A source with nothing left is an error. An empty *preference* continuation is
  kept: an empty answer can rightly win or lose (HH-RLHF has four such chosen answers).
- Anything else that does not fit raises :class:`~lrlhf.data.errors.DataFormatError` naming the record,
  the field, and the formats (or roles, or range) accepted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lrlhf.data.conversations import (
    SkipRecord,
    check_continuation,
    check_prompt,
    check_system_first,
    conversation,
    hh_transcript,
    last_assistant,
    sharegpt_conversation,
    split_shared_prompt,
    strip_prompt,
    with_system,
)
from lrlhf.data.errors import DataFormatError
from lrlhf.data.records import PREFERENCE_KINDS, Conversation, PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.sources import read_rows
from lrlhf.data.summary import EMPTY_RESPONSE, IDENTICAL, DataSummary
from lrlhf.data.writers import write_jsonl

__all__ = ["FORMATS", "KINDS", "PREFERENCE_KINDS", "DataFormatError", "Format", "load_records", "read_record",
           "write_jsonl"]

logger = logging.getLogger(__name__)

Record = SFTExample | PreferencePair | Ranking | PromptExample
KINDS = ("sft", "preference", "ranking", "prompt", "kto")
ALL_TIED = "all_ranks_tied"  # a ranking whose candidates all share one rank: it orders nothing


@dataclass(frozen=True)
class Format:
    """A registered reader: ``read(row, ctx)`` turns one raw row into one record of ``kind``.

    ``required`` keys make the format detectable; ``optional`` keys are read too (not copied to ``meta``).
    ``detect`` refines detection when keys alone are ambiguous.
    """

    name: str
    kind: str
    read: Callable[[dict[str, Any], _Ctx], Record]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    detect: Callable[[dict[str, Any]], bool] | None = None

    def matches(self, row: dict[str, Any]) -> bool:
        if not all(key in row for key in self.required):
            return False
        return self.detect is None or self.detect(row)

    def describe(self) -> str:
        optional = f"; optional {', '.join(self.optional)}" if self.optional else ""
        return f"{self.name} ({', '.join(self.required)}{optional})"


FORMATS: dict[str, dict[str, Format]] = {kind: {} for kind in KINDS}


def _register(kind: str, name: str, required: tuple[str, ...], optional: tuple[str, ...] = (), detect=None):
    def add(read):
        FORMATS[kind][name] = Format(name, kind, read, required, optional, detect)
        return read

    return add


def supported_formats(kind: str) -> str:
    """One line listing the formats of ``kind`` with their fields, for error messages."""
    return "; ".join(fmt.describe() for fmt in _formats_of(kind).values())


@dataclass(frozen=True)
class _Ctx:
    """Where a row came from and which format reads it: everything an error message needs."""

    where: str
    fmt: Format
    source: str

    def error(self, message: str) -> DataFormatError:
        return DataFormatError(
            f"{self.where}: {message}. Format {self.fmt.describe()}; "
            f"supported {self.fmt.kind} formats: {supported_formats(self.fmt.kind)}"
        )

    def get(self, row: dict[str, Any], key: str, types: type | tuple[type, ...], what: str, *,
            optional: bool = False):
        """``row[key]`` checked against ``types``; ``None`` counts as absent (parquet fills missing cells)."""
        value = row.get(key)
        if value is None:
            if optional:
                return None
            raise self.error(f"field {key!r} is missing")
        if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
            raise self.error(f"field {key!r} must be {what}, got {type(value).__name__}")
        return value

    def meta(self, row: dict[str, Any]) -> dict[str, Any]:
        used = set(self.fmt.required) | set(self.fmt.optional)
        return {key: value for key, value in row.items() if key not in used}


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


# --- SFT -----------------------------------------------------------------------------------------------


def _sft(messages: Conversation, row: dict[str, Any], ctx: _Ctx, field: str) -> SFTExample:
    if not messages or messages[-1]["role"] != "assistant":
        raise ctx.error(f"role sequence invalid: {field} must end with an assistant turn (the target)")
    check_system_first(messages, ctx, field)
    return SFTExample(messages=messages, source=ctx.source, meta=ctx.meta(row))


@_register("sft", "messages", ("messages",))
def read_messages(row, ctx):
    if isinstance(row.get("label"), bool):  # KTO: as SFT its undesirable answers would be imitated
        raise ctx.error("this is a KTO record (a boolean 'label' marks its answer desirable or not): read it as "
                        "kind 'kto'; as SFT data its undesirable answers would become targets")
    raw = ctx.get(row, "messages", list, "a list of messages")
    messages = conversation(raw, ctx, "messages", "user")
    weights = [m.get("loss_weight") if isinstance(m, dict) else None for m in raw]
    if all(w is None for w in weights):
        return _sft(messages, row, ctx, "messages")
    # LLaMA-Factory v1: loss_weight marks the supervised turns; kept per message in meta["loss_weights"], which the
    # encoder honours as the target mask (lrlhf.data.tokenize.encode_sft); turns after the last supervised one go
    if not all(w is None or isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in weights):
        raise ctx.error(f"loss_weight values {weights}: each must be a number >= 0 (0 = not a target)")
    supervised = [i for i, (m, w) in enumerate(zip(messages, weights, strict=True))
                  if m["role"] == "assistant" and w]
    if not supervised:
        raise ctx.error("no assistant turn has loss_weight > 0: nothing to imitate")
    example = _sft(messages[:supervised[-1] + 1], row, ctx, "messages")
    example.meta["loss_weights"] = [float(w or 0) for w in weights[:supervised[-1] + 1]]
    return example


@_register("sft", "sharegpt", ("conversations",), ("system",))
def read_sharegpt(row, ctx):
    turns = sharegpt_conversation(ctx.get(row, "conversations", list, "a list of turns"), ctx,
                                   "conversations")
    system = ctx.get(row, "system", str, "a string", optional=True)
    return _sft(with_system(system, turns), row, ctx, "conversations")


def _alpaca_user_turn(instruction: str, input_text: str | None) -> str:
    return f"{instruction}\n{input_text}" if input_text and input_text.strip() else instruction


@_register("sft", "alpaca", ("instruction", "output"), ("input", "system", "history"))
def read_alpaca(row, ctx):
    instruction = ctx.get(row, "instruction", str, "a string")
    input_text = ctx.get(row, "input", str, "a string", optional=True)
    output = ctx.get(row, "output", str, "a string")
    system = ctx.get(row, "system", str, "a string", optional=True)
    history = ctx.get(row, "history", list, "a list of [instruction, response] pairs", optional=True) or []
    messages = []
    for i, turn in enumerate(history):
        if not (isinstance(turn, list) and len(turn) == 2 and all(isinstance(t, str) for t in turn)):
            raise ctx.error(f"history[{i}] must be an [instruction, response] pair of strings")
        messages += [{"role": "user", "content": turn[0]}, {"role": "assistant", "content": turn[1]}]
    messages += [{"role": "user", "content": _alpaca_user_turn(instruction, input_text)},
                 {"role": "assistant", "content": output}]
    return _sft(with_system(system, messages), row, ctx, "output")


@_register("sft", "self_instruct", ("instruction", "instances"))
def read_self_instruct(row, ctx):
    instruction = ctx.get(row, "instruction", str, "a string")
    instances = ctx.get(row, "instances", list, "a non-empty list of {input, output}")
    first = instances[0] if instances else None
    if not (isinstance(first, dict) and isinstance(first.get("output"), str)
            and isinstance(first.get("input", ""), str)):
        raise ctx.error("field 'instances' must be a non-empty list of {input, output} with string values")
    messages = [{"role": "user", "content": _alpaca_user_turn(instruction, first.get("input"))},
                {"role": "assistant", "content": first["output"]}]
    return _sft(messages, row, ctx, "instances")


@_register("sft", "prompt_completion", ("prompt", "completion"))
def read_prompt_completion(row, ctx):
    prompt = conversation(ctx.get(row, "prompt", (str, list), "a string or messages"), ctx, "prompt", "user")
    completion = conversation(ctx.get(row, "completion", (str, list), "a string or messages"), ctx,
                               "completion", "assistant")
    check_prompt(prompt, ctx, "prompt")
    check_continuation(completion, ctx, "completion")
    return _sft(prompt + completion, row, ctx, "completion")


# --- preferences ---------------------------------------------------------------------------------------


#: a pair's optional label fields: an explicit tie, P(chosen wins), or the two answers' scores (UltraFeedback)
LABEL_KEYS = ("tie", "target", "score_chosen", "score_rejected")


def _target(row: dict[str, Any], ctx: _Ctx) -> float:
    tie = ctx.get(row, "tie", bool, "true or false", optional=True)
    target = ctx.get(row, "target", (int, float), "a number in [0, 1]", optional=True)
    scores = [ctx.get(row, key, (int, float), "a number", optional=True) for key in ("score_chosen", "score_rejected")]
    if None not in scores:  # equal scores are a tie, not "chosen wins"; a lower-scored chosen is a labelling error
        if scores[0] < scores[1]:
            raise ctx.error(f"field 'score_chosen' ({scores[0]}) is below 'score_rejected' ({scores[1]}): the "
                            "chosen answer scored worse; swap the two or drop the scores")
        if scores[0] == scores[1] and target is None and tie is None:
            tie = True
    if target is not None and not (math.isfinite(target) and 0.0 <= target <= 1.0):
        raise ctx.error(f"field 'target' is {target!r}; allowed: a number in [0, 1] (P(chosen wins))")
    if tie and target is not None and target != 0.5:
        raise ctx.error(f"fields 'tie' (true) and 'target' ({target}) disagree; a tie is target 0.5")
    if tie:
        return 0.5
    return 1.0 if target is None else float(target)


def _pair(prompt, chosen, rejected, row, ctx) -> PreferencePair:
    check_prompt(prompt, ctx, "prompt")
    check_continuation(chosen, ctx, "chosen")
    check_continuation(rejected, ctx, "rejected")
    return PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, target=_target(row, ctx),
                          source=ctx.source, meta=ctx.meta(row))


@_register("preference", "sharegpt_pairwise", ("conversations", "chosen", "rejected"),
           ("system", *LABEL_KEYS))
def read_sharegpt_pairwise(row, ctx):
    prompt = sharegpt_conversation(ctx.get(row, "conversations", list, "a list of turns"), ctx,
                                    "conversations")
    system = ctx.get(row, "system", str, "a string", optional=True)
    chosen = sharegpt_conversation(ctx.get(row, "chosen", (dict, list), "a {from, value} turn"), ctx,
                                    "chosen")
    rejected = sharegpt_conversation(ctx.get(row, "rejected", (dict, list), "a {from, value} turn"), ctx,
                                      "rejected")
    return _pair(with_system(system, prompt), chosen, rejected, row, ctx)


@_register("preference", "hh_rlhf", ("chosen", "rejected"), LABEL_KEYS,
           detect=lambda row: "prompt" not in row and isinstance(row["chosen"], str))
def read_hh_rlhf(row, ctx):
    chosen = hh_transcript(ctx.get(row, "chosen", str, "a transcript string"), ctx, "chosen")
    rejected = hh_transcript(ctx.get(row, "rejected", str, "a transcript string"), ctx, "rejected")
    return _pair(*split_shared_prompt(chosen, rejected, ctx), row, ctx)


@_register("preference", "pairwise", ("chosen", "rejected"), ("prompt", *LABEL_KEYS))
def read_pairwise(row, ctx):
    raw_chosen = ctx.get(row, "chosen", (str, list), "a string or messages")
    raw_rejected = ctx.get(row, "rejected", (str, list), "a string or messages")
    chosen = conversation(raw_chosen, ctx, "chosen", "assistant")
    rejected = conversation(raw_rejected, ctx, "rejected", "assistant")
    raw_prompt = ctx.get(row, "prompt", (str, list), "a string or messages", optional=True)
    if raw_prompt is None:
        if isinstance(raw_chosen, str) or isinstance(raw_rejected, str):
            raise ctx.error("field 'prompt' is missing; it may be left out only when chosen and rejected are "
                            "full conversations (message lists) that share the prompt")
        return _pair(*split_shared_prompt(chosen, rejected, ctx), row, ctx)
    prompt = conversation(raw_prompt, ctx, "prompt", "user")
    return _pair(prompt, strip_prompt(prompt, chosen), strip_prompt(prompt, rejected), row, ctx)


# --- rankings ------------------------------------------------------------------------------------------


@_register("ranking", "ranking", ("prompt", "completions", "ranks"))
def read_ranking(row, ctx):
    prompt = conversation(ctx.get(row, "prompt", (str, list), "a string or messages"), ctx, "prompt", "user")
    check_prompt(prompt, ctx, "prompt")
    raw = ctx.get(row, "completions", list, "a list of strings or message lists")
    ranks = ctx.get(row, "ranks", list, "a list of integers >= 1 (1 = best)")
    if len(raw) < 2 or len(ranks) != len(raw):
        raise ctx.error(f"'completions' ({len(raw)}) and 'ranks' ({len(ranks)}) need one length, at least 2")
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise ctx.error(f"field 'ranks' is {ranks!r}; allowed: integers >= 0, lower = better (0- or 1-based), "
                        "equal = tie")
    completions = []
    for i, completion in enumerate(raw):
        completion = strip_prompt(prompt, conversation(completion, ctx, f"completions[{i}]", "assistant"))
        check_continuation(completion, ctx, f"completions[{i}]")
        completions.append(completion)
    return Ranking(prompt=prompt, completions=completions, ranks=list(ranks), source=ctx.source,
                   meta=ctx.meta(row))


# --- RL prompts ----------------------------------------------------------------------------------------


@_register("prompt", "prompt", ("prompt",),
           detect=lambda row: not {"completion", "chosen", "rejected", "completions"} & row.keys())
def read_prompt(row, ctx):
    prompt = conversation(ctx.get(row, "prompt", (str, list), "a string or messages"), ctx, "prompt", "user")
    check_prompt(prompt, ctx, "prompt")
    return PromptExample(prompt=prompt, source=ctx.source, meta=ctx.meta(row))


def _prompt_from_sft(sft_format: Format):
    def read(row, ctx):
        example = sft_format.read(row, _Ctx(ctx.where, sft_format, ctx.source))
        prompt = example.messages[: last_assistant(example.messages)]
        check_prompt(prompt, ctx, "the turns before the last assistant turn")
        return PromptExample(prompt=prompt, source=example.source, meta=example.meta)

    return read


for _sft_format in list(FORMATS["sft"].values()):
    _register("prompt", _sft_format.name, _sft_format.required, _sft_format.optional, _sft_format.detect)(
        _prompt_from_sft(_sft_format))


# --- loading -------------------------------------------------------------------------------------------


def _formats_of(kind: str) -> dict[str, Format]:
    if kind not in FORMATS:
        raise ValueError(f"unknown record kind {kind!r}; allowed: {', '.join(KINDS)}")
    return FORMATS[kind]


def choose_format(kind: str, format: str, first_row: dict[str, Any] | None, where: str) -> Format:
    """``format`` itself, or (for ``"auto"``) the first format of ``kind`` whose fields ``first_row`` has."""
    formats = _formats_of(kind)
    if format != "auto":
        if format not in formats:
            raise DataFormatError(f"unknown {kind} format {format!r}; supported: auto, {', '.join(formats)}")
        return formats[format]
    for fmt in formats.values():
        if first_row is not None and fmt.matches(first_row):
            return fmt
    keys = sorted(first_row) if first_row is not None else []
    raise DataFormatError(f"{where}: cannot detect the {kind} format from the first record's keys {keys}; "
                          f"supported {kind} formats: {supported_formats(kind)}. Pass format= to choose one.")


def _choose_kind(kinds: tuple[str, ...], format: str, first_row: dict[str, Any], where: str) -> tuple[str, Format]:
    """The first of ``kinds`` that can read ``first_row`` (auto) or that has ``format``, with that format."""
    if len(kinds) == 1:
        return kinds[0], choose_format(kinds[0], format, first_row, where)
    for kind in kinds:
        formats = _formats_of(kind)
        if format != "auto" and format in formats:
            return kind, formats[format]
        if format == "auto":
            for fmt in formats.values():
                if fmt.matches(first_row):
                    return kind, fmt
    if format != "auto":
        known = ", ".join(f"{k}: {', '.join(_formats_of(k))}" for k in kinds)
        raise DataFormatError(f"unknown format {format!r} for {' or '.join(kinds)} records; supported: auto; {known}")
    supported = " | ".join(f"{k}: {supported_formats(k)}" for k in kinds)
    raise DataFormatError(f"{where}: cannot detect the {' or '.join(kinds)} format from the first record's keys "
                          f"{sorted(first_row)}; supported formats: {supported}. Pass format= to choose one.")


def read_record(row: dict[str, Any], kind: str, format: str = "auto", *, where: str = "record",
                source: str = "") -> Record:
    """Normalise one row (no filtering, no counting); raises ``SkipRecord`` for a no-shared-prefix pair."""
    fmt = choose_format(kind, format, row, where)
    return fmt.read(row, _Ctx(where, fmt, source))


def _filter_reason(record: Record, drop_identical: bool) -> str | None:
    if isinstance(record, PreferencePair) and drop_identical and record.chosen == record.rejected:
        return IDENTICAL
    if isinstance(record, SFTExample) and not record.messages[-1]["content"].strip():
        return EMPTY_RESPONSE
    if isinstance(record, Ranking) and len(set(record.ranks)) == 1:
        return ALL_TIED
    return None


def load_records(
    source: str | Path,
    kind: str | Sequence[str],
    *,
    format: str = "auto",
    split: str | None = None,
    data_files: Any = None,
    drop_identical: bool = True,
    verbose: bool = True,
    **load_kwargs: Any,
) -> tuple[list[Record], DataSummary]:
    """Read ``source`` as records of ``kind`` (``sft``, ``preference``, ``ranking``, ``prompt``).

    ``kind`` may be a sequence of kinds (e.g. ``("preference", "ranking")``): the first kind with a format
    matching the first record (or, for an explicit ``format``, the first kind that has it) reads the source.

    ``source`` is a local ``.json`` / ``.jsonl`` / ``.jsonl.gz`` / ``.parquet`` file, or anything
    ``datasets.load_dataset`` takes (then ``split`` (default ``"train"``), ``data_files`` and
    ``load_kwargs`` go to it). ``format="auto"`` detects the format from the first record's keys.
    Skippable records are dropped and counted (module docstring); the summary is logged, printed when
    ``verbose``, and returned. Raises ``DataFormatError`` on bad input and ``EmptyDatasetError`` when no
    record is left.
    """
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if not kinds:
        raise ValueError("load_records: kind is empty")
    for each in kinds:
        _formats_of(each)
    rows, name = read_rows(source, split=split, data_files=data_files, **load_kwargs)
    if not rows:
        DataSummary(source=name, kind="/".join(kinds), format=format).raise_if_empty()
    kind, fmt = _choose_kind(kinds, format, rows[0].row, rows[0].where)
    summary = DataSummary(source=name, kind=kind, format=fmt.name)
    records: list[Record] = []
    for raw in rows:
        summary.read += 1
        try:
            record = fmt.read(raw.row, _Ctx(raw.where, fmt, name))
        except SkipRecord as skip:
            summary.drop(skip.reason)
            continue
        reason = _filter_reason(record, drop_identical)
        if reason:
            summary.drop(reason)
        else:
            records.append(record)
    logger.info("%s", summary)
    if verbose:
        print(summary)
    summary.raise_if_empty()
    return records, summary


# the formats of lrlhf.data.formats_more register themselves on import (they use the registry above)
from lrlhf.data import formats_more  # noqa: E402,F401
