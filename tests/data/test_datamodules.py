"""DataModules on in-memory records: batches, counts, exact resume (also via a Lightning checkpoint), DDP."""

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from lrlhf.data.datamodules import PreferenceDataModule, PromptDataModule, SFTDataModule
from lrlhf.data.records import PreferencePair, PromptExample, Ranking, SFTExample

WORDS = "a b c d e f g h".split()


def msg(role, content):
    return {"role": role, "content": content}


def sft_records(n=10):
    # Example i: user says word i % 8 repeated (i % 3) + 1 times, the assistant answers "ok".
    return [
        SFTExample(messages=[msg("user", " ".join([WORDS[i % 8]] * (i % 3 + 1))), msg("assistant", "ok")])
        for i in range(n)
    ]


def first_words(batch, tok):
    """The user word of every row (identifies the example): token 2 of '<|im_start|> user w ...'."""
    return tok.convert_ids_to_tokens(batch["input_ids"][:, 2].tolist())


def test_sft_batches_and_stats(chatml):
    records = sft_records(10)
    records.append(SFTExample(messages=[msg("user", " ".join(WORDS * 3)), msg("assistant", "ok")]))  # 30 tok
    dm = SFTDataModule(chatml, train=records, val=records[:3], batch_size=4, max_length=16, truncation="drop")
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 10
    assert dm.stats["train"].dropped == {"too_long": 1} and dm.stats["train"].truncated == 0
    batches = list(dm.train_dataloader())
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4, 2]
    assert all(b["loss_mask"].sum().item() == 2 * b["input_ids"].shape[0] for b in batches)  # "ok <|im_end|>"
    val = list(dm.val_dataloader())
    assert first_words(val[0], chatml) == ["a", "b", "c"]  # validation is not shuffled


def test_empty_split_names_the_counts(chatml):
    dm = SFTDataModule(chatml, train=sft_records(3), max_length=4, truncation="drop")
    expected = r"train split is empty after encoding: 3 records, dropped \{'too_long': 3\}"
    with pytest.raises(ValueError, match=expected):
        dm.setup("fit")


def test_bad_config_names_the_key(chatml):
    with pytest.raises(ValueError, match="truncation='cut' is not supported; allowed values: left, drop"):
        SFTDataModule(chatml, train=sft_records(2), truncation="cut")
    with pytest.raises(ValueError, match="packing=True is not supported by PromptDataModule"):
        PromptDataModule(chatml, train=[], packing=True)


def _sequence(dm, n):
    """The next n training batches as lists of user words, crossing epochs (set_epoch as Lightning does)."""
    out = []
    loader = dm.train_dataloader()
    while len(out) < n:
        dm.train_sampler().set_epoch(dm.state_dict()["train_sampler"]["epoch"])
        for batch in loader:
            out.append(first_words(batch, dm.tokenizer))
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("consumed", [2, 3, 5])  # 10 examples, batch 4 -> 3 batches/epoch
def test_datamodule_resume_is_exact(chatml, consumed):
    def make():
        return SFTDataModule(chatml, train=sft_records(10), batch_size=4, max_length=32, seed=11)

    straight = _sequence(make(), 8)
    dm = make()
    head = _sequence(dm, consumed)
    state = dm.state_dict()
    resumed = make()
    resumed.load_state_dict(state)  # before any dataloader exists, as Lightning does
    assert head + _sequence(resumed, 8 - consumed) == straight


def test_ddp_shards_from_trainer_rank(chatml):
    seen = []
    for rank in range(2):
        dm = SFTDataModule(chatml, train=sft_records(10), batch_size=2, max_length=32, seed=2)
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        loader = dm.train_dataloader()
        assert loader.sampler.num_replicas == 2 and loader.sampler.rank == rank
        seen.append([i for i in loader.sampler])
    assert len(seen[0]) == len(seen[1]) == 5
    assert sorted(seen[0] + seen[1]) == list(range(10))


def test_lightning_keeps_our_sampler_under_ddp(chatml):
    """Lightning's own check (use_distributed_sampler=True, distributed run) leaves our loader alone."""
    from lightning.pytorch.trainer.connectors.data_connector import _DataConnector

    dm = SFTDataModule(chatml, train=sft_records(4), batch_size=2, max_length=32)
    dm.trainer = SimpleNamespace(world_size=2, global_rank=0)
    connector = SimpleNamespace(trainer=SimpleNamespace(
        _accelerator_connector=SimpleNamespace(use_distributed_sampler=True, is_distributed=True)
    ))
    assert _DataConnector._requires_distributed_sampler(connector, dm.train_dataloader()) is False
    plain = torch.utils.data.DataLoader([1, 2])
    assert _DataConnector._requires_distributed_sampler(connector, plain) is True


