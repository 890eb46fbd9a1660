"""The labels people give on the labelling page (``lrlhf label``), kept so that nothing is lost.

A :class:`LabelStore` holds the pairs of one to-label file (the preference format: ``prompt``, ``chosen``,
``rejected``; the iterative loop's ``round_<r>.to_label.jsonl`` is one), optional check items with a known answer
(``chosen`` is the better one), and one append-only log per annotator, ``<stem>.labels/<annotator>.jsonl``: each
decision and each undo is one line, flushed and fsynced before the page moves on, so a SIGKILL at any moment loses
at most the decision in flight (a torn last line is dropped and cut off when the log is opened again). The state is
the replay of the logs; a decision is taken only for the item the annotator is on, so a resubmitted form or a retry
after a restart never records a pair twice.

Each annotator sees every item once, in the file's order with the checks mixed in at seeded places, the two answers
of each in a seeded order (left / right, recorded with the decision). A decision is ``chosen`` / ``rejected`` (as
written in the file), ``tie``, ``both_bad`` or ``skip``. When ``budget`` pairs (all by default) have a decision, the
labelled file (``<stem>.labelled.jsonl``, the file :class:`lrlhf.eval.annotators.FileExchange` reads) is written
atomically: every pair's record with its ``id``, its ``label`` (1: ``chosen`` better, 0: ``rejected``, 0.5: a tie,
null: no label; several annotators: the mean of their labels, rounded to 1 / 0 / 0.5) and its ``annotations``; it is
written again after each later decision while the budget holds.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from lrlhf.utils.io import atomic_write_text

CHOICES = ("chosen", "rejected", "tie", "both_bad", "skip")
LABEL_OF = {"chosen": 1.0, "rejected": 0.0, "tie": 0.5, "both_bad": None, "skip": None}
NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")


class StaleAction(Exception):
    """A decision or undo for an item the annotator is not on (a resubmitted or outdated page): nothing is written."""


@dataclass(frozen=True)
class Item:
    """One pair to compare: ``key`` (the pair's ``id`` as text, or ``check-<i>``), the conversation before the
    answers as ``(role, text)`` turns, and the two answers as written (``chosen``, ``rejected``)."""

    key: str
    turns: tuple[tuple[str, str], ...]
    chosen: str
    rejected: str
    record: dict
    check: bool = False


def _text(messages: list[dict]) -> str:
    """One answer's text: its content, or each message's with its role when it is several turns."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n\n".join(f"**{m['role']}:** {m['content']}" for m in messages)


def read_items(path: Path, check: bool = False) -> list[Item]:
    """The pairs of a local preference file in any format lrlhf reads (its own ``prompt`` / ``chosen`` /
    ``rejected``, HH-RLHF's transcripts, ShareGPT / LLaMA-Factory pairs...; JSONL, a JSON list, gzip, parquet): a
    bad record names the file and line."""
    from lrlhf.data.conversations import SkipRecord
    from lrlhf.data.formats.reading import read_record
    from lrlhf.data.sources import read_rows

    if not path.is_file():
        raise ValueError(f"{path}: cannot read it: not a file")
    rows, _ = read_rows(path)
    items, seen = [], set()
    for raw in rows:
        record, where = raw.row, raw.where
        try:
            pair = read_record(record, "preference", where=where, source=path.name)
        except SkipRecord as skip:
            raise ValueError(f"{where}: not a pair to label ({skip.reason})") from None
        index = len(items)
        pair_id = record.get("id", index)
        if check:
            key = f"check-{index}"
        elif isinstance(pair_id, int) and not isinstance(pair_id, bool):
            key = str(pair_id)
        else:
            raise ValueError(f"{where}: `id` must be an integer, got {pair_id!r}")
        if key in seen:
            raise ValueError(f"{where}: `id` {pair_id} appears twice")
        seen.add(key)
        turns = tuple((m["role"], m["content"]) for m in pair.prompt)
        items.append(Item(key, turns, _text(pair.chosen), _text(pair.rejected), {**record, "id": pair_id}, check))
    if not items and not check:
        raise ValueError(f"{path}: no pairs to label")
    return items


def labelled_path(path: Path) -> Path:
    """``round_2.to_label.jsonl`` -> ``round_2.labelled.jsonl``; ``pairs.jsonl`` -> ``pairs.labelled.jsonl``."""
    stem = path.name
    for suffix in (".gz", ".jsonl", ".json", ".parquet", ".to_label"):
        stem = stem.removesuffix(suffix)
    return path.with_name(f"{stem}.labelled.jsonl")


def _now() -> tuple[str, float]:
    t = time.time()
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds"), t


class AnnotatorLog:
    """One annotator's decisions, replayed from and appended to their log file."""

    def __init__(self, path: Path, name: str):
        self.path, self.name = path, name
        self.decisions: dict[str, dict] = {}  # key -> the decision's line, in the order given
        if path.is_file():
            self._replay()

    def _replay(self) -> None:
        data = self.path.read_bytes()
        good = len(data) if data.endswith(b"\n") or not data else data.rfind(b"\n") + 1
        if good < len(data):  # the line in flight when the server was killed: dropped, cut off before appending
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        for number, line in enumerate(data[:good].decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{self.path}:{number}"
            try:
                event = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not JSON: {err}") from err
            key = event.get("key") if isinstance(event, dict) else None
            if event.get("event") == "label" and key not in self.decisions and event.get("choice") in CHOICES:
                self.decisions[key] = event
            elif event.get("event") == "undo" and self.decisions and next(reversed(self.decisions)) == key:
                del self.decisions[key]
            else:
                raise ValueError(f"{where}: not a decision or an undo of the last one: {line[:200]}")

    def append(self, event: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


class LabelStore:
    """The pairs of ``path``, the ``checks``, the annotators' logs and the labelled file (beside ``path``, or in
    ``out_dir``); thread-safe."""

    def __init__(self, path: str | Path, checks: str | Path | None = None, budget: int | None = None,
                 seed: int = 0, out_dir: str | Path | None = None):
        self.path = Path(path)
        self.pairs = read_items(self.path)
        self.checks = read_items(Path(checks), check=True) if checks else []
        self.items = {item.key: item for item in [*self.pairs, *self.checks]}
        if budget is not None and not 0 < budget <= len(self.pairs):
            raise ValueError(f"budget must be between 1 and the {len(self.pairs)} pairs of {self.path}, got {budget}")
        self.budget = len(self.pairs) if budget is None else budget
        self.seed = seed
        self.out = labelled_path(self.path)
        if out_dir is not None:  # the labels elsewhere (the pairs' folder may be read-only or shared)
            self.out = Path(out_dir) / self.out.name
        self.log_dir = self.out.with_name(self.out.name.removesuffix(".labelled.jsonl") + ".labels")
        self.lock = threading.Lock()
        self.complete = threading.Event()
        self.logs: dict[str, AnnotatorLog] = {}
        for log in sorted(self.log_dir.glob("*.jsonl")) if self.log_dir.is_dir() else []:
            self.annotator(log.stem)
        self._write_labelled()  # the file the logs call for (a kill between a log line and the file lost it)

    # ------------------------------------------------------------------ per annotator
    def annotator(self, name: str) -> AnnotatorLog:
        if not NAME.fullmatch(name or ""):
            raise ValueError(f"annotator name {name!r}: use 1-40 letters, digits, '.', '_' or '-'")
        if name not in self.logs:
            log = AnnotatorLog(self.log_dir / f"{name}.jsonl", name)
            unknown = [k for k in log.decisions if k not in self.items]
            if unknown:
                raise ValueError(f"{log.path}: decisions for items {unknown[:5]} that {self.path} and the checks "
                                 "do not hold (labels of another file?)")
            self.logs[name] = log
        return self.logs[name]

    def queue(self, name: str) -> list[str]:
        """The keys in the order ``name`` sees them: the pairs in file order, each check at a seeded place."""
        keys = [item.key for item in self.pairs]
        rng = random.Random(f"lrlhf-label-queue:{self.seed}:{name}")
        for check in self.checks:
            keys.insert(rng.randint(0, len(keys)), check.key)
        return keys

    def swapped(self, name: str, key: str) -> bool:
        """Whether ``name`` sees ``rejected`` on the left for item ``key`` (a seeded coin per annotator and item)."""
        return random.Random(f"lrlhf-label-order:{self.seed}:{name}:{key}").random() < 0.5

    def current(self, name: str) -> Item | None:
        """The item ``name`` is on (None when they have seen every item)."""
        decided = self.annotator(name).decisions
        return next((self.items[k] for k in self.queue(name) if k not in decided), None)

    def progress(self, name: str) -> tuple[int, int]:
        return len(self.annotator(name).decisions), len(self.items)

    def last(self, name: str) -> str | None:
        decided = self.annotator(name).decisions
        return next(reversed(decided)) if decided else None

    # ------------------------------------------------------------------ actions
    def decide(self, name: str, key: str, choice: str, comment: str = "") -> dict:
        """Record ``name``'s ``choice`` (on the page's terms ``left`` / ``right``, or ``chosen`` / ``rejected`` as
        written, ``tie``, ``both_bad``, ``skip``) for item ``key``, the one they are on; else :class:`StaleAction`."""
        with self.lock:
            log = self.annotator(name)
            item = self.current(name)
            if item is None or item.key != key:
                raise StaleAction(f"{name} is not on item {key}")
            swapped = self.swapped(name, key)
            if choice in ("left", "right"):
                choice = "chosen" if (choice == "left") != swapped else "rejected"
            if choice not in CHOICES:
                raise ValueError(f"choice must be one of left, right, {', '.join(CHOICES)}; got {choice!r}")
            stamp, t = _now()
            event = {"event": "label", "key": key, "id": item.record["id"], "annotator": name, "choice": choice,
                     "label": LABEL_OF[choice], "left": "rejected" if swapped else "chosen", "check": item.check,
                     "comment": str(comment)[:2000], "time": stamp, "t": t}
            log.append(event)
            log.decisions[key] = event
            self._write_labelled()
            return event

    def undo(self, name: str, key: str) -> None:
        """Take back ``name``'s last decision, which must be for ``key`` (else :class:`StaleAction`)."""
        with self.lock:
            log = self.annotator(name)
            if self.last(name) != key:
                raise StaleAction(f"{name}'s last decision is not item {key}")
            stamp, t = _now()
            log.append({"event": "undo", "key": key, "annotator": name, "time": stamp, "t": t})
            del log.decisions[key]
            self._write_labelled()

    # ------------------------------------------------------------------ the labelled file
    def _decided_pairs(self) -> int:
        return sum(any(item.key in log.decisions for log in self.logs.values()) for item in self.pairs)

    def _labelled_enough(self) -> bool:
        return self._decided_pairs() >= self.budget

    def _write_labelled(self) -> None:
        if not self._labelled_enough():
            return
        lines = []
        for item in self.pairs:
            notes = [log.decisions[item.key] for log in self.logs.values() if item.key in log.decisions]
            labels = [n["label"] for n in notes if n["label"] is not None]
            mean = sum(labels) / len(labels) if labels else None
            label = None if mean is None else 1.0 if mean > 0.5 else 0.0 if mean < 0.5 else 0.5
            annotations = [{k: n[k] for k in ("annotator", "choice", "label", "left", "comment", "time")}
                           for n in notes]
            lines.append(json.dumps({**item.record, "label": label, "annotations": annotations}, ensure_ascii=False))
        atomic_write_text(self.out, "".join(line + "\n" for line in lines))
        self.complete.set()


__all__ = ["CHOICES", "AnnotatorLog", "Item", "LabelStore", "StaleAction", "labelled_path", "read_items"]
