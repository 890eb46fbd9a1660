"""StopOnSignal: SIGTERM mid-rollout stops at the rollout's end with a checkpoint that resumes bitwise; a second
SIGINT stops at once; the message names the command that resumes."""

import os
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lrlhf.callbacks import ResumableCheckpoint, StopOnSignal, TrainingStopped
from lrlhf.functional import AdaptiveKLController

from .conftest import LinearValidated, linear_data, make_data, make_module, make_trainer

pytestmark = pytest.mark.filterwarnings("error::DeprecationWarning:lrlhf", "error::FutureWarning:lrlhf")


class SignalAt(Callback):
    """Sends ``signals`` to this process at the start of the rollout after ``rollouts`` were done (mid-rollout
    for the stop: the flag is set before the rollout's work)."""

    def __init__(self, rollouts: int, *signals: int):
        self.rollouts, self.signals = rollouts, signals

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.rollouts_done == self.rollouts:
            for signum in self.signals:
                os.kill(os.getpid(), signum)


def _fit(world, tokenizer, root, rollouts, *extra, ckpt_path=None):
    module = make_module(world, tokenizer, kl_controller=AdaptiveKLController(0.1, target=0.5, horizon=20.0))
    callbacks = [*extra, StopOnSignal(stage="ppo"),
                 ResumableCheckpoint(dirpath=root / "ckpt", every_n_rollouts=100)]  # no periodic save here
    trainer = make_trainer(root, rollouts, module, callbacks)
    trainer.fit(module, datamodule=make_data(world, tokenizer), ckpt_path=ckpt_path)
    return module, trainer


def _adapters(module):
    return {n: p.detach().clone() for n, p in module.model.named_parameters() if "lora_" in n}


