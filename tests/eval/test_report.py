"""Subgroup means, the worst subgroup, and the Markdown / CSV tables, on hand-made rows."""

import csv

import pytest

from lrlhf.eval.report import csv_table, markdown_table, subgroup_means, worst_subgroup, write_table


def test_worst_subgroup_by_hand():
    values, groups = [0.2, 0.9, 0.4, 0.6], ["sort", "count", "sort", "count"]
    assert subgroup_means(values, groups) == pytest.approx({"count": 0.75, "sort": 0.3}, abs=1e-12)
    assert worst_subgroup(values, groups) == ("sort", pytest.approx(0.3, abs=1e-12))
    assert worst_subgroup([0.5, 0.5], ["b", "a"]) == ("a", 0.5)  # equal means: the first name
    with pytest.raises(ValueError, match="one label per value"):
        subgroup_means([0.1], ["a", "b"])


ROWS = [{"policy": "sft", "gold": 0.12345, "ci": (0.1, 0.2), "note": None},
        {"policy": "a|b", "gold": 1.0, "ci": None, "note": "x"}]


def test_markdown_table_by_hand():
    assert markdown_table(ROWS) == (
        "| policy | gold | ci | note |\n"
        "|---|---|---|---|\n"
        "| sft | 0.123 | [0.100, 0.200] |  |\n"
        "| a\\|b | 1.000 |  | x |\n"
    )
    assert markdown_table(ROWS, ["gold"]).splitlines()[2] == "| 0.123 |"


def test_csv_table_splits_intervals_and_keeps_full_precision(tmp_path):
    assert csv_table(ROWS) == "policy,gold,ci_lo,ci_hi,note\nsft,0.12345,0.1,0.2,\na|b,1.0,,,x\n"
    md, path = write_table(ROWS, tmp_path / "t", ["policy"], csv_columns=["policy", "gold"])
    assert md.read_text() == "| policy |\n|---|\n| sft |\n| a\\|b |\n"
    rows = list(csv.DictReader(path.open()))
    assert rows == [{"policy": "sft", "gold": "0.12345"}, {"policy": "a|b", "gold": "1.0"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.md"]  # no temporary files left
