"""The summary of counts: kept arithmetic, the one-screen table, the flat dict for loggers."""

from lrlhf.data.summary import DataSummary


def test_kept_is_read_minus_drops_and_the_table_shows_each_reason():
    summary = DataSummary(source="test.jsonl.gz", kind="preference", format="hh_rlhf", read=2312)
    summary.drop("no_shared_prefix", 5)
    summary.drop("identical_chosen_rejected")
    summary.drop("identical_chosen_rejected")
    summary.truncated = 3
    assert summary.kept == 2305
    # Labels padded to the widest ("  dropped: identical_chosen_rejected", 36), counts right-aligned in 9.
    assert str(summary) == (
        "data summary: test.jsonl.gz (preference, format hh_rlhf)\n"
        "  read                                      2,312\n"
        "    dropped: no_shared_prefix                   5\n"
        "    dropped: identical_chosen_rejected          2\n"
        "  kept                                      2,305\n"
        "  truncated                                     3"
    )
    assert summary.as_dict() == {
        "source": "test.jsonl.gz",
        "kind": "preference",
        "format": "hh_rlhf",
        "read": 2312,
        "kept": 2305,
        "truncated": 3,
        "dropped/no_shared_prefix": 5,
        "dropped/identical_chosen_rejected": 2,
    }
