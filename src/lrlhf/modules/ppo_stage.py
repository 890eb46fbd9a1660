"""What a PPO / RLOO / GRPO stage leaves behind (:mod:`lrlhf.modules.stage`): the :class:`StageOutputs` base of
:class:`~lrlhf.modules.PPOModule`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from lrlhf.models import export_adapter, export_merged
from lrlhf.models.reward import RewardCalibration
from lrlhf.modules.critic import POLICY
from lrlhf.modules.stage import StageOutputs


class PPOStage(StageOutputs):
    """The stage contract of :class:`~lrlhf.modules.PPOModule`, read from the module's own attributes: ``advantage``
    (its name names the policy), ``rollouts_done``, ``kl_controller`` and ``calibration`` (the summary), ``model``
    and ``tokenizer`` (the export)."""

    summary_metrics = ("rollout/kl_seq", "rollout/score")

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
