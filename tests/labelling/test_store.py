"""The labelling page's store and its quality figures, against hand-built logs: decisions and undo replayed from the
append-only logs, a torn last line dropped and cut off, stale actions never written, the labelled file (written
atomically once the budget holds; several annotators' labels averaged), the checks' accuracy, Cohen's kappa."""

import json
from pathlib import Path

import pytest

from lrlhf.eval.annotators import Pair, read_labels
from lrlhf.labelling.agreement import cohen_kappa, summarise
from lrlhf.labelling.store import LabelStore, StaleAction, labelled_path

SHARED_HH = Path(__file__).resolve().parents[3] / "shared" / "data" / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"


def write_pairs(path, n, start=0):
    rows = [{"id": start + i, "prompt": f"question {i}", "chosen": [{"role": "assistant", "content": f"good {i}"}],
             "rejected": [{"role": "assistant", "content": f"bad {i}"}], "label": None} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_decisions_undo_and_the_labelled_file(tmp_path):
    path = tmp_path / "round_2.to_label.jsonl"
    write_pairs(path, 3)
    store = LabelStore(path)
    assert store.out == tmp_path / "round_2.labelled.jsonl" == labelled_path(path)
    assert store.current("ann").key == "0" and store.progress("ann") == (0, 3)
    store.decide("ann", "0", "chosen")
    with pytest.raises(StaleAction):  # a resubmitted page for item 0: not written twice
        store.decide("ann", "0", "rejected")
    store.decide("ann", "1", "tie", comment="same")
    store.undo("ann", "1")
    with pytest.raises(StaleAction):  # only the last decision can be undone
        store.undo("ann", "1")
    assert store.current("ann").key == "1" and not store.out.exists()
    store.decide("ann", "1", "rejected")
    event = store.decide("ann", "2", "left")  # the page's terms: left is `chosen` unless swapped
    assert event["choice"] == ("rejected" if store.swapped("ann", "2") else "chosen")
    assert event["left"] == ("rejected" if store.swapped("ann", "2") else "chosen")
    assert store.complete.is_set() and store.current("ann") is None
    rows = jsonl(store.out)
    assert [r["label"] for r in rows] == [1.0, 0.0, 1.0 if event["choice"] == "chosen" else 0.0]
    assert [a["annotator"] for r in rows for a in r["annotations"]] == ["ann"] * 3
    assert all(a["time"].endswith("+00:00") for r in rows for a in r["annotations"])
    # the log holds every event, undo included; a new store replays it to the same state
    log = jsonl(store.log_dir / "ann.jsonl")
    assert [(e["event"], e["key"]) for e in log] == [("label", "0"), ("label", "1"), ("undo", "1"), ("label", "1"),
                                                     ("label", "2")]
    again = LabelStore(path)
    assert again.complete.is_set() and list(again.logs["ann"].decisions) == ["0", "1", "2"]
    written = store.out.read_text()
    store.out.unlink()  # killed after the last log line, before the labelled file: the logs write it again
    assert LabelStore(path).complete.is_set() and store.out.read_text() == written
    # what FileExchange reads back: the labels by pair id
    pairs = [Pair(None, f"good {i}", f"bad {i}") for i in range(3)]
    assert read_labels(store.out, pairs) == [r["label"] for r in rows]


def test_a_torn_last_line_is_dropped_and_cut_off(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, 3)
    store = LabelStore(path)
    store.decide("ann", "0", "chosen")
    log = store.log_dir / "ann.jsonl"
    log.write_text(log.read_text() + '{"event": "label", "key": "1", "cho')  # killed mid-write
    again = LabelStore(path)
    assert list(again.logs["ann"].decisions) == ["0"] and log.read_text().endswith("}\n")
    again.decide("ann", "1", "skip")
    assert [e["key"] for e in jsonl(log)] == ["0", "1"]
    log.write_text(log.read_text() + "not json\n")  # a bad complete line is an error naming it, never skipped
    with pytest.raises(ValueError, match=r"ann\.jsonl:3: not JSON"):
        LabelStore(path)


def test_the_page_order_is_seeded_per_annotator_and_item_and_maps_back_to_the_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, 12)
    store = LabelStore(path)
    swapped = [store.swapped("ann", str(i)) for i in range(12)]
    assert 0 < sum(swapped) < 12 and swapped != [store.swapped("other", str(i)) for i in range(12)]
    assert swapped == [LabelStore(path).swapped("ann", str(i)) for i in range(12)]  # the same after a restart
    for i in range(12):
        event = store.decide("ann", str(i), "left" if i % 2 else "right")
        on_left = "rejected" if swapped[i] else "chosen"
        on_right = "chosen" if swapped[i] else "rejected"
        assert (event["left"], event["choice"]) == (on_left, on_left if i % 2 else on_right)
    assert [r["label"] for r in jsonl(store.out)] == [
        float((i % 2 == 1) != swapped[i]) for i in range(12)]  # 1: `chosen` as written preferred


