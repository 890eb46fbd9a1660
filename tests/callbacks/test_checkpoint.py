"""ResumableCheckpoint: N + M rollouts straight == N, stop, resume, M (bitwise); refusals; pruning."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lrlhf.callbacks import ResumableCheckpoint
from lrlhf.functional import AdaptiveKLController, FixedKLController
from lrlhf.modules import PPOModule
from lrlhf.modules.rm import RewardCalibration

from .conftest import LinearValidated, linear_data, make_data, make_module, make_trainer


class RecordSamples(PPOModule):
    """Keeps the sampled ids of every rollout."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sampled = []

    def make_rollout(self, batch):
        rollout = super().make_rollout(batch)
        self.sampled.append(rollout.response_ids.clone())
        return rollout


def _run(world, tokenizer, root, rollouts, ckpt_path=None, kl=True, keep_last_k=2, **ckpt_kw):
    controller = AdaptiveKLController(0.1, target=0.5, horizon=20.0) if kl else FixedKLController(0.1)
    module = make_module(world, tokenizer, cls=RecordSamples, kl_controller=controller)
    callbacks = [ResumableCheckpoint(dirpath=root / "ckpt", keep_last_k=keep_last_k, **ckpt_kw)]
    trainer = make_trainer(root, rollouts, module, callbacks)
    trainer.fit(module, datamodule=make_data(world, tokenizer), ckpt_path=ckpt_path)
    return module, trainer


def _trained(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" in n or n.startswith("critic.")}


@pytest.mark.parametrize("n, m", [(2, 3), (3, 2)], ids=["mid-epoch", "epoch-end"])
def test_straight_equals_stop_and_resume_bitwise(world, tokenizer, tmp_path, n, m):
    """n + m rollouts straight == n, stop, resume, m (3 batches per epoch: the resumed part crosses an epoch
    boundary; saved at an epoch's end, the new DataLoader iterator draws from the global RNG in between)."""
    straight, t_straight = _run(world, tokenizer, tmp_path / "straight", n + m)
    first, _ = _run(world, tokenizer, tmp_path / "split", n)
    ckpt = tmp_path / "split" / "ckpt" / "last.ckpt"
    assert ckpt.is_symlink() and ckpt.resolve().name == f"rollout={n:06d}.ckpt"
    resumed, t_resumed = _run(world, tokenizer, tmp_path / "split", n + m, ckpt_path="last")

    assert resumed.rollouts_done == n + m and t_resumed.global_step == t_straight.global_step
    assert len(resumed.sampled) == m
    for a, b in zip(straight.sampled, first.sampled + resumed.sampled, strict=True):
        assert torch.equal(a, b)  # sampled token ids
    assert resumed.kl_controller.value == straight.kl_controller.value  # beta, bitwise (python float)
    assert straight.kl_controller.value != 0.1  # the adaptive controller did move
    a, b = _trained(straight), _trained(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_a, opt_b = t_straight.optimizers[0].state_dict(), t_resumed.optimizers[0].state_dict()
    assert opt_a["param_groups"] == opt_b["param_groups"]
    for i, state in opt_a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, opt_b["state"][i][key]), (i, key)


def test_checkpoint_has_no_frozen_weights_and_loads_weights_only(world, tokenizer, tmp_path):
    module, trainer = _run(world, tokenizer, tmp_path, 3)
    folder = tmp_path / "ckpt"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "rollout=000002.ckpt", "rollout=000003.ckpt"]
    ckpt = torch.load(folder / "last.ckpt", weights_only=True)
    keys = set(ckpt["state_dict"])
    assert keys and all("lora_" in k or k.startswith("critic.head.") for k in keys)
    meta = ckpt["lrlhf"]
    assert {k.split(".")[0] for k in meta["frozen_keys"]} == {"model", "reward_model"}
    assert set(meta["frozen"]) == {"model", "reward_model"}
    assert meta["rollouts_done"] == 3 and meta["global_step"] == trainer.global_step
    assert {"torch", "lightning", "transformers", "peft", "lrlhf"} <= set(meta["versions"])
    assert ckpt["PromptDataModule"]["train_sampler"]["epoch"] == 1  # 3 batches = one whole epoch
    assert ckpt["kl_controller"] == {"value": module.kl_controller.value}  # beta, saved once: by the module
    assert not any("kl" in key.lower() for key in ckpt["callbacks"])


