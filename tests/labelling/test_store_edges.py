"""The labelling store at its edges: how a file's pairs are read (several-turn answers, an explicit format, the
records dropped per reason, bad ids, nothing to label), the replay of hand-built logs (every malformed line an
error naming it, an intact log left untouched, decisions and undos found again after the file changed), the
seeded page order at its bounds, the budget's bounds, and the text written (UTF-8 as is, whatever the locale)."""

import io
import json
import os
import re
import sys
import types

import pytest

import lrlhf.labelling.store as store_module
from lrlhf.labelling.store import AnnotatorLog, LabelStore, StaleAction, labelled_path, read_items

HI = {"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello.", "rejected": "\n\nHuman: Hi?\n\nAssistant: Go."}
SAME = {"chosen": "\n\nHuman: C?\n\nAssistant: same", "rejected": "\n\nHuman: C?\n\nAssistant: same"}
NO_PREFIX = {"chosen": "\n\nHuman: A?\n\nAssistant: x", "rejected": "\n\nHuman: B?\n\nAssistant: y"}


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def questions(*names):
    """Pairs without ids (their key is their index), one per name, with distinct content."""
    return [{"prompt": f"question {n}", "chosen": f"good {n}", "rejected": f"bad {n}"} for n in names]


def jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------- reading the pairs
def test_an_answer_of_several_turns_shows_each_turn_with_its_role(tmp_path):
    turns = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"},
             {"role": "assistant", "content": "c"}]
    path = write_rows(tmp_path / "pairs.jsonl", [{"id": 0, "prompt": "q", "chosen": turns, "rejected": "r"}])
    (item,), _ = read_items(path)
    assert (item.chosen, item.rejected) == ("**assistant:** a\n\n**user:** b\n\n**assistant:** c", "r")


def test_an_explicit_format_is_used_and_an_undetectable_file_names_the_cli_flag(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0))
    assert [i.key for i in LabelStore(path, format="pairwise").pairs] == ["0"]
    with pytest.raises(ValueError, match="unknown preference format 'nope'"):
        LabelStore(path, format="nope")
    write_rows(path, [{"question": "q", "answer": "a"}])
    with pytest.raises(ValueError) as err:
        LabelStore(path)
    assert "cannot detect the preference format" in str(err.value)
    assert str(err.value).endswith("Pass --format to choose one.") and "format=" not in str(err.value)


def test_dropped_records_are_counted_per_reason_and_the_rest_still_read(tmp_path):
    path = write_rows(tmp_path / "hh.jsonl", [SAME, NO_PREFIX, SAME, NO_PREFIX, HI])
    store = LabelStore(path)
    assert [item.key for item in store.pairs] == ["4"]
    assert store.dropped == {"identical_chosen_rejected": 2, "no_shared_prefix": 2}


@pytest.mark.parametrize("bad", [True, 1.5, "", "  ", None, [1]])
def test_an_id_that_is_not_an_integer_or_a_non_empty_string_is_an_error_naming_the_line(tmp_path, bad):
    path = write_rows(tmp_path / "pairs.jsonl", [{**questions(0)[0], "id": bad}])
    with pytest.raises(ValueError, match=re.escape(f"pairs.jsonl:1: `id` must be an integer or a non-empty string, "
                                                   f"got {bad!r}")):
        read_items(path)


