"""The toy world flows through the public data path: load_records, tokenisation, datamodules, gold utility."""

import pytest
import torch

from lrlhf.data.datamodules import PreferenceDataModule, PromptDataModule, SFTDataModule
from lrlhf.data.formats import load_records
from lrlhf.data.records import PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.toy import build_world, gold_utility


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("toy"), seed=0)


@pytest.mark.parametrize(
    "name, kind, fmt, cls",
    [
        ("sft_train", "sft", "messages", SFTExample),
        ("pref_train", "preference", "pairwise", PreferencePair),
        ("rank_val", "ranking", "ranking", Ranking),
        ("rl_prompts", "prompt", "prompt", PromptExample),
        ("eval_prompts", "prompt", "prompt", PromptExample),
    ],
)
def test_every_file_loads_through_load_records(world, name, kind, fmt, cls):
    path = getattr(world, name)
    records, summary = load_records(str(path), kind, verbose=False)
    n_lines = len(path.read_text().splitlines())
    assert summary.format == fmt and summary.read == n_lines
    assert all(isinstance(r, cls) for r in records)
    assert all("task" in r.meta for r in records)
    if kind == "preference":
        assert {r.target for r in records} <= {1.0, 0.5} and any(r.target == 0.5 for r in records)


def test_datamodules_on_the_toy_world(world):
    sft = SFTDataModule(str(world.tokenizer), train=str(world.sft_train), batch_size=4, max_length=64)
    sft.setup("fit")
    batch = next(iter(sft.train_dataloader()))
    tok = sft.tokenizer
    eos = tok.eos_token_id
    for row, mask in zip(batch["input_ids"], batch["loss_mask"], strict=True):
        target = row[mask].tolist()
        assert target[-1] == eos  # the assistant target ends with the end-of-turn EOS
        assert eos not in target[:-1]
    assert sft.stats["train"].truncated == 0

    pref = PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), batch_size=4, max_length=96)
    pref.setup("fit")
    pair_batch = next(iter(pref.train_dataloader()))
    # the toy prompts are about a third of a pair's tokens: prefix sharing is on (one row per pair)
    assert pref.shares_prefixes and pref.prefix_shares["train"] > 0.2
    assert pair_batch["input_ids"].shape[0] == 4 and pair_batch["lengths"].shape == (8,)
    assert pair_batch["pair_targets"].shape == (4,)

    prompts = PromptDataModule(str(world.tokenizer), train=str(world.rl_prompts), batch_size=4, max_length=64)
    prompts.setup("fit")
    prompt_batch = next(iter(prompts.train_dataloader()))
    ids = prompt_batch["input_ids"]
    assert (ids[:, -1] != tok.pad_token_id).all()  # left-padded for generation
    # the gold utility reads the task from the prompt's meta: the ideal answer scores 1
    meta = prompt_batch["meta"][0]
    items = meta["task"]["items"]
    ideal = " ".join(map(str, sorted(items))) if meta["task"]["kind"] == "sort" else str(len(items))
    assert gold_utility(meta["task"], ideal) == pytest.approx(1.0)
    assert torch.equal(prompt_batch["attention_mask"].sum(1) > 0, torch.ones(4, dtype=torch.bool))


def test_model_folder_loads_like_a_hub_checkpoint(world):
    from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer

    cfg = ModelConfig(str(world.model))
    tokenizer = load_tokenizer(cfg)
    model = load_causal_lm(cfg)
    assert tokenizer.chat_template and tokenizer.eos_token_id is not None
    assert model.config.vocab_size == len(tokenizer)
