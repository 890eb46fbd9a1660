"""ResumableCheckpoint for the stages without rollouts (SFT, RM, DPO; ``callbacks/default.yaml``): a Trainer batch
is the unit; weights-only files; another lr or batch size refused; saves only after an optimiser step (never mid
gradient accumulation) and at the end of training; a resume equals an uninterrupted run, bitwise."""

import lightning.pytorch as pl
import pytest
import torch

from lrlhf.callbacks import ResumableCheckpoint
from lrlhf.data.datamodules import PreferenceDataModule, SFTDataModule
from lrlhf.models import LoraSpec, ModelConfig
from lrlhf.modules import DPOConfig, DPOModule, RewardConfig, RewardModule, SFTConfig, SFTModule

RUN_CONFIG = {"data": {"batch_size": 2}, "module": {"config": {"lr": 1e-2}}}  # what the CLI passes, in small


def make_module(stage, world, tokenizer, lr=1e-2):
    torch.manual_seed(0)
    model = ModelConfig(str(world.model))
    if stage == "sft":
        return SFTModule(model, tokenizer, SFTConfig(lr=lr, scheduler="constant"))
    if stage == "rm":
        return RewardModule(model, RewardConfig(lr=lr), tokenizer=tokenizer)
    return DPOModule(model, tokenizer, DPOConfig(lr=lr, scheduler="constant", lora=LoraSpec(r=2)))


def make_data(stage, world, tokenizer):
    if stage == "sft":
        return SFTDataModule(tokenizer, train=str(world.sft_train), batch_size=2, max_length=64, seed=3)
    return PreferenceDataModule(tokenizer, train=str(world.pref_train), batch_size=2, max_length=96, seed=3)


def fit(stage, world, tokenizer, root, steps, ckpt_path=None, lr=1e-2, config=RUN_CONFIG, accumulate=1, **kw):
    module = make_module(stage, world, tokenizer, lr=lr)
    callback = ResumableCheckpoint(dirpath=root / "ckpt", config=config, **kw)
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, callbacks=[callback],
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, default_root_dir=root, accumulate_grad_batches=accumulate)
    trainer.fit(module, datamodule=make_data(stage, world, tokenizer), ckpt_path=ckpt_path)
    return module, trainer


def trained(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("stage", ["sft", "rm", "dpo"])
def test_stage_checkpoints_load_weights_only_refuse_changes_and_resume_bitwise(stage, world, tokenizer, tmp_path):
    initial = make_module(stage, world, tokenizer)
    initial.configure_model()
    initial = trained(initial)
    straight, _ = fit(stage, world, tokenizer, tmp_path / "straight", 3)
    split = tmp_path / "split"
    fit(stage, world, tokenizer, split, 2, every_n_rollouts=1)
    folder = split / "ckpt"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "rollout=000001.ckpt", "rollout=000002.ckpt"]
    ckpt = torch.load(folder / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2 and ckpt["lrlhf"]["config"]["config"] == RUN_CONFIG

    section = {"sft": "sft", "rm": "reward", "dpo": "dpo"}[stage]
    with pytest.raises(ValueError, match=rf"config hparams.{section}.lr: checkpoint 0.01, this run 0.001"):
        fit(stage, world, tokenizer, split, 3, ckpt_path="last", lr=1e-3)
    other = {"data": {"batch_size": 4}, "module": RUN_CONFIG["module"]}
    with pytest.raises(ValueError, match=r"config config.data.batch_size: checkpoint 2, this run 4"):
        fit(stage, world, tokenizer, split, 3, ckpt_path="last", config=other)

    resumed, trainer = fit(stage, world, tokenizer, split, 3, ckpt_path="last")
    assert trainer.global_step == 3
    a, b = trained(straight), trained(resumed)
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    assert any(not torch.equal(a[k], initial[k]) for k in initial)  # it trained


def test_saves_only_after_an_optimiser_step_and_at_the_end(world, tokenizer, tmp_path):
    # 2 batches per optimiser step, a save due every 3 batches: batch 3 is mid-accumulation, saved after batch 4;
    # batch 6 ends a step; max_steps=4 ends training at batch 8 (not a multiple of 3): saved too
    fit("sft", world, tokenizer, tmp_path, 4, accumulate=2, every_n_rollouts=3, keep_last_k=5)
    folder = tmp_path / "ckpt"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["last.ckpt", "rollout=000004.ckpt", "rollout=000006.ckpt", "rollout=000008.ckpt"]
    assert [torch.load(folder / n, weights_only=True)["global_step"] for n in names[1:]] == [2, 3, 4]
    assert (folder / "last.ckpt").resolve().name == "rollout=000008.ckpt"

    fit("sft", world, tokenizer, tmp_path / "no_end", 2, every_n_rollouts=100, save_at_end=False)
    assert not (tmp_path / "no_end" / "ckpt").exists()