class _Recorder(pl.LightningModule):
    """Records the user words of each training batch; one dummy parameter to optimise."""

    def __init__(self, tokenizer):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer = tokenizer
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(first_words(batch, self.tokenizer))
        return (self.weight * batch["input_ids"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _trainer(tmp_path, max_steps, callbacks=()):
    return pl.Trainer(
        max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks), enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, limit_val_batches=0,
    )


@pytest.mark.slow
def test_lightning_checkpoint_resume_mid_epoch(chatml, tmp_path):
    """7 steps straight == resume from the step-4 checkpoint (3 batches per epoch: mid-epoch 1) for 3 more."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def make():
        return SFTDataModule(chatml, train=sft_records(10), batch_size=4, max_length=32, seed=5)

    straight = _Recorder(chatml)
    every_4 = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, filename="{step}")
    _trainer(tmp_path, 7, [every_4]).fit(straight, datamodule=make())
    ckpt = tmp_path / "step=4.ckpt"
    state = torch.load(ckpt, weights_only=False)["SFTDataModule"]["train_sampler"]
    assert (state["epoch"], state["position"]) == (1, 4)

    resumed = _Recorder(chatml)
    _trainer(tmp_path / "resumed", 7).fit(resumed, datamodule=make(), ckpt_path=ckpt)
    assert len(resumed.seen) == 3
    assert straight.seen[:4] + resumed.seen == straight.seen


def test_preference_pairs_rankings_and_packing(chatml):
    prompt = [msg("user", "hi")]
    pairs = [
        PreferencePair(prompt, [msg("assistant", "hello")], [msg("assistant", "bye")], target=1.0),
        PreferencePair(prompt, [msg("assistant", "ok")], [msg("assistant", "sure")], target=0.5),
    ]
    dm = PreferenceDataModule(chatml, train=pairs, batch_size=2, max_length=32, prefix_sharing=False)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 8)
    assert sorted(batch["pair_targets"].tolist()) == [0.5, 1.0]

    rankings = [Ranking(prompt, [[msg("assistant", w)] for w in ("a", "b", "c")], [1, 2, 2])]
    dm = PreferenceDataModule(chatml, train=rankings, batch_size=1, max_length=32, prefix_sharing=False)
    batch = next(iter(dm.train_dataloader()))
    assert batch["group"].tolist() == [0, 0, 0] and batch["ranks"].tolist() == [1, 2, 2]

    with pytest.raises(ValueError, match="train split mixes EncodedPair and EncodedRanking"):
        PreferenceDataModule(chatml, train=pairs + rankings, max_length=32).setup("fit")

    dm = PreferenceDataModule(chatml, train=pairs, batch_size=1, max_length=8, packing=True, pack_length=32)
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 1  # 4 sequences of 8 tokens share one 32-token row
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (1, 32) and "attention_mask" not in batch
    assert batch["chosen_end"][:, 1].tolist() in ([7, 23], [23, 7])


def test_sft_packing_rows(chatml):
    dm = SFTDataModule(chatml, train=sft_records(6), batch_size=2, max_length=20, packing=True)
    dm.setup("fit")
    # lengths 8, 9, 10, 8, 9, 10 -> first fit into 20: [8, 9], [10, 8], [9, 10]
    assert [[len(e.input_ids) for e in row] for row in dm.datasets["train"]] == [[8, 9], [10, 8], [9, 10]]
    batch = next(iter(dm.train_dataloader()))
    assert batch["position_ids"].shape == (2, 19)


def test_prompt_datamodule_left_pads(chatml):
    prompts = [PromptExample([msg("user", "a")], meta={"i": 0}),
               PromptExample([msg("user", "b c d")], meta={"i": 1})]
    dm = PromptDataModule(chatml, train=prompts, batch_size=2, max_length=32, seed=0)
    batch = next(iter(dm.train_dataloader()))
    short = [m["i"] for m in batch["meta"]].index(0)
    # "<|im_start|> user a <|im_end|> <|im_start|> assistant" (6) vs "... b c d ..." (8)
    assert batch["attention_mask"][short].tolist() == [0, 0] + [1] * 6
    tail = chatml.convert_ids_to_tokens(batch["input_ids"][short, -2:].tolist())
    assert tail == ["<|im_start|>", "assistant"]


def test_tokenizer_from_path(chatml, tmp_path):
    chatml.save_pretrained(tmp_path / "tok")
    dm = SFTDataModule(str(tmp_path / "tok"), train=sft_records(2), batch_size=2, max_length=32)
    batch = next(iter(dm.train_dataloader()))
    assert batch["loss_mask"].sum().item() == 4


def test_preference_datamodule_reads_a_ranking_file_by_path(chatml, tmp_path):
    import json

    path = tmp_path / "ranks.jsonl"
    rows = [{"prompt": "hi", "completions": ["a", "b", "c"], "ranks": [2, 1, 3]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    dm = PreferenceDataModule(chatml, train=str(path), batch_size=1, max_length=32)
    batch = next(iter(dm.train_dataloader()))
    assert batch["group"].tolist() == [0, 0, 0] and batch["ranks"].tolist() == [2, 1, 3]
    assert dm.stats["train"].kind == "ranking"


def test_special_token_text_policy_reaches_the_encoder(chatml):
    forged = SFTExample(messages=[msg("user", "hi <|im_end|>"), msg("assistant", "ok")])
    dm = SFTDataModule(chatml, train=sft_records(3) + [forged], batch_size=4, max_length=32)
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 3 and dm.stats["train"].dropped == {"special_token_in_content": 1}
    dm = SFTDataModule(chatml, train=[forged], batch_size=4, max_length=32, special_text="keep")
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 1
    with pytest.raises(ValueError, match="special_text"):
        SFTDataModule(chatml, train=[forged], special_text="escape")


def test_a_too_long_ranking_answer_is_removed_not_its_group_and_every_drop_is_reported(chatml, tmp_path, capsys):
    # issue #15: one answer over max_length dropped its whole group, and the printed summary said nothing
    import json

    path = tmp_path / "ranks.v1.jsonl"
    long_answer = " ".join(WORDS * 6)
    rows = [{"prompt": "hi", "completions": ["a", long_answer, "b", "c"], "ranks": [2, 1, 3, 4]},
            {"prompt": "yo", "completions": ["a", long_answer], "ranks": [2, 1]},  # one answer left: dropped
            {"prompt": "ok", "completions": ["a", "b"], "ranks": [1, 2]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    dm = PreferenceDataModule(chatml, train=str(path), batch_size=4, max_length=24)
    dm.setup("fit")
    assert [item.ranks for item in dm.datasets["train"]] == [[2, 3, 4], [1, 2]]
    assert dm.stats["train"].removed_answers == 1 and dm.stats["train"].dropped == {"too_long": 1}
    assert dm.reports["train"] == {
        "source": "ranks.v1.jsonl", "records": 3, "kept": 2, "dropped_reading": {},
        "dropped_encoding": {"too_long": 1}, "truncated": 0, "removed_answers": 1,
        # prompts of 6 tokens (<|im_start|> user hi <|im_end|> <|im_start|> assistant), answers of 2 (a <|im_end|>):
        # 3 + 2 sequences of 8 tokens = 40, of which (3 - 1) * 6 + (2 - 1) * 6 = 18 are a repeated prompt
        "prefix_share": 0.45}
    out = capsys.readouterr().out
    assert ("data train (ranks.v1.jsonl), encoded with max_length=24: 3 records -> 2 kept; dropped too_long 1; "
            "1 ranking answers removed as too long") in out


def test_max_eval_records_cuts_val_and_test_not_train(chatml):
    # #36 item 2: evaluation's fixed cost scales with a short run (hparams.<stage>.max_eval_records)
    dm = SFTDataModule(chatml, train=sft_records(10), val=sft_records(7), test=sft_records(5), batch_size=2,
                       max_length=32, max_eval_records=3)
    dm.setup("fit")
    assert {k: len(v) for k, v in dm.datasets.items()} == {"train": 10, "val": 3, "test": 3}
    assert dm.reports["val"]["records"] == 3
    with pytest.raises(ValueError, match=r"data.max_eval_records must be >= 1 or null \(all\), got 0"):
        SFTDataModule(chatml, train=sft_records(2), max_eval_records=0)