def test_a_file_with_nothing_to_label_is_an_error_but_checks_may_all_be_dropped(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", [SAME])
    with pytest.raises(ValueError) as err:
        read_items(path)
    assert str(err.value) == f"{path}: no pairs to label (dropped: {{'identical_chosen_rejected': 1}})"
    checks = write_rows(tmp_path / "checks.jsonl", [SAME])
    assert read_items(checks, check=True) == ([], {"identical_chosen_rejected": 1})
    pairs = write_rows(tmp_path / "good.jsonl", questions(0))
    assert LabelStore(pairs, checks=checks).checks == []
    write_rows(path, [])
    with pytest.raises(ValueError) as err:
        read_items(path)
    assert str(err.value) == f"{path}: no pairs to label"


@pytest.mark.parametrize(("name", "labelled"), [
    ("pairs.jsonl.gz", "pairs.labelled.jsonl"), ("pairs.parquet", "pairs.labelled.jsonl"),
    ("pairs.json", "pairs.labelled.jsonl"), ("round_2.to_label.jsonl", "round_2.labelled.jsonl")])
def test_the_labelled_file_drops_every_known_suffix(tmp_path, name, labelled):
    assert labelled_path(tmp_path / name) == tmp_path / labelled


# ---------------------------------------------------------------------------------------------- replaying the logs
def write_log(path, *lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def label(key, choice="chosen", **more):
    return {"event": "label", "key": key, "choice": choice, **more}


def test_a_log_read_on_its_own_keeps_the_logged_keys(tmp_path):
    log = AnnotatorLog(write_log(tmp_path / "ann.jsonl", label("a"), label("b", "tie")), "ann")
    assert log.decisions == {"a": label("a"), "b": label("b", "tie")} and (log.moved, log.gone) == (0, 0)


def test_a_torn_line_after_several_complete_ones_drops_only_it(tmp_path):
    path = write_log(tmp_path / "ann.jsonl", label("a"), label("b"))
    complete = path.read_bytes()
    path.write_bytes(complete + b'{"event": "label", "ke')
    assert list(AnnotatorLog(path, "ann").decisions) == ["a", "b"] and path.read_bytes() == complete


def test_a_torn_fragment_is_cut_off_before_a_bad_line_is_reported(tmp_path):
    path = write_log(tmp_path / "ann.jsonl", label("a"), "XX")
    path.write_bytes(path.read_bytes() + b"XX")  # a bad complete line, then a torn one
    with pytest.raises(ValueError, match=r"ann\.jsonl:2: not JSON"):
        AnnotatorLog(path, "ann")
    assert path.read_bytes() == (json.dumps(label("a")) + "\nXX\n").encode("utf-8")


def test_opening_an_intact_log_does_not_rewrite_it(tmp_path):
    path = write_log(tmp_path / "ann.jsonl", label("a"))
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = os.stat(path)
    assert list(AnnotatorLog(path, "ann").decisions) == ["a"]
    after = os.stat(path)
    assert (after.st_mtime_ns, after.st_ctime_ns, after.st_size) == (before.st_mtime_ns, before.st_ctime_ns,
                                                                     before.st_size)


def test_blank_lines_in_a_log_are_skipped(tmp_path):
    path = write_log(tmp_path / "ann.jsonl", label("a"), "", "   ", label("b"))
    assert list(AnnotatorLog(path, "ann").decisions) == ["a", "b"]


@pytest.mark.parametrize("lines", [
    ["[1, 2]"],
    [json.dumps({"event": "label", "key": 5, "choice": "chosen"})],
    [json.dumps(label("a", "maybe"))],
    [json.dumps({"event": "undo", "key": "a"})],
    [json.dumps(label("a")), json.dumps({"event": "relabel", "key": "a", "choice": "chosen"})],
    [json.dumps(label("a")), json.dumps(label("b")), json.dumps({"event": "undo", "key": "a"})],
    [json.dumps({"event": "undo", "key": "a", "choice": "chosen"})],
])
def test_a_line_that_is_not_a_decision_or_an_undo_of_the_last_one_is_an_error_naming_it(tmp_path, lines):
    path = write_log(tmp_path / "ann.jsonl", *lines)
    with pytest.raises(ValueError) as err:
        AnnotatorLog(path, "ann")
    assert str(err.value) == f"{path}:{len(lines)}: not a decision or an undo of the last one: {lines[-1]}"


@pytest.mark.parametrize("line", [json.dumps("x" * 300), json.dumps({"event": "nope", "key": "a", "pad": "x" * 300})])
def test_a_long_bad_line_is_quoted_to_its_first_200_characters(tmp_path, line):
    path = write_log(tmp_path / "ann.jsonl", line)
    with pytest.raises(ValueError) as err:
        AnnotatorLog(path, "ann")
    assert str(err.value) == f"{path}:1: not a decision or an undo of the last one: {line[:200]}"


def test_a_second_decision_on_an_item_is_an_error_naming_it(tmp_path):
    path = write_log(tmp_path / "ann.jsonl", label("a", "skip"), label("b"), label("a", "tie"), label("b", "skip"))
    with pytest.raises(ValueError) as err:
        AnnotatorLog(path, "ann")
    assert str(err.value) == f"{path}:4: a second decision on item b (not after a skip)"


def test_a_decision_without_a_hash_names_the_line_and_the_remedy(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0))
    log = tmp_path / "pairs.labels" / "ann.jsonl"
    log.parent.mkdir()
    write_log(log, label("0"))
    with pytest.raises(ValueError) as err:
        LabelStore(path)
    assert str(err.value) == (f"{log}:1: a decision without the `hash` of the pair it was about (written by an "
                              "earlier lrlhf): label the file again into a new --out folder")


def test_a_decision_after_a_skip_moves_to_the_end_also_when_replayed(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1, 2))
    store = LabelStore(path)
    store.decide("ann", "0", "skip")
    store.decide("ann", "1", "chosen")
    store.decide("ann", "2", "chosen")
    store.decide("ann", "0", "rejected")
    assert list(store.logs["ann"].decisions) == ["1", "2", "0"] and store.last("ann") == "0"
    again = LabelStore(path)
    assert list(again.logs["ann"].decisions) == ["1", "2", "0"] and again.last("ann") == "0"


