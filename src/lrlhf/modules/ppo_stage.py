"""The stage contract of a PPO / RLOO / GRPO run, the base of :class:`~lrlhf.modules.PPOModule`: its optimiser and
schedule, what its checkpoint holds besides the weights, and what it leaves behind (:mod:`lrlhf.modules.stage`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from lrlhf.models import export_adapter, export_merged
from lrlhf.models.reward import RewardCalibration
from lrlhf.modules.critic import POLICY
from lrlhf.modules.stage import StageOutputs
from lrlhf.utils.compat import forget_step_metrics


class PPOStage(StageOutputs):
    """The stage contract of :class:`~lrlhf.modules.PPOModule`, read from the module's own attributes: ``config``
    (the optimiser and its schedule), ``advantage`` (its name names the policy), ``rollouts_done``,
    ``kl_controller`` and ``calibration`` (the checkpoint and the summary), ``model`` and ``tokenizer`` (the
    export)."""

    summary_metrics = ("rollout/kl_seq", "rollout/score")

    def configure_optimizers(self):
        cfg = self.config
        if cfg.total_steps is None and (cfg.scheduler != "constant" or cfg.warmup_steps):
            raise ValueError(f"module.config.total_steps must be set (in optimiser steps) for scheduler "
                             f"{cfg.scheduler!r} with warmup; see PPOModule.updates_per_rollout")
        max_steps = self.trainer.max_steps if self._trainer is not None else None
        if cfg.scheduler != "constant" and max_steps is not None and (max_steps < 0 or max_steps > cfg.total_steps):
            # The schedule's length is fixed (a resumed run keeps it); past it the LR would stay at 0: steps wasted
            raise ValueError(f"trainer.max_steps={max_steps} is past module.config.total_steps={cfg.total_steps}: "
                             f"the {cfg.scheduler!r} LR schedule reaches 0 there and every later step would train "
                             f"nothing. Set both (hparams.ppo.max_steps=N sets both on the toy scale), or "
                             f"module.config.scheduler=constant to extend a run")
        return cfg.optimizers(self, total_steps=1)  # constant (or total_steps set): the length is not needed

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """A rollout's rows hold what was logged for it alone: a held-out evaluation's metrics do not repeat in
        the rows of the rollouts after it (:func:`lrlhf.utils.compat.forget_step_metrics`)."""
        forget_step_metrics(self.trainer)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Besides the weights: the KL controller's state (beta; its settings are the config's), the rollouts done,
        a calibration measured in the run and a reward source's own measured scales (a mixture's)."""
        checkpoint["kl_controller"] = self.kl_controller.state_dict()
        checkpoint["rollouts_done"] = self.rollouts_done
        if isinstance(self.calibration, RewardCalibration):
            checkpoint["calibration"] = asdict(self.calibration)
        if hasattr(self.reward, "calibration_state"):  # a mixture's measured scales
            checkpoint["reward_calibration"] = self.reward.calibration_state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "kl_controller" in checkpoint:
            self.kl_controller.load_state_dict(checkpoint["kl_controller"])
        self.rollouts_done = checkpoint.get("rollouts_done", 0)
        if "calibration" in checkpoint:
            self.calibration = RewardCalibration(**checkpoint["calibration"])
        if hasattr(self.reward, "load_calibration_state"):
            self.reward.load_calibration_state(checkpoint.get("reward_calibration"))

    @property
    def policy_name(self) -> str:
        """``ppo``, ``rloo``, ``grpo``: the estimator's name (the summary's ``gold/<policy_name>``)."""
        return self.advantage.name

    def stage_summary(self, trainer, out_dir: Path) -> dict:
        """The rollouts done, the final beta and the last rollout's KL and score (a run resumed at its end trains
        nothing: the checkpoint restores what was last logged, ResumableCheckpoint.on_fit_start)."""
        calibration = {"calibration": asdict(self.calibration)} if isinstance(self.calibration, RewardCalibration) \
            else {}
        return {"rollouts": self.rollouts_done, "kl/beta": self.kl_controller.value, **calibration,
                **super().stage_summary(trainer, out_dir)}

    def export_stage(self, folder: Path) -> dict[str, Path | None]:
        paths = self.export(folder / "export")
        return {"export": paths["merged"], "adapter": paths["adapter"]}

    def export(self, out_dir: str | Path) -> dict[str, Path]:
        """Write the trained policy: ``out_dir/merged`` (the ``policy`` adapter merged into a copy of the base,
        loadable by plain transformers, tokenizer alongside) and ``out_dir/adapter`` (the adapter alone, for
        ``PeftModel.from_pretrained(sft_base, out_dir/adapter)``). The live model keeps its adapters."""
        out_dir = Path(out_dir)
        return {
            "merged": export_merged(self.model, out_dir / "merged", self.tokenizer, adapter=POLICY),
            "adapter": export_adapter(self.model, out_dir / "adapter", POLICY, self.tokenizer),
        }


__all__ = ["PPOStage"]