def test_budget_several_annotators_and_skips(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, 4)
    store = LabelStore(path, budget=2)
    store.decide("x", "0", "chosen")
    store.decide("y", "0", "rejected")
    assert not store.out.exists()  # one pair decided, budget 2
    store.decide("y", "1", "skip")
    assert not store.out.exists()  # a skip is no decision about the pair: it does not count toward the budget
    store.decide("x", "1", "both_bad")
    rows = jsonl(store.out)
    # x: 1 and y: 0 average to a tie; both bad is a decision without a label
    assert [r["label"] for r in rows] == [0.5, None, None, None]
    assert [len(r["annotations"]) for r in rows] == [2, 2, 0, 0]
    store.decide("x", "2", "chosen")
    store.decide("y", "2", "chosen")
    assert [r["label"] for r in jsonl(store.out)] == [0.5, None, 1.0, None]
    with pytest.raises(ValueError, match="budget must be between 1 and the 4 pairs"):
        LabelStore(path, budget=5)
    for name in ("../etc", "..", "."):
        with pytest.raises(ValueError, match="annotator name"):
            store.annotator(name)


def test_skipping_every_pair_completes_nothing_and_skipped_pairs_come_back(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, 3)
    store = LabelStore(path)
    for key in "012":
        store.decide("ann", key, "skip")
    assert not store.out.exists() and not store.complete.is_set()  # issue #49: skip used to "complete" the file
    assert store.current("ann").key == "0" and store.progress("ann") == (0, 3)  # the skipped pairs, again
    store.decide("ann", "0", "both_bad")
    store.decide("ann", "1", "both_bad")
    store.decide("ann", "2", "both_bad")
    assert store.current("ann") is None and not store.complete.is_set()  # no label at all: a round never goes on
    assert not store.out.exists()
    store.undo("ann", "2")
    store.decide("ann", "2", "rejected")
    assert store.complete.is_set() and [r["label"] for r in jsonl(store.out)] == [None, None, 0.0]
    again = LabelStore(path)  # replayed: a decision after a skip replaces it
    assert {k: e["choice"] for k, e in again.logs["ann"].decisions.items()} == {
        "0": "both_bad", "1": "both_bad", "2": "rejected"}


def test_an_undo_below_the_budget_takes_the_label_out_of_the_file_also_after_a_restart(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, 3)
    store = LabelStore(path, budget=2)
    store.decide("ann", "0", "chosen")
    store.decide("ann", "1", "rejected")
    assert [r["label"] for r in jsonl(store.out)] == [1.0, 0.0, None] and store.complete.is_set()
    store.undo("ann", "1")  # below the budget: the file no longer holds the undone label
    assert [r["label"] for r in jsonl(store.out)] == [1.0, None, None] and not store.complete.is_set()
    store.out.write_text(store.out.read_text().replace("null", "0.0"))  # a stale file (killed before the write)
    again = LabelStore(path, budget=2)
    assert [r["label"] for r in jsonl(again.out)] == [1.0, None, None] and not again.complete.is_set()
    export = tmp_path / "export.jsonl"
    assert again.export(export) == 1 and [r["id"] for r in jsonl(export)] == [0]  # the labelled pairs only