def test_a_moved_decision_is_kept_under_its_new_key_and_said_at_once(tmp_path, monkeypatch):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1))
    store = LabelStore(path)
    logged = store.decide("ann", "0", "chosen", comment="first")
    write_rows(path, questions("new", 0, 1))  # a pair inserted at the top: question 0 is now item 1
    piped = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # stdout into a pipe: buffered unless flushed
    monkeypatch.setattr(sys, "stdout", piped)
    moved = LabelStore(path)
    log = moved.logs["ann"]
    assert piped.buffer.getvalue().decode("utf-8") == (
        f"lrlhf label: pairs.jsonl changed under {log.path}: 1 decision(s) found by their pair's content at another "
        "place, 0 about pairs the file no longer holds (kept in the log, used for nothing; their places are shown "
        "again)\n")
    assert (log.moved, log.gone) == (1, 0) and log.decisions == {"1": {**logged, "key": "1"}}
    assert moved.progress("ann") == (1, 3) and moved.current("ann").key == "0"


def test_an_undo_logged_before_the_file_changed_takes_back_the_moved_decision(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1))
    store = LabelStore(path)
    store.decide("ann", "0", "chosen")
    store.decide("ann", "1", "rejected")
    store.undo("ann", "1")
    write_rows(path, questions("new", 0, 1))  # question 0 -> item 1, question 1 -> item 2
    assert list(LabelStore(path).logs["ann"].decisions) == ["1"]


def test_an_undo_of_a_moved_decision_after_a_restart_is_replayed(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1))
    store = LabelStore(path)
    store.decide("ann", "0", "chosen")
    store.decide("ann", "1", "rejected")
    write_rows(path, questions("new", 0, 1))
    moved = LabelStore(path)
    assert list(moved.logs["ann"].decisions) == ["1", "2"]
    moved.undo("ann", "2")  # logged under the key it has now
    again = LabelStore(path)
    assert list(again.logs["ann"].decisions) == ["1"] and again.current("ann").key == "0"


def test_equal_pairs_take_the_moved_decisions_not_yet_taken(tmp_path):
    same = {"prompt": "question d", "chosen": "good d", "rejected": "bad d"}
    path = write_rows(tmp_path / "pairs.jsonl", [same, *questions("a"), {**same}])
    store = LabelStore(path)
    for key, choice in zip("012", ("tie", "chosen", "rejected"), strict=True):
        store.decide("ann", key, choice)
    write_rows(path, [same, {**same}])  # question a deleted: the two equal pairs are items 0 and 1
    moved = LabelStore(path)
    log = moved.logs["ann"]
    # logged 0 stays on item 0 (the same content there); logged 2 takes the equal pair not yet decided, item 1
    assert {k: e["choice"] for k, e in log.decisions.items()} == {"0": "tie", "gone:2": "chosen", "1": "rejected"}
    assert (log.moved, log.gone) == (1, 1) and moved.progress("ann") == (2, 2)
    assert [r["label"] for r in jsonl(moved.out)] == [0.5, 0.0]


# ---------------------------------------------------------------------------------------------- the store's bounds
def test_the_default_seed_is_zero_and_the_seed_sets_the_page_order(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(*range(16)))
    default, zero, one = LabelStore(path), LabelStore(path, seed=0), LabelStore(path, seed=1)
    coins = [[s.swapped("ann", str(i)) for i in range(16)] for s in (default, zero, one)]
    assert coins[0] == coins[1] != coins[2]


def test_a_check_can_come_first(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0))
    checks = write_rows(tmp_path / "checks.jsonl", questions("c"))
    store = LabelStore(path, checks=checks)
    firsts = {store.queue(name)[0] for name in "abcdefghijklmnop"}
    assert firsts == {"0", "check-0"}


def test_a_coin_of_exactly_one_half_keeps_chosen_on_the_left(tmp_path, monkeypatch):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0))
    store = LabelStore(path)

    class Half:
        def __init__(self, seed):
            self.seed = seed

        def random(self):
            return 0.5

    monkeypatch.setattr(store_module, "random", types.SimpleNamespace(Random=Half))
    assert store.swapped("ann", "0") is False


