"""A SIGTERM to a one-process launch outside training (lrlhf.utils.launch_signals): at once outside any Trainer run;
inside a Trainer that does not train (a stage's held-out loop), once its run ends, where Lightning lost it."""

import os
import signal
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from omegaconf import OmegaConf

from lrlhf.run import cli, training
from lrlhf.utils import launch_signals
from lrlhf.utils.launch_signals import Stopped


def test_outside_a_trainer_run_a_sigterm_stops_at_once_and_the_handler_is_put_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as stopped, launch_signals.handled():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # delivered to the main thread at its next bytecode
            pass
        pytest.fail("no stop")
    assert stopped.value.signum == signal.SIGTERM and str(stopped.value) == "SIGTERM"
    assert isinstance(stopped.value, SystemExit) and stopped.value.code == 143  # as a process SIGTERM ended
    assert signal.getsignal(signal.SIGTERM) is before
    with launch_signals.handled(enabled=False):
        assert signal.getsignal(signal.SIGTERM) is before  # a launch of several processes: untouched


class _SignalledOnTheLastBatch(pl.LightningModule):
    def __init__(self, batches: int):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.batches = batches
        self.seen = 0

    def validation_step(self, batch, batch_idx):
        self.seen += 1
        if batch_idx == self.batches - 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.layer(batch[0]).sum()


def test_a_sigterm_on_a_held_out_loop_s_last_batch_stops_the_launch_once_the_loop_ends(tmp_path):
    # reward_eval's evaluator: Lightning's own handler drops a SIGTERM taken on the last batch with its Trainer
    module = _SignalledOnTheLastBatch(batches=3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(6, 2)), batch_size=2)
    with launch_signals.handled():
        trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=str(tmp_path))
        trainer.validate(module, dataloaders=loader, verbose=False)  # the loop ran to its end, as in the launch
        assert module.seen == 3
        with pytest.raises(Stopped) as stopped:
            launch_signals.stop_if_signalled()
        assert stopped.value.signum == signal.SIGTERM
        launch_signals.stop_if_signalled()  # raised once
    launch_signals._pending = signal.SIGTERM
    with launch_signals.handled():
        launch_signals.stop_if_signalled()  # a new launch starts with nothing pending


class _SignalledWhileSetUp(_SignalledOnTheLastBatch):
    def configure_model(self):  # PPO loads its models here, before Lightning takes SIGTERM over
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_while_lightning_sets_a_run_up_exits_143_not_as_a_failure(tmp_path):
    # a KeyboardInterrupt there is Lightning's "graceful shutdown": sys.exit(1), and Ctrl+C ignored afterwards
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(6, 2)), batch_size=2)
    sigint = signal.getsignal(signal.SIGINT)
    with pytest.raises(Stopped) as stopped, launch_signals.handled():
        trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=str(tmp_path))
        trainer.validate(_SignalledWhileSetUp(batches=3), dataloaders=loader, verbose=False)
    assert stopped.value.code == 143 and signal.getsignal(signal.SIGINT) is sigint


def test_the_next_training_of_the_launch_takes_a_signal_a_held_out_loop_recorded_over():
    # a stage of several Trainers (an RM ensemble's members, iterative rounds): the next fit stops at its first
    # safe point with a checkpoint, not after training in full
    from lrlhf.callbacks import StopOnSignal

    trainer = type("Trainer", (), {"received_sigterm": False, "is_global_zero": True})()
    with launch_signals.handled():
        launch_signals._pending = signal.SIGTERM  # as Lightning's composed handler records it
        stop = StopOnSignal("rm")
        stop.on_train_start(trainer, None)
        stop._restore()
        assert stop.received == signal.SIGTERM
        launch_signals.stop_if_signalled()  # taken: not raised a second time
        quiet = StopOnSignal("rm")
        quiet.on_train_start(trainer, None)
        quiet._restore()
        assert quiet.received is None
    launch_signals._pending = signal.SIGTERM  # with no launch handler (several processes): nothing recorded counts
    assert launch_signals.take_pending() is None


def test_a_stage_signalled_in_its_test_loop_is_kept_in_the_cache_and_the_launch_stops(tmp_path, monkeypatch):
    out_dir = tmp_path / "cache" / "stages" / "rm-0123456789ab"
    dep = OmegaConf.create({"logger": None, "paths": {"run_dir": "x"}})

    def run_stage(cfg, building, final, overrides):  # the RM's held-out loop took a SIGTERM Lightning lost
        (building / "summary.json").write_text("{}")
        launch_signals._pending = signal.SIGTERM

    monkeypatch.setattr(cli, "run_stage", run_stage)
    monkeypatch.setattr(cli, "at_folder", lambda cfg, folder: cfg)
    with pytest.raises(Stopped), launch_signals.handled():
        cli._build_stage("rm", dep, out_dir, tmp_path / "run", [], True, "[1/2]")
    assert (out_dir / "summary.json").is_file()  # the next launch reuses it


@pytest.mark.parametrize("own", [True, False])
def test_a_policy_signalled_in_its_test_loop_stops_before_its_comparison_s_sampling(own, tmp_path, monkeypatch):
    # the launch's own policy: exported, then stopped; one built into the cache goes on to be built, then stops
    class Whole:
        policy_name, model, tokenizer = "ppo", None, None

        def finish(self, data, out_dir, trained):
            launch_signals._pending = signal.SIGTERM  # its held-out loop took a SIGTERM Lightning lost
            return {}

        def export_stage(self, folder: Path):
            (folder / "model").mkdir()
            return {}

    class Module:
        def stage_summary(self, trainer, out_dir):
            return {}

    sampled = []
    monkeypatch.setattr(training, "_whole", lambda cfg, module, trainer: Whole())
    monkeypatch.setattr("lrlhf.eval.compare_with_sft", lambda *a, **k: sampled.append(1) or {})
    monkeypatch.setattr(training, "model_config", lambda cfg: None)
    monkeypatch.setattr("lrlhf.models.load_causal_lm", lambda config: None)
    cfg = OmegaConf.create({"seed": 0, "eval": {"n_samples": 1, "prompts": [], "temperature": 1.0,
                                                 "max_new_tokens": 4}})
    trainer = type("T", (), {"callbacks": []})()
    with launch_signals.handled():
        if own:
            with pytest.raises(Stopped):
                training.finish_stage(cfg, Module(), object(), trainer, tmp_path, own=True)
            assert not sampled
        else:
            training.finish_stage(cfg, Module(), object(), trainer, tmp_path, own=False)
            assert sampled
            with pytest.raises(Stopped):  # _build_stage's check, once the stage is in the cache
                launch_signals.stop_if_signalled()
    assert (tmp_path / "model").is_dir()  # exported first: the run folder keeps the trained policy


@pytest.mark.parametrize(("devices", "processes", "one"), [(1, 1, True), ("auto", 1, True), (2, 1, False),
                                                           (1, 2, False)])
def test_only_a_one_process_one_device_launch_takes_sigterm_over(devices, processes, one, monkeypatch):
    monkeypatch.setattr("lrlhf.utils.distributed.launched_processes", lambda: processes)
    cfg = OmegaConf.create({"trainer": {"devices": devices, "accelerator": "cpu"}})
    assert cli._one_process(cfg) is one