def test_sigterm_stops_at_the_rollout_end_with_a_checkpoint_and_resumes_bitwise(world, tokenizer, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    straight, _ = _fit(world, tokenizer, tmp_path / "straight", 4)

    with pytest.raises(TrainingStopped) as stopped:
        _fit(world, tokenizer, tmp_path / "split", 4, SignalAt(1, signal.SIGTERM))
    stop = stopped.value
    assert stop.code == 128 + signal.SIGTERM and stop.signal_name == "SIGTERM"
    assert (stop.unit, stop.done, stop.resume_key) == ("rollout", 2, "last")  # rollout 2 was finished, not cut
    folder = tmp_path / "split" / "ckpt"
    assert stop.checkpoint == folder / "rollout=000002.ckpt"
    assert (folder / "last.ckpt").resolve().name == "rollout=000002.ckpt"
    assert torch.load(folder / "last.ckpt", weights_only=True)["lrlhf"]["rollouts_done"] == 2
    assert signal.getsignal(signal.SIGTERM) == before  # handlers put back (ours, then Lightning's)

    resumed, trainer = _fit(world, tokenizer, tmp_path / "split", 4, ckpt_path="last")
    assert resumed.rollouts_done == 4 and not trainer.received_sigterm
    a, b = _adapters(straight), _adapters(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class SignalAtTrainStart(Callback):
    """SIGTERM as training starts, before StopOnSignal (the last callback) installs its handlers: Lightning's own
    handler catches it, as one during the fit's setup (a PPO run's reward calibration)."""

    def on_train_start(self, trainer, pl_module):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_caught_before_training_starts_stops_at_the_first_rollout_end_saying_how_to_resume(
        world, tokenizer, tmp_path):
    # Lightning's flag, left set, made its loop raise SIGTERMException (a SystemExit with no status: exit 0, no
    # message) after the first rollout's checkpoint and before last.ckpt pointed at it
    with pytest.raises(TrainingStopped) as stopped:
        _fit(world, tokenizer, tmp_path / "early", 3, SignalAtTrainStart())
    stop = stopped.value
    assert stop.code == 128 + signal.SIGTERM and (stop.unit, stop.done) == ("rollout", 1)
    folder = tmp_path / "early" / "ckpt"
    assert (folder / "last.ckpt").resolve().name == "rollout=000001.ckpt"


def test_a_second_sigint_stops_at_once_without_a_checkpoint(world, tokenizer, tmp_path):
    before = signal.getsignal(signal.SIGINT)
    try:
        # Lightning answers KeyboardInterrupt with a shutdown and sys.exit(1)
        with pytest.raises(SystemExit) as stopped:
            _fit(world, tokenizer, tmp_path, 4, SignalAt(1, signal.SIGINT, signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, before)  # Lightning leaves SIGINT ignored after its shutdown
    assert not isinstance(stopped.value, TrainingStopped) and stopped.value.code == 1
    assert not (tmp_path / "ckpt").exists()


def test_the_message_gives_the_command_that_resumes(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "rollout=000007.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.touch()
    stop = TrainingStopped(signal.SIGTERM, "ppo", "rollout", 7, ckpt, str(tmp_path / "run"), "last", True)
    args = ["recipe=ppo_lora", "hydra.run.dir=old", "ckpt_path=null", "stage_overrides.sft=[\"a=1\"]"]
    text = stop.message(args)
    assert f"stopped on SIGTERM after rollout 7 of the `ppo` stage; checkpoint: {ckpt}" in text
    assert text.splitlines()[-1] == (f"  python train.py recipe=ppo_lora 'stage_overrides.sft=[\"a=1\"]' "
                                     f"hydra.run.dir={tmp_path / 'run'} ckpt_path=last")
    # a needed stage stopped mid-build: its folder was removed, the same command builds it again
    gone = TrainingStopped(signal.SIGINT, "sft", "step", 3, Path(tmp_path / "gone.ckpt"), "x", "last", True)
    assert gone.code == 130
    assert "builds it again from its start" in gone.message(["recipe=ppo_lora"])
    assert gone.message(["recipe=ppo_lora"]).splitlines()[-1] == "  python train.py recipe=ppo_lora"
    assert gone.message(["recipe=ppo_lora"], "lrlhf train").splitlines()[-1] == "  lrlhf train recipe=ppo_lora"


class BatchSignal(Callback):
    def __init__(self, batch_idx: int):
        self.batch_idx = batch_idx

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.batch_idx:
            os.kill(os.getpid(), signal.SIGTERM)


def test_steps_stop_after_an_optimiser_step_into_last_which_ckpt_path_last_resumes(tmp_path):
    """SFT / RM / DPO with a plain ModelCheckpoint: the stop waits for the optimiser step (never mid gradient
    accumulation) and writes ``last.ckpt`` in the checkpoint's folder."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    def trainer(*extra):
        return pl.Trainer(accelerator="cpu", max_steps=4, accumulate_grad_batches=2, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                          limit_val_batches=0, callbacks=[*extra, StopOnSignal(stage="sft"), ModelCheckpoint(
                              dirpath=tmp_path / "checkpoints", save_last=True, save_top_k=0)])

    with pytest.raises(TrainingStopped) as stopped:
        trainer(BatchSignal(2)).fit(BoringModel())  # batch 2 accumulates; batch 3 steps (optimiser step 2)
    stop = stopped.value
    assert (stop.unit, stop.done, stop.resume_key) == ("step", 2, "last")
    assert stop.checkpoint == tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(stop.checkpoint, weights_only=False)["global_step"] == 2
    resumed = trainer()
    resumed.fit(BoringModel(), ckpt_path="last")
    assert resumed.global_step == 4


def _fit_logged(root, *extra, ckpt_path=None):
    import lightning.pytorch as pl

    from lrlhf.callbacks import ResumableCSVLogger

    data = linear_data()
    trainer = pl.Trainer(max_steps=5, val_check_interval=2, check_val_every_n_epoch=None, num_sanity_val_steps=0,
                         logger=ResumableCSVLogger(root, name="", version=""), log_every_n_steps=1,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[*extra, StopOnSignal(stage="sft"),
                                    ResumableCheckpoint(dirpath=root / "ckpt", every_n_rollouts=100)])
    trainer.fit(LinearValidated(), data, data, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("signalled_at", [1, 2, 4], ids=["validating-step", "plain-step", "last-step"])
def test_a_stopped_and_resumed_run_logs_every_row_of_an_uninterrupted_one(tmp_path, signalled_at):
    """Lightning logs a step's metrics row after the batch-end hooks: the stop raised there lost the row of the
    step it stopped after (found by the kill soak's SIGTERM reading). The stop now raises once the row is logged,
    after the validation of a step that ends in one."""
    import csv

    def rows(root):
        with open(root / "metrics.csv") as f:
            return sorted(tuple(sorted((k, v) for k, v in row.items() if v != "")) for row in csv.DictReader(f))

    _fit_logged(tmp_path / "straight")
    with pytest.raises(TrainingStopped) as stopped:
        _fit_logged(tmp_path / "split", BatchSignal(signalled_at))
    assert (stopped.value.unit, stopped.value.done) == ("step", signalled_at + 1)
    assert os.readlink(tmp_path / "split" / "ckpt" / "last.ckpt") == f"rollout={signalled_at + 1:06d}.ckpt"
    logged = rows(tmp_path / "split")
    assert sum(("step", str(signalled_at)) in row for row in logged) >= 1  # its row, before the stop
    _fit_logged(tmp_path / "split", ckpt_path="last")
    assert rows(tmp_path / "split") == rows(tmp_path / "straight")
