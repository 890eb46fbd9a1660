"""KTO (Ethayarajh et al., 2024): preference optimisation from answers labelled desirable or undesirable, no pairs.

The roles are DPO's (:mod:`lrlhf.modules.dpo`): the policy is the base plus the LoRA adapter ``policy``, the
reference the same base with every adapter disabled. Batches come from :class:`lrlhf.data.kto.KTODataModule` in the
pair layout: rows ``[0, B)`` each example's prompt and answer, rows ``[B, 2B)`` the prompt with another example's
answer (the mismatched sequences KTO's KL reference point is estimated on), ``pair_targets`` 1.0 for a desirable
answer. The steps of :meth:`KTOModule.shared_step`:

1. one policy forward over the ``2B`` rows, summed answer log-probs (:meth:`DPOModule.sequence_logprobs`);
2. one no-grad reference forward over the same rows;
3. :meth:`compute_loss`: :func:`lrlhf.functional.kto_loss` (the reference point from the mismatched rows,
   detached; TRL's ``KTOTrainer`` loss, ``loss_type="kto"``);
4. log the loss, the reference point, the implicit rewards of desirable and undesirable answers and their margin.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lrlhf.functional import KTOStats, kto_loss
from lrlhf.modules.dpo import DPOConfig, DPOModule, PairLogprobs


@dataclass
class KTOConfig(DPOConfig):
    """Hyperparameters of KTO (``module.config.*``): DPO's and the two weights."""

    desirable_weight: float = 1.0
    """``w_d``: weight of a desirable answer's loss (the paper keeps ``w_d n_d / (w_u n_u)`` in [1, 4/3])."""
    undesirable_weight: float = 1.0
    """``w_u``: weight of an undesirable answer's loss."""

    def __post_init__(self):
        super().__post_init__()
        for key in ("desirable_weight", "undesirable_weight"):
            if not getattr(self, key) > 0:
                raise ValueError(f"module.config.{key} must be > 0, got {getattr(self, key)!r}")


class KTOModule(DPOModule):
    """KTO on :class:`lrlhf.data.kto.KTODataModule` batches (module docstring); a DPO module in every other way
    (the adapter, the reference, the finite-loss checks, the export).

    Args: as :class:`DPOModule`, with a :class:`KTOConfig`.
    """

    policy_name = "kto"
    summary_metrics = ("train/loss", "val/loss", "val/reward_margin", "val/kl")

    def __init__(self, model, tokenizer=None, config: KTOConfig | dict | None = None, preference_loss=None):
        if preference_loss is not None:
            raise ValueError("module.preference_loss is DPO's; KTO's loss is its own (set it to null)")
        config = config if isinstance(config, KTOConfig) else KTOConfig(**(config or {}))
        super().__init__(model, tokenizer, config)

    def compute_loss(self, policy: PairLogprobs, reference: PairLogprobs,
                     desirable: Tensor) -> tuple[Tensor, KTOStats]:
        """:func:`kto_loss`: ``policy.chosen`` / ``reference.chosen`` the examples' answers, ``.rejected`` the
        mismatched ones."""
        cfg = self.config
        return kto_loss(policy.chosen, reference.chosen, policy.rejected, reference.rejected, desirable,
                        beta=cfg.beta, desirable_weight=cfg.desirable_weight,
                        undesirable_weight=cfg.undesirable_weight)

    def shared_step(self, batch: dict[str, Tensor], prefix: str) -> Tensor:
        # 1. policy: one forward over the examples and their mismatched sequences
        policy = self.sequence_logprobs(batch)
        # 2. reference: the same rows with the adapter disabled, no grad
        reference = self.reference_logprobs(batch)
        # 3. the KTO loss (the reference point from the mismatched rows, detached)
        desirable = batch["pair_targets"] > 0.5
        loss, stats = self.compute_loss(policy, reference, desirable)
        # 4. log
        good, bad = stats.rewards[desirable], stats.rewards[~desirable]
        metrics = {"loss": loss.detach(), "kl": stats.kl, "desirable_fraction": desirable.float().mean()}
        if good.numel():
            metrics["rewards_desirable"] = good.mean()
        if bad.numel():
            metrics["rewards_undesirable"] = bad.mean()
        if good.numel() and bad.numel():
            metrics["reward_margin"] = good.mean() - bad.mean()
        on_step = prefix == "train"
        for name, value in metrics.items():
            self.log(f"{prefix}/{name}", value, batch_size=desirable.numel(), on_step=on_step, on_epoch=not on_step,
                     prog_bar=name == "loss")
        return loss


__all__ = ["KTOConfig", "KTOModule"]
