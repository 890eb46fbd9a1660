"""The labels people give on the labelling page (``lrlhf label``), kept so that nothing is lost.

A :class:`LabelStore` holds the pairs of one to-label file (the preference format: ``prompt``, ``chosen``,
``rejected``; the iterative loop's ``round_<r>.to_label.jsonl`` is one), optional check items with a known answer
(``chosen`` is the better one), and one append-only log per annotator, ``<stem>.labels/<annotator>.jsonl``: each
decision and each undo is one line, flushed and fsynced before the page moves on, so a SIGKILL at any moment loses
at most the decision in flight (a torn last line is dropped and cut off when the log is opened again). The state is
the replay of the logs; a decision is taken only for the item the annotator is on, so a resubmitted form or a retry
after a restart never records a pair twice. Each decision carries a hash of what was shown (the conversation and
both answers): when the file changed under a log, a decision is found by that content wherever it now is, and one
whose pair is gone or was edited is kept in the log and used for nothing; a label never moves to another pair.

Each annotator sees every item once, in the file's order with the checks mixed in at seeded places, the two answers
of each in a seeded order (left / right, recorded with the decision); a skipped pair comes back after the others. A
decision is ``chosen`` / ``rejected`` (as written in the file), ``tie``, ``both_bad`` or ``skip``. When ``budget``
pairs (all by default) have a decision that is not a skip, and at least one has a label, the labelled file
(``<stem>.labelled.jsonl``, the file :class:`lrlhf.eval.annotators.FileExchange` and every preference reader read) is
written atomically: every pair's record with its ``id``, its ``label`` (1: ``chosen`` better, 0: ``rejected``, 0.5:
a tie, null: no label; several annotators: the mean of their labels, rounded to 1 / 0 / 0.5) and its
``annotations``. Once written it is kept equal to the logs: rewritten after every later decision and undo (also
below the budget, and when the store is opened again).
"""

from __future__ import annotations

import hashlib
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
NAME = re.compile(r"(?!\.+$)[A-Za-z0-9_.-]{1,40}")  # never "." or "..": a name is a file name


class StaleAction(Exception):
    """A decision or undo for an item the annotator is not on (a resubmitted or outdated page): nothing is written."""


@dataclass(frozen=True)
class Item:
    """One pair to compare: ``key`` (the pair's ``id`` as text, or ``check-<i>``), the conversation before the
    answers as ``(role, text)`` turns, the two answers as written (``chosen``, ``rejected``) and ``digest``, a hash
    of the three that every decision on the item carries."""

    key: str
    turns: tuple[tuple[str, str], ...]
    chosen: str
    rejected: str
    record: dict
    check: bool = False

    @property
    def digest(self) -> str:
        content = json.dumps([self.turns, self.chosen, self.rejected], ensure_ascii=False)
        return hashlib.sha256(content.encode("utf-8")).hexdigest()[:20]