def test_labels_stay_with_their_pair_when_the_file_changes(tmp_path):
    """Issue #49: in a file without ids a label was tied to the line number; a deleted line moved every label."""
    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"question {i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = LabelStore(path)
    for key, choice in zip("0123", ("chosen", "rejected", "tie", "chosen"), strict=True):
        store.decide("ann", key, choice, comment=f"on {key}")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))  # the first line deleted
    moved = LabelStore(path)  # each label found by its pair's content, none shifted
    assert [(r["prompt"], r["label"], r["annotations"][0]["comment"]) for r in jsonl(moved.out)] == [
        ("question 1", 0.0, "on 1"), ("question 2", 0.5, "on 2"), ("question 3", 1.0, "on 3")]
    assert moved.logs["ann"].moved == 3 and moved.logs["ann"].gone == 1  # question 0's label: its pair is gone
    rows[2]["chosen"] = "good 2, edited"  # a labelled answer changed: its label is not the new pair's
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    edited = LabelStore(path)
    assert [r["label"] for r in jsonl(edited.out)] == [1.0, 0.0, None, 1.0]
    assert edited.current("ann").key == "2" and edited.logs["ann"].gone == 1
    edited.decide("ann", "2", "rejected")
    assert [r["label"] for r in jsonl(edited.out)] == [1.0, 0.0, 0.0, 1.0]
    # string ids are keys as they are
    path.write_text("".join(json.dumps({**r, "id": f"item-{i}"}) + "\n" for i, r in enumerate(rows)))
    store = LabelStore(path, out_dir=tmp_path / "other")
    assert store.current("ann").key == "item-0"
    store.decide("ann", "item-0", "chosen")
    assert jsonl(store.log_dir / "ann.jsonl")[0]["id"] == "item-0"


def test_equal_pairs_keep_their_labels_when_a_line_is_inserted_above(tmp_path):
    """Two equal pairs labelled differently, a line inserted above them: the first label moves to the first copy,
    the second label found its own place taken and refused the store ("a second decision on item 1")."""
    path = tmp_path / "pairs.jsonl"
    same = {"prompt": "question", "chosen": "good", "rejected": "bad"}
    path.write_text(2 * (json.dumps(same) + "\n"))
    store = LabelStore(path)
    store.decide("ann", "0", "chosen")
    store.decide("ann", "1", "rejected")
    new = {"prompt": "new", "chosen": "a", "rejected": "b"}
    path.write_text("".join(json.dumps(r) + "\n" for r in (new, same, same)))
    moved = LabelStore(path)
    assert [r["label"] for r in jsonl(moved.out)] == [None, 1.0, 0.0]


def test_an_undo_after_the_file_changed_is_replayed(tmp_path):
    """A decision kept under a new key after a line was deleted, then undone (the undo logged under the new key):
    the log was refused at the next start ("not a decision or an undo of the last one")."""
    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"question {i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = LabelStore(path)
    store.decide("ann", "0", "chosen")
    store.decide("ann", "1", "rejected")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))  # the first line deleted
    moved = LabelStore(path)
    moved.undo("ann", "0")  # question 1's label, logged as "1", kept as "0"
    again = LabelStore(path)
    assert list(again.logs["ann"].decisions) == ["gone:1"] and again.current("ann").key == "0"


