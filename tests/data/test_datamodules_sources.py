"""Datamodules read sources with lrlhf.data.formats.load_records and split a shared source by prompt."""

from lrlhf.data.datamodules import SFTDataModule
from lrlhf.data.records import SFTExample
from lrlhf.data.splits import normalise_prompt, prompt_of
from lrlhf.data.writers import write_jsonl


def _example(i, answer="yes"):
    return SFTExample([{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": answer}])


def test_shared_source_is_split_by_prompt_and_separate_sources_used_whole(chatml, tmp_path):
    # 40 prompts, each twice with different answers: a prompt's two examples must land in the same split
    records = [_example(i, a) for i in range(40) for a in ("yes", "no")]
    write_jsonl(records, tmp_path / "all.jsonl")
    write_jsonl([_example(100 + i) for i in range(3)], tmp_path / "test.jsonl")
    dm = SFTDataModule(
        chatml,
        train=str(tmp_path / "all.jsonl"),
        val=str(tmp_path / "all.jsonl"),
        test=str(tmp_path / "test.jsonl"),
        split_fractions={"train": 0.7, "val": 0.3},
        seed=3,
    )
    dm.setup("fit")
    prompts = {}
    for split in ("train", "val"):
        source, _ = dm._records(split)
        prompts[split] = {normalise_prompt(prompt_of(r)) for r in source}
        assert len(source) == 2 * len(prompts[split])  # both examples of a prompt together
    assert not prompts["train"] & prompts["val"]
    assert len(prompts["train"]) + len(prompts["val"]) == 40
    assert len(prompts["val"]) > 0 and len(prompts["train"]) > len(prompts["val"])
    assert len(dm.datasets["test"]) == 3
    assert dm.stats["train"].read == 80  # the loader's summary, copied per split
    assert dm.stats["train"] is not dm.stats["val"]
