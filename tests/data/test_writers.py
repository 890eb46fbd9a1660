"""Canonical writers: write -> load gives equal records; same records, same bytes; atomic replace."""

import json

import pytest

from lrlhf.data.formats import load_records
from lrlhf.data.records import PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.writers import dumps_line, write_jsonl

U = {"role": "user", "content": "Trie ces nombres : 3 1 2 — «vite»"}
A = {"role": "assistant", "content": "1 2 3"}
B = {"role": "assistant", "content": "3 2 1"}
S = {"role": "system", "content": "brief"}

CASES = {
    "sft": [SFTExample(messages=[S, U, A], meta={"id": 1}), SFTExample(messages=[U, A, U, B])],
    "preference": [
        PreferencePair(prompt=[U], chosen=[A], rejected=[B]),
        PreferencePair(prompt=[S, U], chosen=[A], rejected=[B], target=0.5, meta={"task": {"n": [3, 1, 2]}}),
        PreferencePair(prompt=[U], chosen=[A], rejected=[B], target=0.25),
    ],
    "ranking": [Ranking(prompt=[U], completions=[[A], [B], [A, U, B]], ranks=[1, 2, 2], meta={"k": 3})],
    "prompt": [
        PromptExample(prompt=[U], meta={"task": {"kind": "sort"}}),
        PromptExample(prompt=[S, U, A, U]),
    ],
}


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("name", ["out.jsonl", "out.jsonl.gz"])
def test_round_trip_gives_equal_records(tmp_path, kind, name):
    path = write_jsonl(CASES[kind], tmp_path / name)
    records, summary = load_records(path, kind, verbose=False)
    expected = [type(r)(**{**r.__dict__, "source": name}) for r in CASES[kind]]
    assert records == expected
    assert (
        summary.format
        == {"sft": "messages", "preference": "pairwise", "ranking": "ranking", "prompt": "prompt"}[kind]
    )


def test_bytes_are_deterministic_sorted_and_not_ascii_escaped(tmp_path):
    first = write_jsonl(CASES["preference"], tmp_path / "a.jsonl").read_bytes()
    second = write_jsonl(CASES["preference"], tmp_path / "b.jsonl").read_bytes()
    assert first == second
    assert (
        write_jsonl(CASES["preference"], tmp_path / "a.jsonl.gz").read_bytes()
        == write_jsonl(CASES["preference"], tmp_path / "b.jsonl.gz").read_bytes()
    )
    lines = first.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 4
    assert "«vite»" in lines[0]
    assert list(json.loads(lines[1])) == ["chosen", "prompt", "rejected", "target", "task"]
    assert "target" not in json.loads(lines[0])  # a hard label (1.0) is the default, not written


def test_canonical_line_for_a_prompt(tmp_path):
    line = dumps_line(
        PromptExample(prompt=[{"role": "user", "content": "hi"}], meta={"task": {"b": 1, "a": 2}})
    )
    assert line == '{"prompt": [{"content": "hi", "role": "user"}], "task": {"a": 2, "b": 1}}\n'


def test_meta_that_would_shadow_a_field_is_refused():
    with pytest.raises(ValueError, match=r"meta keys \['target'\] would shadow"):
        dumps_line(PreferencePair(prompt=[U], chosen=[A], rejected=[B], meta={"target": 0.1}))


def test_write_is_atomic_a_failure_leaves_the_old_file_and_no_temp(tmp_path):
    path = write_jsonl(CASES["sft"], tmp_path / "out.jsonl")
    before = path.read_bytes()
    bad = SFTExample(messages=[U, A], meta={"x": float("nan")})  # NaN is not JSON: the write must fail
    with pytest.raises(ValueError):
        write_jsonl([*CASES["sft"], bad], path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_a_failed_replace_removes_the_temp_file(tmp_path, monkeypatch):
    path = write_jsonl(CASES["sft"], tmp_path / "out.jsonl")
    before = path.read_bytes()

    def fail(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr("lrlhf.utils.io.os.replace", fail)
    with pytest.raises(OSError, match="disk gone"):
        write_jsonl(CASES["sft"][:1], path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