def test_records_training_would_drop_are_dropped_and_counted_not_fatal(tmp_path):
    path = tmp_path / "hh.jsonl"
    rows = [{"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello.", "rejected": "\n\nHuman: Hi?\n\nAssistant: Go."},
            {"chosen": "\n\nHuman: A?\n\nAssistant: x", "rejected": "\n\nHuman: B?\n\nAssistant: y"},
            {"chosen": "\n\nHuman: C?\n\nAssistant: same", "rejected": "\n\nHuman: C?\n\nAssistant: same"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = LabelStore(path)
    assert [item.key for item in store.pairs] == ["0"]
    assert store.dropped == {"no_shared_prefix": 1, "identical_chosen_rejected": 1}


@pytest.mark.skipif(not SHARED_HH.is_file(), reason="../shared/data (HH-RLHF harmless-base test) is absent")
def test_the_hh_file_a_world_reads_can_be_labelled(tmp_path):
    store = LabelStore(SHARED_HH, out_dir=tmp_path)  # issue #49: stopped at line 1255 (no_shared_prefix)
    assert len(store.pairs) == 2307 and store.dropped == {"no_shared_prefix": 5}


def test_checks_are_mixed_in_and_scored(tmp_path):
    path, checks = tmp_path / "pairs.jsonl", tmp_path / "checks.jsonl"
    write_pairs(path, 4)
    write_pairs(checks, 2)
    store = LabelStore(path, checks=checks)
    queue = store.queue("ann")
    assert sorted(queue) == ["0", "1", "2", "3", "check-0", "check-1"]
    assert [k for k in queue if not k.startswith("check")] == ["0", "1", "2", "3"]
    # mixed in at seeded places, so an annotator cannot tell a check by where it is
    assert len({tuple(store.queue(name)) for name in "abcdefgh"}) > 2 and store.queue("ann") == queue
    for key in queue:
        store.decide("ann", key, "chosen" if key != "check-1" else "rejected")
    # checks never reach the labelled file; one of two answered right
    assert [r["id"] for r in jsonl(store.out)] == [0, 1, 2, 3]
    (ann,) = summarise(store).annotators
    assert (ann.decisions, ann.checks_answered, ann.checks_correct, ann.check_accuracy) == (6, 2, 1, 0.5)


def test_kappa_and_disagreements_by_hand(tmp_path):
    # two annotators, 4 items: x = c r c r, y = c r r r; agreement 3/4; marginals x (1/2, 1/2), y (1/4, 3/4):
    # p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2, kappa = (3/4 - 1/2) / (1 - 1/2) = 1/2
    assert cohen_kappa(["chosen", "rejected", "chosen", "rejected"],
                       ["chosen", "rejected", "rejected", "rejected"]) == pytest.approx(0.5)
    assert cohen_kappa(["tie", "tie"], ["tie", "tie"]) is None  # p_e = 1: undefined, never shown as a number
    assert cohen_kappa([], []) is None
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, 5)
    store = LabelStore(path)
    for key, (a, b) in enumerate([("chosen", "chosen"), ("rejected", "rejected"), ("chosen", "rejected"),
                                  ("rejected", "rejected"), ("skip", "tie")]):
        store.decide("x", str(key), a)
        store.decide("y", str(key), b)
    summary = summarise(store)
    (pair,) = summary.pairs
    assert (pair.common, pair.agreement, pair.kappa) == (4, 0.75, pytest.approx(0.5))
    assert summary.disagreements == [("2", {"x": "chosen", "y": "rejected"})]


def test_bad_files_name_the_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "q", "chosen": "a"}\n')
    with pytest.raises(ValueError, match=r"pairs\.jsonl:1: cannot detect the preference format"):
        LabelStore(path)
    path.write_text('{"id": 0, "prompt": "q", "chosen": "a", "rejected": "b"}\n' * 2)
    with pytest.raises(ValueError, match=r"pairs\.jsonl:2: `id` 0 appears twice"):
        LabelStore(path)
    with pytest.raises(ValueError, match="cannot read"):
        LabelStore(tmp_path / "missing.jsonl")


def test_other_preference_formats_and_labels_kept_elsewhere(tmp_path):
    # HH-RLHF transcripts in a JSON list (no prompt key, no id): the shared prefix is the conversation
    source = tmp_path / "data" / "hh.json"
    source.parent.mkdir()
    source.write_text(json.dumps([{"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello, how can I help?",
                                   "rejected": "\n\nHuman: Hi?\n\nAssistant: Go away."}]))
    store = LabelStore(source, out_dir=tmp_path / "labels")
    (item,) = store.pairs
    assert (item.turns, item.chosen, item.rejected) == ((("user", "Hi?"),), "Hello, how can I help?", "Go away.")
    store.decide("ann", "0", "chosen")
    assert jsonl(tmp_path / "labels" / "hh.labelled.jsonl")[0]["label"] == 1.0
    assert sorted(p.name for p in source.parent.iterdir()) == ["hh.json"]  # nothing written beside the data