def test_the_budget_may_be_one_or_every_pair_but_not_zero(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1, 2))
    assert LabelStore(path, budget=1).budget == 1 and LabelStore(path, budget=3).budget == 3
    with pytest.raises(ValueError, match="budget must be between 1 and the 3 pairs of .*, got 0"):
        LabelStore(path, budget=0)


def test_the_logs_folder_is_named_after_the_labelled_file(tmp_path):
    path = write_rows(tmp_path / "round_2.to_label.jsonl", questions(0))
    assert LabelStore(path).log_dir == tmp_path / "round_2.labels"
    assert LabelStore(path, out_dir=tmp_path / "out").log_dir == tmp_path / "out" / "round_2.labels"
    (tmp_path / "pairs.labels").write_text("")  # a file where the folder would be: no logs to replay
    assert LabelStore(write_rows(tmp_path / "pairs.jsonl", questions(0))).logs == {}


def test_annotators_names_last_decisions_and_stale_actions(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1))
    store = LabelStore(path)
    for name in ("", None):
        with pytest.raises(ValueError, match="annotator name"):
            store.annotator(name)
    assert store.annotator("ann").name == "ann" and store.last("ann") is None
    with pytest.raises(StaleAction, match="^ann's last decision is not item 0$"):
        store.undo("ann", "0")
    with pytest.raises(StaleAction, match="^ann is not on item 1$"):
        store.decide("ann", "1", "chosen")
    with pytest.raises(ValueError) as err:
        store.decide("ann", "0", "maybe")
    assert str(err.value) == "choice must be one of left, right, chosen, rejected, tie, both_bad, skip; got 'maybe'"


def test_comments_default_to_empty_and_are_cut_to_2000_characters(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1))
    store = LabelStore(path)
    assert store.decide("ann", "0", "chosen")["comment"] == ""
    assert store.decide("ann", "1", "chosen", comment="x" * 2000 + "y")["comment"] == "x" * 2000
    assert [a["comment"] for r in jsonl(store.out) for a in r["annotations"]] == ["", "x" * 2000]


def test_an_undo_is_logged_with_who_and_when(tmp_path):
    path = write_rows(tmp_path / "pairs.jsonl", questions(0, 1))
    store = LabelStore(path)
    decided = store.decide("ann", "0", "chosen")
    store.undo("ann", "0")
    undo = jsonl(store.log_dir / "ann.jsonl")[-1]
    assert sorted(undo) == ["annotator", "event", "key", "t", "time"]
    assert (undo["event"], undo["key"], undo["annotator"]) == ("undo", "0", "ann")
    assert undo["t"] >= decided["t"] and undo["time"].endswith("+00:00") and isinstance(undo["t"], float)


# ---------------------------------------------------------------------------------------------- the text written
def test_logs_and_labelled_files_hold_the_text_as_written_in_utf8_whatever_the_locale(tmp_path, monkeypatch):
    real_open = open

    def latin1_locale_open(file, mode="r", buffering=-1, encoding=None, *args, **kwargs):
        if "b" not in mode and encoding is None:
            encoding = "latin-1"  # what open() picks without an encoding under a Latin-1 locale
        return real_open(file, mode, buffering, encoding, *args, **kwargs)

    monkeypatch.setattr(store_module, "open", latin1_locale_open, raising=False)
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"id": 0, "prompt": "Qu'en dis-tu ?", "chosen": "très bien", "rejected": "bof"},
                               ensure_ascii=False) + "\n" + json.dumps(questions(1)[0] | {"id": 1}) + "\n",
                    encoding="utf-8")
    store = LabelStore(path)
    store.decide("ann", "0", "chosen", comment="déjà vu ✓")
    store.decide("ann", "1", "rejected", comment="ok")
    log = (store.log_dir / "ann.jsonl").read_bytes().decode("utf-8")
    assert '"comment": "déjà vu ✓"' in log
    labelled = store.out.read_bytes().decode("utf-8")
    assert '"chosen": "très bien"' in labelled and '"comment": "déjà vu ✓"' in labelled
    export = tmp_path / "export.jsonl"
    assert store.export(export) == 2
    text = export.read_bytes().decode("utf-8")
    assert '"comment": "déjà vu ✓"' in text and text.count("\n") == 2
    assert [(r["id"], r["label"]) for r in jsonl(export)] == [(0, 1.0), (1, 0.0)]
