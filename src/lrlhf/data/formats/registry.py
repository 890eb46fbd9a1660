"""The registry of input formats: one :class:`Format` per reader, per record kind (``FORMATS[kind]``, in
detection order), and the context a reader gets (:class:`_Ctx`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lrlhf.data.format_errors import DataFormatError
from lrlhf.data.records import PreferencePair, PromptExample, Ranking, SFTExample

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


def _formats_of(kind: str) -> dict[str, Format]:
    if kind not in FORMATS:
        raise ValueError(f"unknown record kind {kind!r}; allowed: {', '.join(KINDS)}")
    return FORMATS[kind]


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


