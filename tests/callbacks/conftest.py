"""A tiny deterministic PPO run on the toy world (the shape of tests/modules/test_ppo.py)."""

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lrlhf.data.datamodules import PromptDataModule
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.functional import FixedKLController
from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
from lrlhf.modules import PPOConfig, PPOModule
from lrlhf.modules.critic import ValueAdapter

BATCH = 4


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=4, sft_val=4, pref_train=2, pref_val=2, pref_test=2, rl=12, eval=6)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


@pytest.fixture(scope="session")
def tokenizer(world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(world.tokenizer)


def make_data(world, tokenizer, batch_size=BATCH):
    return PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=batch_size, max_length=64, seed=3)


def make_module(world, tokenizer, cls=PPOModule, kl_controller=None, **overrides):
    """The base and the reward model loaded from the world's folder (a reward model with a random head); a
    ``value`` adapter critic; ``kl_controller`` (default a fixed beta 0.1); ``overrides`` of the PPOConfig."""
    config = dict(max_new_tokens=6, ppo_epochs=1, minibatch_size=2, forward_batch_size=4, lr=5e-2,
                  policy_lora=LoraSpec(r=2))
    config.update(overrides)
    torch.manual_seed(0)
    reward = ScalarModel(load_causal_lm(ModelConfig(str(world.model))))
    return cls(ModelConfig(str(world.model)), reward, tokenizer, PPOConfig(**config),
               critic=ValueAdapter(LoraSpec(r=2)), kl_controller=kl_controller or FixedKLController(0.1))


def make_trainer(tmp_path, rollouts, module, callbacks=(), **kw):
    """``rollouts`` Trainer batches, bounded by ``max_steps`` (one batch = ``updates_per_rollout`` steps)."""
    return pl.Trainer(accelerator="cpu", max_epochs=-1, max_steps=rollouts * module.updates_per_rollout(BATCH),
                      logger=False, callbacks=list(callbacks),
                      enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, default_root_dir=tmp_path, **kw)


class LinearValidated(pl.LightningModule):
    """A linear model that logs its loss every step, for Trainers validating every few steps; ``fail_at`` makes the
    validation at that global step raise (a kill), ``die_after`` the end of that step's batch (after the callbacks'
    batch-end hooks, before Lightning logs the step's row)."""

    def __init__(self, fail_at=None, die_after=None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.fail_at, self.die_after = fail_at, die_after

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.global_step == self.die_after:
            raise RuntimeError("killed before the step's row was logged")

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        if self.trainer.global_step == self.fail_at:
            raise RuntimeError("killed during the validation")
        self.log("val/loss", self.layer(batch).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def linear_data():
    """16 equal rows in batches of 2: any order of batches trains alike, so a resumed run equals a straight one."""
    torch.manual_seed(0)
    return torch.utils.data.DataLoader(torch.randn(1, 4).repeat(16, 1), batch_size=2)
