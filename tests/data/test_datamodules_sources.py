"""Datamodules read sources with lrlhf.data.formats.load_records (stubbed: that module is not ours)."""

import sys
import types

from lrlhf.data.datamodules import SFTDataModule
from lrlhf.data.records import SFTExample
from lrlhf.data.tokenize import EncodeStats


def test_sources_go_through_load_records(chatml, monkeypatch):
    calls = []

    def load_records(source, kind, *, format="auto", split=None, **kw):
        calls.append((source, kind, format, split, kw))
        records = [SFTExample([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])]
        return records, EncodeStats(truncated=0, dropped={"duplicate": 2})

    monkeypatch.setitem(sys.modules, "lrlhf.data.formats", types.SimpleNamespace(load_records=load_records))
    dm = SFTDataModule(chatml, train="all.jsonl", val="all.jsonl", test="t.jsonl", format="messages",
                       load_kwargs={"seed": 3})
    dm.setup("fit")
    assert calls == [
        ("all.jsonl", "sft", "messages", "train", {"seed": 3}),
        ("all.jsonl", "sft", "messages", "val", {"seed": 3}),
        ("t.jsonl", "sft", "messages", None, {"seed": 3}),
    ]
    assert dm.stats["train"].dropped == {"duplicate": 2}  # the loader's summary keeps counting
