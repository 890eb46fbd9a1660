"""Reading a source as records of one kind: the format chosen by ``format=`` or detected from the first row, every
row read, skippable records dropped and counted."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrlhf.data.conversations import SkipRecord
from lrlhf.data.format_errors import DataFormatError
from lrlhf.data.formats.registry import ALL_TIED, Format, Record, _Ctx, _formats_of, supported_formats
from lrlhf.data.records import PreferencePair, Ranking, SFTExample
from lrlhf.data.sources import read_rows
from lrlhf.data.summary import EMPTY_CHOSEN, EMPTY_RESPONSE, IDENTICAL, DataSummary

logger = logging.getLogger("lrlhf.data.formats")


# --- loading -------------------------------------------------------------------------------------------


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
    if isinstance(record, PreferencePair) and record.target > 0.5 and not "".join(
            m["content"] for m in record.chosen).strip():
        return EMPTY_CHOSEN  # preferred: nothing (a blank answer would teach the RM that silence wins)
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
            summary.labelled += isinstance(record, PreferencePair) and record.labelled
    logger.info("%s", summary)
    if verbose:
        print(summary)
    summary.raise_if_empty()
    return records, summary


