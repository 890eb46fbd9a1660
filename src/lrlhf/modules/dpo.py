"""Direct preference optimisation (Rafailov et al., 2023) and its variants, a LoRA policy adapter on a frozen base.

Roles, as in PPO (``docs/architecture.md``): the **policy** is the base (usually the merged SFT model) plus the
LoRA adapter ``policy``; the **reference** is the same base under :func:`lrlhf.models.reference_mode` (every
adapter disabled). Reference log-probs are computed in the same step under ``no_grad`` rather than precomputed:
one extra no-grad forward per batch, no pass over the data before training and no cache to keep in sync with the
data order or truncation.

Batches are padded pair batches of :class:`lrlhf.data.PreferenceDataModule`: ``2B`` rows, chosen ``[0, B)`` then
rejected ``[B, 2B)``, ``loss_mask`` on the completion tokens, ``pair_targets`` (B,) = P(chosen wins); or their
prefix-shared form (:mod:`lrlhf.data.shared_batches`: one row per pair, the prompt encoded once, the same sums).
The steps of :meth:`DPOModule.training_step`:

1. one policy forward over all ``2B`` rows; summed completion log-probs (:meth:`sequence_logprobs`);
2. one no-grad reference forward over the same rows (:meth:`reference_logprobs`);
3. drop the ties (``pair_targets == 0.5``: a tie says nothing about which side to raise, and DPO's loss has no
   symmetric target); every other pair counts as "chosen preferred" (the data module orients pairs that way);
4. :meth:`compute_loss`: the preference loss object (``module.preference_loss``, :mod:`lrlhf.functional.
   preference_losses`: DPO, cDPO, IPO, robust DPO, SimPO) with ``beta``; a reference-free loss (SimPO) skips step 2;
5. log the loss, implicit rewards, their margin and accuracy, and the policy's chosen/rejected log-prob margins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lrlhf.data.shared_batches import is_shared, unshare_batch
from lrlhf.functional import DPOLoss, DPOStats, PreferenceLoss
from lrlhf.functional.prefix_sharing import shared_logprob_sums
from lrlhf.models import (
    LoraSpec,
    ModelConfig,
    add_adapters,
    export_adapter,
    export_merged,
    load_causal_lm,
    load_tokenizer,
    reference_mode,
)
from lrlhf.models.shared_inputs import can_share, shared_inputs
from lrlhf.modules.optim import OptimConfig, check_finite, check_finite_weights
from lrlhf.modules.ppo_config import component_settings
from lrlhf.modules.sft import ExportPaths
from lrlhf.modules.stage import StageOutputs

TIE = 0.5


# ---------------------------------------------------------------------------------------------- config
@dataclass
class DPOConfig(OptimConfig):
    """Hyperparameters of DPO (``module.config.*``; gradient clipping and accumulation are the Trainer's)."""

    beta: float = 0.1
    """Strength of the implicit KL constraint: the implicit reward is ``beta * (log pi - log ref)`` (the scale every
    preference loss has; SimPO's is on mean token log-probs, typically 2 to 2.5)."""
    lr: float = 5e-4
    """Peak AdamW learning rate."""
    lora: LoraSpec = field(default_factory=LoraSpec)
    """The policy adapter; the base stays frozen and, with adapters disabled, is the reference."""
    adapter_name: str = "policy"
    """Name of the policy adapter (``policy``, as in PPO)."""

    def __post_init__(self):
        self.check_optim()
        if isinstance(self.lora, dict):  # from a YAML/Hydra config
            self.lora = LoraSpec(**self.lora)
        checks = [
            ("beta", self.beta > 0, "must be > 0"),
            ("lora", isinstance(self.lora, LoraSpec),
             "must be a LoRA spec (the reference is the base with the adapter disabled)"),
            ("adapter_name", bool(self.adapter_name), "must be a non-empty name"),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ValueError(f"module.config.{key} {rule}, got {getattr(self, key)!r}")


class PairLogprobs(NamedTuple):
    """Summed completion log-probs of a pair batch, split by side.

    Fields (B pairs):
        chosen: ``(B,)`` sum over the chosen completion's target tokens.
        rejected: ``(B,)`` the same for the rejected completion.
    """

    chosen: Tensor
    rejected: Tensor


def completion_lengths(batch: dict[str, Tensor]) -> PairLogprobs:
    """The target tokens of each side's completion (the per-token losses' divisor), from the batch's ``loss_mask``
    (padded or prefix-shared: one row per completion, chosen first)."""
    lengths = batch["loss_mask"].sum(-1)
    n_pairs = batch["pair_targets"].shape[0]
    return PairLogprobs(lengths[:n_pairs], lengths[n_pairs:])


# ---------------------------------------------------------------------------------------------- module
class DPOModule(StageOutputs, pl.LightningModule):
    """DPO on pair batches of :class:`lrlhf.data.PreferenceDataModule` (padded or prefix-shared, not packed).

    Args:
        model: a :class:`ModelConfig` (loaded in :meth:`configure_model`) or a ready causal LM without adapters.
        tokenizer: saved by :meth:`export`; loaded from a ``ModelConfig`` when None.
        config: hyperparameters (:class:`DPOConfig`, or a dict of its fields).
        preference_loss: a :class:`~lrlhf.functional.PreferenceLoss` (``module/preference_loss=dpo|cdpo|ipo|robust|
            simpo``); None = :class:`~lrlhf.functional.DPOLoss` (the original DPO loss).

    Hooks to override: :meth:`sequence_logprobs` (summed completion log-probs of a batch), :meth:`compute_loss`.
    """

    def __init__(self, model: ModelConfig | nn.Module, tokenizer=None, config: DPOConfig | dict | None = None,
                 preference_loss: PreferenceLoss | None = None):
        super().__init__()
        self.config = config if isinstance(config, DPOConfig) else DPOConfig(**(config or {}))
        self.preference_loss = preference_loss if preference_loss is not None else DPOLoss()
        if not isinstance(self.preference_loss, PreferenceLoss):
            raise ValueError(f"module.preference_loss must be a PreferenceLoss (lrlhf.functional), got "
                             f"{type(self.preference_loss).__name__}")
        self.model_config = model if isinstance(model, ModelConfig) else None
        self.model: nn.Module | None = None
        if self.model_config is None:
            self.model = self._with_adapter(model)
        if tokenizer is None and self.model_config is not None:
            tokenizer = load_tokenizer(self.model_config)
        self.tokenizer = tokenizer
        hparams = {"dpo": asdict(self.config)}
        hparams["preference_loss"] = component_settings(self.preference_loss)
        if self.model_config is not None:
            hparams["model"] = asdict(self.model_config)
        self.save_hyperparameters(hparams)

    # ---------------------------------------------------------------------------------- model setup
    def _with_adapter(self, model: nn.Module) -> nn.Module:
        return add_adapters(model, {self.config.adapter_name: self.config.lora})

    def configure_model(self) -> None:
        """Load the base and add the policy adapter (idempotent; call it to use the module outside a Trainer)."""
        if self.model is None:
            self.model = self._with_adapter(load_causal_lm(self.model_config))

    # ------------------------------------------------------------------------------ hooks to override
    def sequence_logprobs(self, batch: dict[str, Tensor]) -> PairLogprobs:
        """Summed log-probs of each row's completion under the active model, in ONE forward over ``2B`` rows.

        ``logits[:, t]`` predicts ``input_ids[:, t + 1]`` and ``loss_mask[:, t + 1]`` marks it a target, so both
        shift by one (as in SFT). A prefix-shared batch (:mod:`lrlhf.data.shared_batches`) runs one row per pair and
        gives the same sums (:func:`lrlhf.functional.prefix_sharing.shared_logprob_sums`). Differentiable unless called
        under ``no_grad``.
        """
        if "pair_targets" not in batch or not ("attention_mask" in batch or is_shared(batch)):
            raise ValueError("DPOModule needs padded or prefix-shared pair batches (PreferenceDataModule with "
                             "packing=False)")
        n_pairs = batch["pair_targets"].shape[0]
        if is_shared(batch) and not can_share(self.model, batch["input_ids"].shape[1]):
            batch = unshare_batch(batch)
        if is_shared(batch):  # one row per pair: the prompt encoded once, each side's targets gathered from it
            logits = self.model(**shared_inputs(self.model, batch)).logits  # (B, L, V)
            sums = shared_logprob_sums(logits, batch["input_ids"], batch["gather_rows"], batch["gather_cols"],
                                       batch["loss_mask"])  # (2B,)
            return PairLogprobs(sums[:n_pairs], sums[n_pairs:])
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            use_cache=False).logits  # (2B, T, V); no KV cache is built for a scoring pass
        # the padded layout is the shared one with a row per sequence: log-softmax at the target positions only
        rows, width = batch["input_ids"].shape
        index = torch.arange(width, device=logits.device)
        sums = shared_logprob_sums(logits, batch["input_ids"], torch.arange(rows, device=logits.device),
                                   index.expand(rows, width), batch["loss_mask"])  # (2B,)
        return PairLogprobs(sums[:n_pairs], sums[n_pairs:])

    @torch.no_grad()
    def reference_logprobs(self, batch: dict[str, Tensor]) -> PairLogprobs:
        """:meth:`sequence_logprobs` under the reference (the base with every adapter disabled), no graph."""
        with reference_mode(self.model):
            return self.sequence_logprobs(batch)

    def compute_loss(self, policy: PairLogprobs, reference: PairLogprobs | None,
                     lengths: PairLogprobs | None = None) -> tuple[Tensor, DPOStats]:
        """The preference loss over the (non-tie) pairs given (``reference`` None for a reference-free loss,
        ``lengths`` the completions' token counts): a scalar and the detached statistics."""
        ref = reference if reference is not None else PairLogprobs(None, None)
        lens = lengths if lengths is not None else PairLogprobs(None, None)
        return self.preference_loss(policy.chosen, policy.rejected, ref.chosen, ref.rejected, lens.chosen,
                                    lens.rejected, self.config.beta)

    # ------------------------------------------------------------------------------------- steps
    def shared_step(self, batch: dict[str, Tensor], prefix: str) -> Tensor:
        # 1. policy: one forward over chosen + rejected
        policy = self.sequence_logprobs(batch)
        # 2. reference: the same rows with the adapter disabled, no grad (none for a reference-free loss)
        reference = self.reference_logprobs(batch) if self.preference_loss.uses_reference else None
        lengths = completion_lengths(batch)
        # 3. ties carry no direction: left out of the loss (a batch of ties only gives a zero loss, zero gradient)
        kept = batch["pair_targets"] != TIE  # (B,)
        n_kept = int(kept.sum())
        if n_kept == 0:
            loss = policy.chosen.sum() * 0.0
            self.log(f"{prefix}/loss", loss, batch_size=1)
            return loss
        policy = PairLogprobs(policy.chosen[kept], policy.rejected[kept])
        if reference is not None:
            reference = PairLogprobs(reference.chosen[kept], reference.rejected[kept])
        lengths = PairLogprobs(lengths.chosen[kept], lengths.rejected[kept])
        # 4. the preference loss
        loss, stats = self.compute_loss(policy, reference, lengths)
        # 5. log (means over the kept pairs; Lightning weights epoch means by batch_size)
        metrics = {
            "loss": loss.detach(),
            "rewards_chosen": stats.chosen_rewards.mean(),
            "rewards_rejected": stats.rejected_rewards.mean(),
            "reward_margin": stats.reward_margin,
            "accuracy": stats.accuracy,
            "logps_chosen": policy.chosen.detach().mean(),
            "logps_rejected": policy.rejected.detach().mean(),
            "logp_margin": (policy.chosen - policy.rejected).detach().mean(),
        }
        if reference is not None:
            metrics["ref_logp_margin"] = (reference.chosen - reference.rejected).mean()
        on_step = prefix == "train"
        for name, value in metrics.items():
            self.log(f"{prefix}/{name}", value, batch_size=n_kept, on_step=on_step, on_epoch=not on_step,
                     prog_bar=name in ("loss", "accuracy"))
        self.log(f"{prefix}/ties_dropped", float(kept.numel() - n_kept), batch_size=1, on_step=on_step,
                 on_epoch=not on_step, reduce_fx="sum")
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # stop before the optimiser step on a NaN / inf loss (no poisoned weights are kept or exported)
        return check_finite(self.shared_step(batch, "train"), "training loss", self.policy_name, self.global_step,
                            self.config.lr)

    def on_train_end(self) -> None:
        # the last optimiser step's loss was finite, its update may not have been: checked before any export
        check_finite_weights(self, self.policy_name, self.global_step, self.config.lr)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        check_finite(self.shared_step(batch, "val"), "validation loss", self.policy_name, self.global_step,
                     self.config.lr, stopped="at validation", across_ranks=False)  # rank 0 may validate alone

    # ----------------------------------------------------------------------------------- optimiser
    def configure_optimizers(self):
        cfg = self.config  # (the Trainer estimates the length only when total_steps is not set)
        return cfg.optimizers(self, cfg.total_steps or int(self.trainer.estimated_stepping_batches))

    # -------------------------------------------------------------------------------------- export
    policy_name = "dpo"
    summary_metrics = ("train/loss", "val/loss", "val/accuracy", "val/reward_margin")

    def export_stage(self, folder: Path) -> dict[str, Path | None]:
        paths = self.export(folder / "export")
        return {"export": paths.merged, "adapter": paths.adapter}

    def export(self, out_dir: str | Path) -> ExportPaths:
        """Write ``out_dir/merged`` (the adapter merged into a copy of the base, plain transformers + tokenizer)
        and ``out_dir/adapter`` (``PeftModel.from_pretrained(base, out_dir/adapter)``). The live model keeps its
        adapter."""
        out_dir = Path(out_dir)
        name = self.config.adapter_name
        merged = export_merged(self.model, out_dir / "merged", self.tokenizer, adapter=name)
        return ExportPaths(merged, export_adapter(self.model, out_dir / "adapter", name, self.tokenizer))
