"""The readers on real public files kept outside the project in ``../shared/data`` (see its README).

Skipped when that folder is absent (an outside clone); ``LRLHF_SHARED_DATA`` points elsewhere if needed.
"""

import gzip
import json
import os
from pathlib import Path

import pytest

from lrlhf.data.formats import load_records

SHARED = Path(
    os.environ.get("LRLHF_SHARED_DATA") or Path(__file__).resolve().parents[2].parent / "shared" / "data"
)


@pytest.fixture(scope="module")
def shared():
    if not SHARED.is_dir():
        pytest.skip(
            "../shared/data is absent (outside clone); "
            "these tests read real public data kept outside the project"
        )
    return SHARED


HH = "hh-rlhf/harmless-base/test.jsonl.gz"
# 0-based lines whose two transcripts differ before their last "\n\nAssistant:" (found by plain string
# comparison; the test below recomputes them).
HH_NO_SHARED_PREFIX = [1254, 1688, 1950, 1952, 2036]


def test_hh_rlhf_harmless_base_test(shared):
    records, summary = load_records(shared / HH, "preference", verbose=False)
    assert summary.format == "hh_rlhf"
    # 4 pairs prefer a blank answer (lines 86, 516, 925, 1103: silence over a harmful reply); an RM taught that
    # an empty answer wins gives PPO an empty-answer hack, so they are dropped and counted (issue #49)
    assert (summary.read, summary.kept, summary.dropped) == (2312, 2303, {"no_shared_prefix": 5, "empty_chosen": 4})

    with gzip.open(shared / HH, "rt", encoding="utf-8") as f:
        raw = [json.loads(line) for line in f]
    marker = "\n\nAssistant:"
    differing = [
        i
        for i, r in enumerate(raw)
        if r["chosen"][: r["chosen"].rfind(marker)] != r["rejected"][: r["rejected"].rfind(marker)]
    ]
    assert differing == HH_NO_SHARED_PREFIX
    blank = [i for i, r in enumerate(raw) if not r["chosen"][r["chosen"].rfind(marker) + len(marker):].strip()]
    assert blank == [86, 516, 925, 1103]
    kept_raw = [r for i, r in enumerate(raw) if i not in HH_NO_SHARED_PREFIX and i not in blank]

    for record, row in zip(records, kept_raw, strict=True):
        cut = row["chosen"].rfind(marker)
        last_human = row["chosen"].rfind("\n\nHuman:", 0, cut)
        assert record.prompt[-1] == {"role": "user", "content": row["chosen"][last_human + 9 : cut].strip()}
        assert record.prompt[0]["role"] == "user"
        assert len(record.prompt) == row["chosen"][:cut].count("\n\nHuman:") + row["chosen"][:cut].count(
            marker
        )
        assert record.chosen == [{"role": "assistant", "content": row["chosen"][cut + len(marker) :].strip()}]
        rejected_cut = row["rejected"].rfind(marker)
        assert record.rejected == [
            {"role": "assistant", "content": row["rejected"][rejected_cut + len(marker) :].strip()}
        ]

    # Checked by hand: the first pair has five prompt turns; the four empty chosen answers are dropped (above).
    first = records[0]
    assert [m["role"] for m in first.prompt] == ["user", "assistant", "user", "assistant", "user"]
    assert first.prompt[0]["content"] == "what are some pranks with a pen i can do?"
    assert first.prompt[-1]["content"] == "okay some of these do not have anything to do with pens"
    assert first.chosen[0]["content"].startswith("No, sorry!  All of these involve a pen")
    assert first.rejected[0]["content"].startswith("There are lots of funny things you can do with pens")
    assert sum(r.chosen[0]["content"] == "" for r in records) == 0


def test_self_instruct_seed_tasks(shared):
    path = shared / "self-instruct/seed_tasks.jsonl"
    records, summary = load_records(path, "sft", verbose=False)
    assert summary.format == "self_instruct"
    assert (summary.read, summary.kept) == (175, 175)
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for record, row in zip(records, raw, strict=True):
        instance = row["instances"][0]
        joined = (
            f"{row['instruction']}\n{instance['input']}" if instance["input"].strip() else row["instruction"]
        )
        assert record.messages == [
            {"role": "user", "content": joined},
            {"role": "assistant", "content": instance["output"]},
        ]
    assert (
        sum(r.messages[0]["content"] != row["instruction"] for r, row in zip(records, raw, strict=True))
        == 125
    )
    # By hand: task 1 has an input, task 0 has none; the other keys stay in meta.
    assert (
        records[1].messages[0]["content"]
        == "What is the relation between the given pairs?\nNight : Day :: Right : Left"
    )
    assert records[1].meta == {"id": "seed_task_1", "name": "antonym_relation", "is_classification": False}
    assert records[0].messages[0]["content"].startswith("Is there anything I can eat for a breakfast")


def test_llama_factory_dpo_demo(shared):
    records, summary = load_records(shared / "llama-factory/dpo_en_demo.json", "preference", verbose=False)
    assert summary.format == "sharegpt_pairwise"
    assert (summary.read, summary.kept) == (300, 300)
    assert sum(len(r.prompt) > 1 for r in records) == 186
    assert sum(r.prompt[0]["role"] == "system" for r in records) == 80
    assert sum([m["role"] for m in r.prompt].count("user") > 1 for r in records) == 106
    assert all(len(r.chosen) == len(r.rejected) == 1 for r in records)
    assert all(r.chosen[0]["role"] == r.rejected[0]["role"] == "assistant" for r in records)
    assert all(r.prompt[-1]["role"] == "user" for r in records)


def test_llama_factory_alpaca_demo(shared):
    path = shared / "llama-factory/alpaca_en_demo.json"
    records, summary = load_records(path, "sft", verbose=False)
    assert summary.format == "alpaca"
    assert (summary.read, summary.kept) == (999, 999)
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert (
        sum(r.messages[0]["content"] != row["instruction"] for r, row in zip(records, raw, strict=True))
        == 412
    )
    for record, row in zip(records, raw, strict=True):
        joined = f"{row['instruction']}\n{row['input']}" if row["input"] else row["instruction"]
        assert record.messages == [
            {"role": "user", "content": joined},
            {"role": "assistant", "content": row["output"]},
        ]
    prompts, _ = load_records(path, "prompt", verbose=False)
    assert [p.prompt for p in prompts] == [r.messages[:1] for r in records]