def _text(messages: list[dict]) -> str:
    """One answer's text: its content, or each message's with its role when it is several turns."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n\n".join(f"**{m['role']}:** {m['content']}" for m in messages)


#: a labelled file's own fields: a file already labelled is labelled again from its pairs, not from its labels
LABEL_FIELDS = ("label", "annotations")


def read_items(path: Path, check: bool = False, format: str = "auto") -> tuple[list[Item], dict[str, int]]:
    """The pairs of a local preference file in any format lrlhf reads (its own ``prompt`` / ``chosen`` /
    ``rejected``, HH-RLHF's transcripts, ShareGPT / LLaMA-Factory pairs...; JSONL, a JSON list, gzip, parquet), and
    the records dropped by reason, as training drops them (no shared prefix, identical answers). A bad record names
    the file and line. ``id`` (an integer or a string) is the pair's key; without one, the pair's index."""
    from lrlhf.data.conversations import SkipRecord
    from lrlhf.data.format_errors import DataFormatError
    from lrlhf.data.formats.reading import read_record
    from lrlhf.data.sources import read_rows
    from lrlhf.data.summary import IDENTICAL

    if not path.is_file():
        raise ValueError(f"{path}: cannot read it: not a file")
    rows, _ = read_rows(path)
    items, seen, dropped = [], set(), {}
    for index, raw in enumerate(rows):
        record, where = raw.row, raw.where
        try:
            pair = read_record({k: v for k, v in record.items() if k not in LABEL_FIELDS}, "preference",
                               format=format, where=where, source=path.name)
        except SkipRecord as skip:
            dropped[skip.reason] = dropped.get(skip.reason, 0) + 1
            continue
        except DataFormatError as err:
            raise ValueError(str(err).replace("Pass format= to choose one", "Pass --format to choose one")) from None
        if pair.chosen == pair.rejected:
            dropped[IDENTICAL] = dropped.get(IDENTICAL, 0) + 1
            continue
        pair_id = record.get("id", index)
        if check:
            key = f"check-{len(items)}"
        elif isinstance(pair_id, (int, str)) and not isinstance(pair_id, bool) and str(pair_id).strip():
            key = str(pair_id)
        else:
            raise ValueError(f"{where}: `id` must be an integer or a non-empty string, got {pair_id!r}")
        if key in seen:
            raise ValueError(f"{where}: `id` {pair_id!r} appears twice")
        seen.add(key)
        turns = tuple((m["role"], m["content"]) for m in pair.prompt)
        items.append(Item(key, turns, _text(pair.chosen), _text(pair.rejected), {**record, "id": pair_id}, check))
    if not items and not check:
        raise ValueError(f"{path}: no pairs to label" + (f" (dropped: {dropped})" if dropped else ""))
    return items, dropped


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
    """One annotator's decisions, replayed from and appended to their log file. ``resolve(event, where, decided)``
    (``decided``: the decisions replayed so far) gives the key of the item a logged decision was about (its content
    may have moved in the file), or None when no item has that content any more; such a decision is kept under a
    key no item has (``gone:<line>``), so it is never shown, labelled or counted but can still be undone. ``moved`` /
    ``gone`` count them."""

    def __init__(self, path: Path, name: str, resolve=None):
        self.path, self.name = path, name
        self.decisions: dict[str, dict] = {}  # key -> the decision's line, in the order given
        self.moved = self.gone = 0
        if path.is_file():
            self._replay(resolve or (lambda event, where, decided: event["key"]))

    def _replay(self, resolve) -> None:
        data = self.path.read_bytes()
        good = len(data) if data.endswith(b"\n") or not data else data.rfind(b"\n") + 1
        if good < len(data):  # the line in flight when the server was killed: dropped, cut off before appending
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        logged_as: dict[str, str] = {}  # the key a decision is kept under -> its key in the log
        for number, line in enumerate(data[:good].decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{self.path}:{number}"
            try:
                event = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not JSON: {err}") from err
            logged = event.get("key") if isinstance(event, dict) else None
            if not isinstance(event, dict) or not isinstance(logged, str):
                raise ValueError(f"{where}: not a decision or an undo of the last one: {line[:200]}")
            if event.get("event") == "label" and event.get("choice") in CHOICES:
                key = resolve(event, where, self.decisions)
                if key is None:
                    key, self.gone = f"gone:{number}", self.gone + 1
                self.moved += key != logged and not key.startswith("gone:")
                if self.decisions.get(key, {}).get("choice", "skip") != "skip":
                    raise ValueError(f"{where}: a second decision on item {key} (not after a skip)")
                logged_as[key] = logged
                self.decisions.pop(key, None)
                self.decisions[key] = {**event, "key": key}
            elif event.get("event") == "undo" and self.decisions and logged in (
                    last := next(reversed(self.decisions)), logged_as.get(last)):  # written before or after a change
                del self.decisions[last]
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
                 seed: int = 0, out_dir: str | Path | None = None, format: str = "auto"):
        self.path = Path(path)
        self.pairs, self.dropped = read_items(self.path, format=format)
        self.checks = read_items(Path(checks), check=True)[0] if checks else []
        self.items = {item.key: item for item in [*self.pairs, *self.checks]}
        self.by_digest: dict[str, list[str]] = {}
        for item in self.items.values():
            self.by_digest.setdefault(item.digest, []).append(item.key)
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
            raise ValueError(f"annotator name {name!r}: use 1-40 letters, digits, '.', '_' or '-' (not only dots)")
        if name not in self.logs:
            log = AnnotatorLog(self.log_dir / f"{name}.jsonl", name, self._resolve)
            if log.moved or log.gone:
                print(f"lrlhf label: {self.path.name} changed under {log.path}: {log.moved} decision(s) found by "
                      f"their pair's content at another place, {log.gone} about pairs the file no longer holds "
                      "(kept in the log, used for nothing; their places are shown again)", flush=True)
            self.logs[name] = log
        return self.logs[name]

    def _resolve(self, event: dict, where: str, decided: dict) -> str | None:
        """The key of the item a logged decision was about: its own key while the item there has the content the
        decision saw and no other decision took it, else an item with that content not yet decided (or only
        skipped); None when no pair has it any more (the decision stays in the log and counts for nothing)."""
        key, digest = event["key"], event.get("hash")
        if not isinstance(digest, str):
            raise ValueError(f"{where}: a decision without the `hash` of the pair it was about (written by an "
                             "earlier lrlhf): label the file again into a new --out folder")
        def open_(k: str) -> bool:  # not decided, or only skipped
            return decided.get(k, {}).get("choice", "skip") == "skip"

        if key in self.items and self.items[key].digest == digest and open_(key):
            return key  # (taken already: an equal pair's decision moved there, e.g. after a line was inserted above)
        open_keys = [k for k in self.by_digest.get(digest, []) if open_(k)]
        return open_keys[0] if open_keys else None

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
        """The item ``name`` is on: the first in their queue without a decision, then the skipped ones in the order
        they were skipped (None when every item has a decision other than a skip)."""
        decided = self.annotator(name).decisions
        fresh = next((self.items[k] for k in self.queue(name) if k not in decided), None)
        return fresh or next((self.items[k] for k, e in decided.items()
                              if e["choice"] == "skip" and k in self.items), None)

    def progress(self, name: str) -> tuple[int, int]:
        """(items ``name`` decided, skips left out; all items)."""
        decided = self.annotator(name).decisions
        return sum(e["choice"] != "skip" for k, e in decided.items() if k in self.items), len(self.items)

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
            event = {"event": "label", "key": key, "hash": item.digest, "id": item.record["id"], "annotator": name,
                     "choice": choice,
                     "label": LABEL_OF[choice], "left": "rejected" if swapped else "chosen", "check": item.check,
                     "comment": str(comment)[:2000], "time": stamp, "t": t}
            log.append(event)
            log.decisions.pop(key, None)  # a skipped item decided now: the decision moves to the end
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
        """Pairs with a decision other than a skip from anyone (a skip is not a decision about the pair)."""
        return sum(any(log.decisions.get(item.key, {}).get("choice", "skip") != "skip" for log in self.logs.values())
                   for item in self.pairs)

    def _labelled_enough(self) -> bool:
        """The budget holds and at least one pair has a label: a round never goes on with no labels at all."""
        return self._decided_pairs() >= self.budget and any(row["label"] is not None for row in self.labelled_rows())

    def labelled_rows(self, only_labelled: bool = False) -> list[dict]:
        """Every pair's record with its ``label`` and ``annotations`` (``only_labelled``: the pairs with a label)."""
        rows = []
        for item in self.pairs:
            notes = [log.decisions[item.key] for log in self.logs.values() if item.key in log.decisions]
            labels = [n["label"] for n in notes if n["label"] is not None]
            mean = sum(labels) / len(labels) if labels else None
            label = None if mean is None else 1.0 if mean > 0.5 else 0.0 if mean < 0.5 else 0.5
            annotations = [{k: n[k] for k in ("annotator", "choice", "label", "left", "comment", "time")}
                           for n in notes]
            if label is not None or not only_labelled:
                rows.append({**item.record, "label": label, "annotations": annotations})
        return rows

    def _write_labelled(self) -> None:
        """Write the labelled file once the budget holds; once written, keep it equal to the logs (an undo, also
        below the budget, takes its label out of the file)."""
        enough = self._labelled_enough()
        if not enough and not self.out.exists():
            return
        atomic_write_text(self.out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in self.labelled_rows()))
        if enough:
            self.complete.set()
        else:
            self.complete.clear()

    def export(self, path: str | Path) -> int:
        """Write the labelled pairs only (no unlabelled, skipped or both-bad pair) to ``path``; their count."""
        rows = self.labelled_rows(only_labelled=True)
        atomic_write_text(Path(path), "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        return len(rows)


__all__ = ["CHOICES", "LABEL_FIELDS", "AnnotatorLog", "Item", "LabelStore", "StaleAction", "labelled_path",
           "read_items"]
