"""Writers for the canonical JSONL formats, atomic and byte-deterministic.

One JSON object per line, keys sorted, ``ensure_ascii=False``, ``\\n`` line ends, so the same records
always give the same bytes (the toy world's byte-identity test relies on it). Canonical shapes:

- :class:`SFTExample` -> ``{"messages": [...], **meta}`` (format ``messages``);
- :class:`PreferencePair` -> ``{"prompt", "chosen", "rejected", **meta}`` plus ``"target"`` when it is
  not 1.0 (format ``pairwise``; a tie is ``"target": 0.5``), or ``"label"`` (its target) when a person gave it;
- :class:`Ranking` -> ``{"prompt", "completions", "ranks", **meta}`` (format ``ranking``);
- :class:`PromptExample` -> ``{"prompt": [...], **meta}`` (format ``prompt``).

``source`` is not written: reading the file back sets it to the file's name.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lrlhf.data.records import PreferencePair, PromptExample, Ranking, SFTExample, UnpairedExample
from lrlhf.utils.io import atomic_write_bytes


def to_json(record: SFTExample | PreferencePair | Ranking | PromptExample) -> dict[str, Any]:
    """The canonical JSON object of one record; ``meta`` keys may not shadow the format's own keys."""
    if isinstance(record, SFTExample):
        body: dict[str, Any] = {"messages": record.messages}
    elif isinstance(record, PreferencePair):
        body = {"prompt": record.prompt, "chosen": record.chosen, "rejected": record.rejected}
        if record.labelled:  # read back as a person's label again
            body["label"] = record.target
        elif record.target != 1.0:
            body["target"] = record.target
    elif isinstance(record, Ranking):
        body = {"prompt": record.prompt, "completions": record.completions, "ranks": record.ranks}
    elif isinstance(record, PromptExample):
        body = {"prompt": record.prompt}
    elif isinstance(record, UnpairedExample):
        body = {"prompt": record.prompt, "completion": record.completion, "label": record.label}
    else:
        raise TypeError(f"cannot write {type(record).__name__}; expected SFTExample, PreferencePair, "
                        "Ranking or PromptExample")
    clash = sorted(body.keys() & record.meta.keys() | {"tie", "target"} & record.meta.keys())
    if isinstance(record, PreferencePair) and "label" in record.meta:  # read back as a person's label
        clash.append("label")
    if clash:
        raise ValueError(f"meta keys {clash} would shadow the record's own fields when read back")
    return {**body, **record.meta}


def dumps_line(record: SFTExample | PreferencePair | Ranking | PromptExample) -> str:
    """One canonical JSONL line (with its ``\\n``)."""
    return json.dumps(to_json(record), sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


Record = SFTExample | PreferencePair | Ranking | PromptExample


def write_jsonl(records: Iterable[Record], path: str | Path) -> Path:
    """Write ``records`` to ``path`` (``.jsonl``, or ``.jsonl.gz`` gzip with mtime 0) atomically.

    The bytes go to a temporary file in the same folder, are fsynced, then ``os.replace`` puts them in
    place, so a reader never sees half a file and a crash leaves the old file intact.
    """
    path = Path(path)
    data = "".join(dumps_line(record) for record in records).encode("utf-8")
    if path.name.endswith(".gz"):
        buffer = io.BytesIO()
        # mtime=0 and no file name in the header keep the compressed bytes deterministic.
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as gz:
            gz.write(data)
        data = buffer.getvalue()
    return atomic_write_bytes(path, data)
