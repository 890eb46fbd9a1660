"""Per-subgroup figures and the evaluation table (Markdown and CSV, written atomically)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from lrlhf.utils.io import atomic_write_text


def subgroup_means(values: Sequence[float], groups: Sequence[str]) -> dict[str, float]:
    """Mean of ``values`` per group label (``values[i]`` belongs to ``groups[i]``), keys sorted."""
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values and {len(groups)} group labels; need one label per value")
    if not values:
        raise ValueError("subgroup_means needs at least one value")
    sums: dict[str, list[float]] = {}
    for value, group in zip(values, groups, strict=True):
        sums.setdefault(group, []).append(float(value))
    return {g: sum(v) / len(v) for g, v in sorted(sums.items())}


def worst_subgroup(values: Sequence[float], groups: Sequence[str]) -> tuple[str, float]:
    """``(group, mean)`` of the group with the lowest mean (the first in sorted order on equal means).

    One value per unit (e.g. per prompt, its samples averaged), so each unit weighs the same within its group.
    """
    means = subgroup_means(values, groups)
    name = min(means, key=lambda g: (means[g], g))
    return name, means[name]


def _markdown_cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_markdown_cell(v) for v in value) + "]"
    return str(value).replace("|", "\\|")


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows`` (floats to 3 decimals, None as an empty cell, sequences as
    ``[a, b]``); ``columns`` defaults to the keys of the first row."""
    if not rows:
        raise ValueError("markdown_table needs at least one row")
    columns = list(columns or rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_markdown_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """CSV of ``rows`` (full precision via ``repr`` of floats, None as empty, a ``(lo, hi)`` pair in a column
    ``c`` becomes ``c_lo`` and ``c_hi``); ``columns`` defaults to the keys of the first row."""
    if not rows:
        raise ValueError("csv_table needs at least one row")
    columns = list(columns or rows[0])
    header: list[str] = []
    for c in columns:
        pair = any(isinstance(r.get(c), (tuple, list)) for r in rows)
        header += [f"{c}_lo", f"{c}_hi"] if pair else [c]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for r in rows:
        cells = []
        for c in columns:
            value = r.get(c)
            pair = any(isinstance(other.get(c), (tuple, list)) for other in rows)
            if pair:
                cells += ["", ""] if value is None else [repr(float(v)) for v in value]
            else:
                cells.append("" if value is None else repr(value) if isinstance(value, float) else str(value))
        writer.writerow(cells)
    return buffer.getvalue()


def write_table(rows: Sequence[dict], stem: str | Path, columns: Sequence[str] | None = None,
                csv_columns: Sequence[str] | None = None) -> tuple[Path, Path]:
    """Write ``stem.md`` (:func:`markdown_table` of ``columns``) and ``stem.csv`` (:func:`csv_table` of
    ``csv_columns``, default ``columns``) atomically."""
    stem = Path(stem)
    md = atomic_write_text(stem.with_suffix(".md"), markdown_table(rows, columns))
    return md, atomic_write_text(stem.with_suffix(".csv"), csv_table(rows, csv_columns or columns))
