"""Local files of every supported kind, a `datasets` source, and malformed JSON naming file and line."""

import gzip
import json

import pytest

from lrlhf.data.format_errors import DataFormatError
from lrlhf.data.formats import load_records

ROWS = [{"prompt": "one", "completion": "1"}, {"prompt": "two", "completion": "2"}]
EXPECTED = [
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "1"}],
    [{"role": "user", "content": "two"}, {"role": "assistant", "content": "2"}],
]


def messages_of(path, **kwargs):
    records, summary = load_records(path, "sft", verbose=False, **kwargs)
    return [r.messages for r in records], summary


def test_json_list(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(ROWS, indent=2), encoding="utf-8")
    messages, summary = messages_of(path)
    assert messages == EXPECTED and summary.source == "rows.json"


def test_json_file_holding_json_lines(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n", encoding="utf-8")  # blank lines skipped
    assert messages_of(path)[0] == EXPECTED


def test_jsonl_gz(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    assert messages_of(path)[0] == EXPECTED


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    assert messages_of(path)[0] == EXPECTED


def test_datasets_source_gets_split_and_data_files(tmp_path):
    pytest.importorskip("datasets")
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    messages, summary = messages_of(
        "json", data_files=str(path), split="train", cache_dir=str(tmp_path / "c")
    )
    assert messages == EXPECTED and summary.source == "json"


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + '{"prompt": "x", "completion": }\n', encoding="utf-8")
    with pytest.raises(DataFormatError) as error:
        messages_of(path)
    assert str(error.value) == f"{path}:3: line 3 is not valid JSON (Expecting value, column 31)"


def test_malformed_json_list_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"prompt": "x",\n   "completion" "y"}\n]', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"bad\.json:3: not valid JSON \(Expecting ':' delimiter"):
        messages_of(path)


def test_a_record_that_is_not_an_object_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"prompt": "x", "completion": "y"}, ["x", "y"]]', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"bad\.json\[1\]: expected a JSON object per record, got list"):
        messages_of(path)


def test_missing_local_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.jsonl does not exist"):
        messages_of(tmp_path / "nothere.jsonl")


@pytest.mark.parametrize("name", ["bad.jsonl", "bad.json", "bad.jsonl.gz"])
def test_a_byte_that_is_not_utf8_names_file_line_and_column(tmp_path, name):
    # "é" before the bad byte: the column counts characters (like JSON's), not bytes
    data = (json.dumps(ROWS[0]) + "\n").encode() + b'{"prompt": "\xc3\xa9\xff", "completion": "y"}\n'
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(DataFormatError) as error:
        messages_of(path)
    assert str(error.value) == f"{path}:2: not valid UTF-8 (byte 0xff at column 14); save the file as UTF-8"
    assert isinstance(error.value.__cause__, UnicodeDecodeError)


def test_a_json_list_with_a_bad_byte_names_its_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'[\n  {"prompt": "x", "completion": "y"},\n  {"prompt": "\xff"}\n]')
    with pytest.raises(DataFormatError, match=r"bad\.json:3: not valid UTF-8 \(byte 0xff at column 15\)"):
        messages_of(path)


def test_a_corrupt_gzip_file_is_named(tmp_path):
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps(ROWS[0]).encode())[:-12])  # truncated
    with pytest.raises(DataFormatError, match=r"bad\.jsonl\.gz: not a readable gzip file \("):
        messages_of(path)


def test_json_lines_split_on_newlines_only(tmp_path):
    # U+2028, U+0085 and a form feed may stand raw inside a JSON string (json.dumps(ensure_ascii=False) writes
    # them so); str.splitlines() would cut the record there. CRLF line ends still work.
    rows = [{"prompt": "a\u2028b\x85c\x0cd", "completion": "1"}, ROWS[1]]
    path = tmp_path / "data.jsonl"
    path.write_bytes("\r\n".join(json.dumps(row, ensure_ascii=False) for row in rows).encode())
    messages, _ = messages_of(path)
    assert messages[0][0]["content"] == "a\u2028b\x85c\x0cd" and messages[1] == EXPECTED[1]
