"""Sources: turn a path or a dataset name into raw rows (plain dicts), each tagged with where it came from.

Local files are read without ``datasets``: ``.json`` (one JSON list, or JSON lines), ``.jsonl``,
``.jsonl.gz`` / ``.json.gz`` and ``.parquet``. Anything else (a hub name, a loading script, a folder) goes
to ``datasets.load_dataset``, imported only then, so the library does not need ``datasets`` for local data.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from lrlhf.data.format_errors import DataFormatError

LOCAL_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz", ".parquet")


class RawRow(NamedTuple):
    """One input record before normalisation.

    ``where`` names it in error messages: ``path:line`` (1-based) for JSON lines, ``path[i]`` (0-based
    index) for a JSON list or a parquet file, ``name[split][i]`` for a ``datasets`` dataset.
    """

    row: dict[str, Any]
    where: str


def read_rows(
    source: str | Path, *, split: str | None = None, data_files: Any = None, **load_kwargs: Any
) -> tuple[list[RawRow], str]:
    """Read every row of ``source``; return the rows and the source's short name (file or dataset name).

    ``split`` and ``data_files`` only apply to ``datasets`` sources (default split ``"train"``); a local
    file is one split by itself.
    """
    path = Path(source)
    if path.is_file() and _has_local_suffix(path):
        return list(_read_local(path)), path.name
    if path.suffix and _has_local_suffix(path) and not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    return list(_read_dataset(str(source), split or "train", data_files, load_kwargs)), str(source)


def _has_local_suffix(path: Path) -> bool:
    return any(path.name.endswith(suffix) for suffix in LOCAL_SUFFIXES)


def _read_local(path: Path) -> Iterator[RawRow]:
    if path.name.endswith(".parquet"):
        yield from _read_parquet(path)
        return
    text = _decode(_read_bytes(path), path)
    # A .json file may hold one list or JSON lines; the first non-blank character tells which.
    if path.name.endswith((".json", ".json.gz")) and text.lstrip().startswith("["):
        yield from _read_json_list(text, path)
    else:
        yield from _read_json_lines(text, path)


def _read_bytes(path: Path) -> bytes:
    if not path.name.endswith(".gz"):
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as e:  # not gzip, truncated, or a bad CRC
        raise DataFormatError(f"{path}: not a readable gzip file ({e})") from e


def _decode(data: bytes, path: Path) -> str:
    """``data`` as UTF-8; a bad byte is named by its line and column (1-based, in characters, as JSON's are)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = data.count(b"\n", 0, e.start) + 1
        column = len(data[line_start:e.start].decode("utf-8")) + 1  # all valid: e.start is the first bad byte
        byte = f"0x{data[e.start]:02x}"
        message = f"{path}:{line}: not valid UTF-8 (byte {byte} at column {column}); save the file as UTF-8"
        raise DataFormatError(message) from e


def _read_json_lines(text: str, path: Path) -> Iterator[RawRow]:
    # "\n" alone ends a line (JSON Lines): splitlines() would also cut at U+2028, U+0085 or a form feed, which
    # may stand raw inside a JSON string. A "\r" before it is whitespace to json.loads.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue  # blank lines (often a trailing one) carry no record
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            message = f"{where}: line {number} is not valid JSON ({e.msg}, column {e.colno})"
            raise DataFormatError(message) from e
        yield RawRow(_expect_object(row, where), where)


def _read_json_list(text: str, path: Path) -> Iterator[RawRow]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        message = f"{path}:{e.lineno}: not valid JSON ({e.msg}, line {e.lineno} column {e.colno})"
        raise DataFormatError(message) from e
    for index, row in enumerate(rows):
        where = f"{path}[{index}]"
        yield RawRow(_expect_object(row, where), where)


def _read_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq  # lazy: only parquet sources need pyarrow

    for index, row in enumerate(pq.read_table(path).to_pylist()):
        yield RawRow(row, f"{path}[{index}]")


def _read_dataset(name: str, split: str, data_files: Any, load_kwargs: dict[str, Any]) -> Iterator[RawRow]:
    try:
        import datasets  # lazy: hub and script sources only
    except ImportError as e:
        raise ImportError(
            f"{name!r} is not a local {'/'.join(LOCAL_SUFFIXES)} file, so it needs the `datasets` package "
            "(pip install datasets)"
        ) from e
    dataset = datasets.load_dataset(name, split=split, data_files=data_files, **load_kwargs)
    for index, row in enumerate(dataset):
        yield RawRow(dict(row), f"{name}[{split}][{index}]")


def _expect_object(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object per record, got {type(row).__name__}")
    return row
