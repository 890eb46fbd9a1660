"""RunProgressBar: PPO's bar counts rollouts i/N with an ETA, reward, KL and the held-out utility; other modules
count optimiser steps; never an epoch."""

import re
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest

from lrlhf.callbacks import HeldOutUtilityEarlyStopping, RunProgressBar, StopOnSignal, console_callbacks
from lrlhf.callbacks.progress import rollout_plan

from .conftest import BATCH, make_data, make_module

pytestmark = pytest.mark.filterwarnings("error::DeprecationWarning:lrlhf", "error::FutureWarning:lrlhf")


class RecordingBar(RunProgressBar):
    """Keeps the bar's text after each rollout."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.lines.append(str(self.train_progress_bar))


def test_ppo_line_shows_rollout_i_of_n_an_eta_reward_kl_and_held_out_utility(world, tokenizer, tmp_path, capsys):
    module = make_module(world, tokenizer)
    bar = RecordingBar(stage="ppo")
    stopper = HeldOutUtilityEarlyStopping(prompts=str(world.sft_val), every_n_rollouts=2, patience=None,
                                          n_samples=1, save_best=False, plot=False)
    steps = module.updates_per_rollout(BATCH)  # 2 optimiser steps per rollout: max_steps 6 = 3 rollouts
    trainer = pl.Trainer(accelerator="cpu", max_epochs=-1, max_steps=3 * steps, logger=False, callbacks=[
        bar, stopper], enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert len(bar.lines) == 3
    first = bar.lines[0]
    assert re.match(r"ppo rollout 1/3 \|.*\| ETA \d\d:\d\d \[\d\d:\d\d, .*(rollout/s|s/rollout)", first), first
    assert re.search(r"reward=-?\d+\.\d{3}, kl=-?\d+\.\d{3}, held-out=\d\.\d{3}@0\]$", first), first
    assert bar.lines[1].endswith("@2]")  # measured at rollout 2, before the bar's update (it runs after)
    out = capsys.readouterr().out
    assert "ppo rollout 3/3" in out and "Epoch" not in out and "/-" not in out


def test_the_rollout_total_follows_the_step_and_batch_bounds():
    def plan(max_steps, max_epochs, batches=4.0, done=0, step=0, seen=0, per_rollout=2):
        trainer = SimpleNamespace(max_steps=max_steps, max_epochs=max_epochs, global_step=step,
                                  num_training_batches=batches, datamodule=SimpleNamespace(batch_size=8),
                                  fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(total_batch_idx=seen - 1)))
        module = SimpleNamespace(rollouts_done=done, updates_per_rollout=lambda n: per_rollout)
        return rollout_plan(trainer, module)

    assert plan(max_steps=320, max_epochs=-1, per_rollout=4) == 80  # recipes/ppo_lora.yaml: 80 x 4 = 320
    assert plan(max_steps=3, max_epochs=-1) == 2  # ceil(3 / 2): the second rollout passes max_steps
    assert plan(max_steps=20, max_epochs=-1, done=3, step=6, seen=3) == 10  # 3 + ceil(14 / 2), e.g. resumed
    assert plan(max_steps=-1, max_epochs=2) == 8  # 2 epochs of 4 batches
    assert plan(max_steps=100, max_epochs=1, done=1, step=2, seen=1) == 4  # the epoch ends first
    assert plan(max_steps=-1, max_epochs=-1) is None  # unbounded: no total, no ETA


def test_steps_elsewhere_and_console_callbacks_respect_the_config():
    bar = RunProgressBar()
    trainer = SimpleNamespace(global_step=5, estimated_stepping_batches=200)
    assert bar.progress(trainer, SimpleNamespace()) == ("step", 5, 200)
    trainer.estimated_stepping_batches = float("inf")
    assert bar.progress(trainer, SimpleNamespace()) == ("step", 5, None)

    added = console_callbacks("sft", [])
    assert [type(c) for c in added] == [RunProgressBar, StopOnSignal] and added[0].stage == "sft"
    assert console_callbacks("sft", added) == []  # a bar and a stop are there already
    # trainer.enable_progress_bar=false: Lightning refuses a bar callback then
    assert [type(c) for c in console_callbacks("sft", [], progress_bar=False)] == [StopOnSignal]