@pytest.mark.slow
def test_sigkill_mid_write_leaves_last_intact_and_resumable(world, tokenizer, tmp_path):
    """A child saves after rollouts 1 and 2, then is killed (SIGKILL) while writing the third checkpoint."""
    child = Path(__file__).with_name("sigkill_child.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    marker = tmp_path / "writing"
    proc = subprocess.Popen([sys.executable, str(child), str(world.root), str(tmp_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the child never started the slow write"
            time.sleep(0.05)
        time.sleep(0.3)  # a few chunks in
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    folder = tmp_path / "ckpt"
    partial = [p.name for p in folder.iterdir() if p.name.endswith(".partial")]
    assert partial, "the kill should have landed mid-write"
    assert not (folder / "rollout=000003.ckpt").exists()
    last = folder / "last.ckpt"
    assert last.resolve().name == "rollout=000002.ckpt"
    assert torch.load(last, weights_only=True)["lrlhf"]["rollouts_done"] == 2

    module, trainer = _run(world, tokenizer, tmp_path, 3, ckpt_path="last", kl=False)
    assert module.rollouts_done == 3 and len(module.sampled) == 1
    assert not [p for p in folder.iterdir() if p.name.endswith(".partial")]  # cleaned at setup
    assert last.resolve().name == "rollout=000003.ckpt"


def test_resume_refuses_other_config_and_other_frozen_weights(world, tokenizer, tmp_path):
    _run(world, tokenizer, tmp_path, 1, kl=False)  # make_module's fixed beta 0.1
    data = make_data(world, tokenizer)

    module = make_module(world, tokenizer, lr=1e-3)
    trainer = make_trainer(tmp_path, 2, module, [ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
    with pytest.raises(ValueError, match=r"config hparams.ppo.lr: checkpoint 0.05, this run 0.001"):
        trainer.fit(module, datamodule=data, ckpt_path="last")

    module = make_module(world, tokenizer)
    module.calibration = RewardCalibration(mean=0.0, std=2.0, count=10)  # another reward normalisation
    trainer = make_trainer(tmp_path, 2, module, [ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
    with pytest.raises(ValueError, match=r"config calibration.std: checkpoint '<absent>', this run 2.0"):
        trainer.fit(module, datamodule=data, ckpt_path="last")

    module = make_module(world, tokenizer)
    with torch.no_grad():
        module.reward_model.head.linear.weight.add_(1e-3)  # another reward model
    trainer = make_trainer(tmp_path, 2, module, [ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
    with pytest.raises(ValueError, match=r"frozen weights of 'reward_model' differ") as info:
        trainer.fit(module, datamodule=data, ckpt_path="last")
    assert "'model'" not in str(info.value)  # the base is the same

    # keys whose value Lightning restores from the checkpoint (the optimiser's param_groups, the LR scheduler's
    # state, the KL controller) are refused even where a pattern allows them: the new value would not be used
    for part, key, kwargs, why in (
            ("ppo", "lr", {"lr": 1e-3}, "optimiser state"),
            ("ppo", "weight_decay", {"weight_decay": 0.1}, "optimiser state"),
            ("ppo", "betas", {"betas": (0.8, 0.99)}, "optimiser state"),
            ("ppo", "warmup_steps", {"warmup_steps": 1, "total_steps": 9}, "LR scheduler state"),
            ("kl_controller", "kl_coef", {"kl_controller": FixedKLController(0.2)}, "KL controller state")):
        module = make_module(world, tokenizer, **kwargs)
        trainer = make_trainer(tmp_path, 2, module, [ResumableCheckpoint(
            dirpath=tmp_path / "ckpt", allowed_config_changes=[f"hparams.{part}.*"])])
        with pytest.raises(ValueError, match=rf"config hparams.{part}.{key}: .* \(allowed by 'hparams.{part}.\*', "
                                             rf"but restored from the checkpoint's {why}.*would not take effect"):
            trainer.fit(module, datamodule=data, ckpt_path="last")

    # an allowed change that the run does use resumes, with the new value
    module = make_module(world, tokenizer, entropy_coef=0.01)
    trainer = make_trainer(tmp_path, 2, module, [ResumableCheckpoint(
        dirpath=tmp_path / "ckpt", allowed_config_changes=["hparams.ppo.entropy_coef"])])
    trainer.fit(module, datamodule=data, ckpt_path="last")
    assert module.rollouts_done == 2 and module.config.entropy_coef == 0.01


def test_refusals_name_where_the_frozen_parts_were_loaded_from(world, tokenizer):
    from lrlhf.models import ModelConfig
    from lrlhf.modules.ppo import RewardAdapter

    for source, expected in (("runs/rm/model", "runs/rm/model"), (RewardAdapter("runs/rm_lora/model"),
                                                                 "runs/rm_lora/model")):
        module = PPOModule(ModelConfig(str(world.model)), source, tokenizer)  # nothing is loaded yet
        assert ResumableCheckpoint._sources(module) == {"model": str(world.model), "reward_model": expected}


def test_a_resume_that_trains_nothing_still_has_the_last_logged_figures(world, tokenizer, tmp_path):
    """The kill loop (bench/kill_loop.py) found it: killed after the final checkpoint but before summary.json, the
    rerun resumed at the end, trained nothing, and reported rollout/kl_seq and rollout/score as null."""
    _, first = _run(world, tokenizer, tmp_path, 2)
    logged = {k: float(first.callback_metrics[k]) for k in ("rollout/kl_seq", "rollout/score")}
    again, trainer = _run(world, tokenizer, tmp_path, 2, ckpt_path="last")  # already at its max_steps
    assert again.rollouts_done == 2
    assert {k: float(trainer.callback_metrics[k]) for k in logged} == logged


def _fit_validated(root, fail_at=None, ckpt_path=None, die_after=None):
    import lightning.pytorch as pl

    data = linear_data()
    module = LinearValidated(fail_at, die_after)
    trainer = pl.Trainer(max_steps=4, val_check_interval=2, check_val_every_n_epoch=None, num_sanity_val_steps=0,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[ResumableCheckpoint(dirpath=root / "ckpt", keep_last_k=10)])
    trainer.fit(module, data, data, ckpt_path=ckpt_path)
    return trainer


def test_a_step_that_validates_is_saved_after_its_validation(tmp_path):
    """The kill soak found it (DPO, KTO): the checkpoint of a step that ends in a validation was written before
    the validation, so a relaunch of the finished run reported the previous validation's figures, and a kill during
    that validation resumed after it (its metrics row lost). Saved after it: the final checkpoint holds the final
    figures; a validation that dies leaves the step before as the last checkpoint, and the resume validates."""
    from lrlhf.callbacks.checkpoint import META_KEY

    trainer = _fit_validated(tmp_path / "straight")
    final = torch.load(tmp_path / "straight" / "ckpt" / "last.ckpt", weights_only=False)
    assert final[META_KEY]["metrics"]["val/loss"] == float(trainer.callback_metrics["val/loss"])

    with pytest.raises(RuntimeError, match="killed during the validation"):
        _fit_validated(tmp_path / "killed", fail_at=4)
    assert os.readlink(tmp_path / "killed" / "ckpt" / "last.ckpt") == "rollout=000003.ckpt"
    resumed = _fit_validated(tmp_path / "killed", ckpt_path="last")
    assert float(resumed.callback_metrics["val/loss"]) == float(trainer.callback_metrics["val/loss"])


def test_last_points_at_a_step_only_once_its_row_can_have_been_logged(tmp_path):
    """The kill soak found it (SFT): a step's checkpoint was pointed at by last.ckpt in the batch-end hooks,
    Lightning logs the step's row after them; killed in between, the resume started after the step and metrics.csv
    never got its row. The file is written at the batch end, last.ckpt moves at the next batch start."""
    with pytest.raises(RuntimeError, match="row was logged"):
        _fit_validated(tmp_path, die_after=3)  # step 3: no validation after it
    assert (tmp_path / "ckpt" / "rollout=000003.ckpt").is_file()
    assert os.readlink(tmp_path / "ckpt" / "last.ckpt") == "rollout=000002.ckpt"
