"""The summary of counts every data step reports: read, kept, dropped by reason, truncated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lrlhf.data.format_errors import EmptyDatasetError

# Drop reasons used by this package; other steps add their own (e.g. tokenisation's "too_long").
IDENTICAL = "identical_chosen_rejected"
NO_SHARED_PREFIX = "no_shared_prefix"
EMPTY_RESPONSE = "empty_response"
EMPTY_CHOSEN = "empty_chosen"  # a pair whose preferred answer is blank
DUPLICATE_PROMPT = "duplicate_prompt"
DUPLICATE_PAIR = "duplicate_pair"
CONTRADICTORY_PAIR = "contradictory_pair"
UNLABELLED = "unlabelled"  # a pair whose ``label`` is null: nobody labelled it (or skipped it, or found both bad)


@dataclass
class DataSummary:
    """Counts for one source: ``kept = read - sum(dropped.values())``.

    ``dropped`` maps a reason to a count, in the order reasons first occurred. ``truncated`` counts
    examples that were kept but shortened; the tokenisation step increments it (left-truncated prompts).
    """

    source: str
    kind: str
    format: str = ""
    read: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    truncated: int = 0
    removed_answers: int = 0  # ranking answers too long to fit, removed from a group that was kept
    labelled: int = 0  # kept pairs whose orientation a person's ``label`` gave (``lrlhf label``, a file exchange)

    @property
    def kept(self) -> int:
        return self.read - sum(self.dropped.values())

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` records removed for ``reason``."""
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def raise_if_empty(self) -> None:
        """Raise :class:`EmptyDatasetError` naming each filter's count when no record is left."""
        if self.kept > 0:
            return
        if self.read == 0:
            raise EmptyDatasetError(f"{self.source}: no records read (kind {self.kind!r})")
        removed = ", ".join(f"{reason}: {n}" for reason, n in self.dropped.items())
        raise EmptyDatasetError(
            f"{self.source}: all {self.read} records were removed by filters ({removed}); nothing is left"
        )

    def as_dict(self) -> dict[str, Any]:
        """A flat dict for loggers: ``read``, ``kept``, ``truncated``, ``dropped/<reason>`` and the labels."""
        out: dict[str, Any] = {"source": self.source, "kind": self.kind, "format": self.format}
        out.update(read=self.read, kept=self.kept, truncated=self.truncated)
        if self.removed_answers:
            out["removed_answers"] = self.removed_answers
        if self.labelled:
            out["labelled"] = self.labelled
        out.update({f"dropped/{reason}": n for reason, n in self.dropped.items()})
        return out

    def __str__(self) -> str:
        rows = [("read", self.read)]
        rows += [(f"  dropped: {reason}", n) for reason, n in self.dropped.items()]
        rows += [("kept", self.kept), ("truncated", self.truncated)]
        if self.labelled or UNLABELLED in self.dropped:
            rows += [("kept pairs labelled by people", self.labelled)]
        if self.removed_answers:
            rows += [("ranking answers removed (too long)", self.removed_answers)]
        width = max(len(label) for label, _ in rows)
        title = f"data summary: {self.source} ({self.kind}, format {self.format or '?'})"
        lines = [title] + [f"  {label:<{width}}  {n:>9,}" for label, n in rows]
        return "\n".join(lines)
