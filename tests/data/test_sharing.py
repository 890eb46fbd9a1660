"""data.prefix_sharing: the layout PreferenceDataModule batches in, decided on the training split's measured share."""

import pytest

from lrlhf.data.datamodules import PreferenceDataModule
from lrlhf.data.records import PreferencePair, Ranking
from lrlhf.data.shared_batches import AUTO_MIN_SHARE


def msg(role, content):
    return {"role": role, "content": content}


def _pairs(prompt_words: str, answer_words: str, n=4):
    prompt = [msg("user", prompt_words)]
    # the answers differ from their first word on: the shared prefix is the prompt
    return [PreferencePair(prompt, [msg("assistant", answer_words)], [msg("assistant", "bye " + answer_words)])
            for _ in range(n)]


LONG_PROMPT = "what is two plus three how are you hi hello"  # 15 tokens of prompt, 2-3 of answer
LONG_ANSWERS = " ".join(["fine thanks"] * 12)  # 6 tokens of prompt, 25-26 of answer


def test_auto_shares_where_prompts_are_a_large_share_of_the_tokens(chatml):
    shared = PreferenceDataModule(chatml, train=_pairs(LONG_PROMPT, "ok"), batch_size=4, max_length=64)
    batch = next(iter(shared.train_dataloader()))
    assert shared.prefix_shares["train"] >= AUTO_MIN_SHARE and shared.shares_prefixes
    assert batch["input_ids"].shape[0] == 4 and "segment_ids" in batch and "attention_mask" not in batch
    assert shared.reports["train"]["prefix_share"] == shared.prefix_shares["train"]

    padded = PreferenceDataModule(chatml, train=_pairs("hi", LONG_ANSWERS), batch_size=4, max_length=64)
    batch = next(iter(padded.train_dataloader()))
    assert padded.prefix_shares["train"] < AUTO_MIN_SHARE and not padded.shares_prefixes
    assert batch["input_ids"].shape[0] == 8 and "attention_mask" in batch


def test_the_training_split_decides_every_split(chatml):
    dm = PreferenceDataModule(chatml, train=_pairs("hi", LONG_ANSWERS), val=_pairs(LONG_PROMPT, "ok"), batch_size=4,
                              max_length=64)
    dm.setup("fit")
    assert dm.prefix_shares["val"] >= AUTO_MIN_SHARE > dm.prefix_shares["train"]
    assert "attention_mask" in next(iter(dm.val_dataloader()))  # one layout for the run: the training split's


@pytest.mark.parametrize(("setting", "shared"), [(True, True), (False, False)])
def test_true_and_false_force_the_layout(chatml, setting, shared):
    for records in (_pairs(LONG_PROMPT, "ok"), _pairs("hi", LONG_ANSWERS)):
        dm = PreferenceDataModule(chatml, train=records, batch_size=4, max_length=64, prefix_sharing=setting)
        assert ("segment_ids" in next(iter(dm.train_dataloader()))) is shared


def test_rankings_share_too(chatml):
    ranking = Ranking([msg("user", LONG_PROMPT)], [[msg("assistant", w)] for w in ("a", "b", "c")], [1, 2, 3])
    dm = PreferenceDataModule(chatml, train=[ranking], batch_size=1, max_length=64)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 1 and batch["group"].tolist() == [0, 0, 0]
    assert batch["ranks"].tolist() == [1, 2, 3] and batch["lengths"].shape == (3,)


def test_bad_settings_name_the_key(chatml):
    with pytest.raises(ValueError, match="data.prefix_sharing='yes'; choose auto, true or false"):
        PreferenceDataModule(chatml, train=_pairs("hi", "ok"), prefix_sharing="yes")
    with pytest.raises(ValueError, match="data.prefix_sharing=true and data.packing=true"):
        PreferenceDataModule(chatml, train=_pairs("hi", "ok"), prefix_sharing=True, packing=True)
    packed = PreferenceDataModule(chatml, train=_pairs(LONG_PROMPT, "ok"), max_length=32, packing=True)
    packed.setup("fit")
    assert not packed.shares_prefixes and packed.prefix_shares == {}  # auto never shares packed rows


def test_auto_shares_from_the_threshold_on(chatml, monkeypatch):
    records = _pairs(LONG_PROMPT, "ok")
    dm = PreferenceDataModule(chatml, train=records, batch_size=4, max_length=64)
    dm.setup("fit")
    share = dm.prefix_shares["train"]
    monkeypatch.setattr("lrlhf.data.datamodules.AUTO_MIN_SHARE", share)
    assert dm.shares_prefixes  # a share equal to the threshold shares
    monkeypatch.setattr("lrlhf.data.datamodules.AUTO_MIN_SHARE", share + 1e-4)
    assert not dm.shares_prefixes
