"""Supervised fine-tuning: masked cross-entropy on assistant tokens, full or LoRA.

The loss is the mean negative log-likelihood of the target tokens (``loss_mask``: assistant content and its
EOS; prompt tokens and padding excluded), computed with :mod:`lrlhf.functional`. Validation reports the
token-weighted loss over the whole validation set and its perplexity (the sample table is a callback's,
:class:`lrlhf.callbacks.SampleTable`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from lrlhf.data.collate import model_inputs
from lrlhf.functional import masked_mean, token_logprobs
from lrlhf.models import (
    LoraSpec,
    ModelConfig,
    add_adapters,
    export_adapter,
    export_merged,
    load_causal_lm,
    load_tokenizer,
)
from lrlhf.models.lora import refuse_full_finetuning_if_quantised
from lrlhf.modules.optim import OptimConfig, check_finite, check_finite_weights
from lrlhf.modules.stage import StageOutputs


# ---------------------------------------------------------------------------------------------- config
@dataclass
class SFTConfig(OptimConfig):
    """Hyperparameters of SFT (gradient clipping and accumulation are the Trainer's)."""

    lr: float = 2e-5
    """Peak AdamW learning rate."""
    lora: LoraSpec | None = None
    """None = full fine-tuning; a spec trains one LoRA adapter (named :attr:`adapter_name`), base frozen."""
    adapter_name: str = "policy"
    """Name of the SFT adapter: ``policy``, so a LoRA SFT run reads like the PPO role it prepares."""

    def __post_init__(self):
        self.check_optim()
        if isinstance(self.lora, dict):  # from a YAML/Hydra config
            self.lora = LoraSpec(**self.lora)
        checks = [
            ("adapter_name", bool(self.adapter_name), "must be a non-empty name"),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ValueError(f"module.config.{key} {rule}, got {getattr(self, key)!r}")


class ExportPaths(NamedTuple):
    """Where :meth:`SFTModule.export` wrote: ``merged`` always, ``adapter`` only for LoRA (else None)."""

    merged: Path
    adapter: Path | None


# ---------------------------------------------------------------------------------------------- module
class SFTModule(StageOutputs, pl.LightningModule):
    """SFT of a causal LM on batches of :class:`lrlhf.data.datamodules.SFTDataModule` (padded or packed).

    Args:
        model: a :class:`ModelConfig` (loaded in :meth:`configure_model`) or a ready causal LM module.
        tokenizer: needed for :meth:`export`; loaded from a ``ModelConfig`` when None.
        config: hyperparameters (:class:`SFTConfig`, or a dict of its fields).

    A ``ModelConfig`` is loaded in ``configure_model``, not ``__init__``: Lightning calls that hook under the
    strategy's context (FSDP/ModelParallel shard or init on device there), and constructing the module stays
    cheap. ``configure_model`` is idempotent; call it yourself to use the module outside a Trainer.
    """

    def __init__(
        self,
        model: ModelConfig | nn.Module,
        tokenizer=None,
        config: SFTConfig | dict | None = None,
    ):
        super().__init__()
        self.config = config if isinstance(config, SFTConfig) else SFTConfig(**(config or {}))
        self.model_config = model if isinstance(model, ModelConfig) else None
        self.model: nn.Module | None = None
        if self.model_config is None:
            self.model = self._with_adapter(model)
        if tokenizer is None and self.model_config is not None:
            tokenizer = load_tokenizer(self.model_config)
        self.tokenizer = tokenizer
        self.val_nll = MeanMetric()  # mean NLL over all validation target tokens (synced across ranks)
        self._step_started: float | None = None
        hparams = {"sft": asdict(self.config)}
        if self.model_config is not None:
            hparams["model"] = asdict(self.model_config)
        self.save_hyperparameters(hparams)

    # ---------------------------------------------------------------------------------- model setup
    def _with_adapter(self, model: nn.Module) -> nn.Module:
        if self.config.lora is None:
            refuse_full_finetuning_if_quantised(model, "module.config.lora", "recipe=sft_lora (hparams.sft_recipe="
                                                "sft_lora for the stages that build SFT first)")
            return model
        return add_adapters(model, {self.config.adapter_name: self.config.lora})

    def configure_model(self) -> None:
        if self.model is None:
            self.model = self._with_adapter(load_causal_lm(self.model_config))

    # ------------------------------------------------------------------------------ hooks to override
    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits ``(B, T, V)`` of a padded or packed batch (:func:`model_inputs` picks the keyword set)."""
        return self.model(**model_inputs(batch)).logits

    def target_logprobs(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Log-probs of the next tokens and which of them are targets.

        ``logits[:, t]`` predicts ``input_ids[:, t + 1]``, and ``loss_mask[:, t + 1]`` says whether that token is
        a target, so both are shifted by one: returns ``(logprobs, mask)``, each ``(B, T - 1)``.
        """
        logprobs = token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:])
        return logprobs, batch["loss_mask"][:, 1:]

    def compute_loss(self, logits: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Mean NLL over the batch's target tokens (a scalar; 0 when the batch has none)."""
        logprobs, mask = self.target_logprobs(logits, batch)
        return -masked_mean(logprobs, mask)

    # ------------------------------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # 1. forward (padded or packed)
        logits = self(batch)
        # 2. masked cross-entropy on the assistant targets
        loss = self.compute_loss(logits, batch)
        # 3. stop before the optimiser step on a NaN / inf loss (no poisoned weights are kept or exported)
        check_finite(loss, "training loss", "sft", self.global_step, self.config.lr)
        # 4. log the loss (throughput and lr are logged in on_train_batch_end, after the optimiser step)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def on_train_end(self) -> None:
        # the last optimiser step's loss was finite, its update may not have been: checked before any export
        check_finite_weights(self, "sft", self.global_step, self.config.lr)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_started = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Tensor], batch_idx: int) -> None:
        # Throughput is this rank's (times the world size for the global figure), timed from batch start to
        # after the optimiser step: forward, backward and update, not data loading.
        if self._step_started is not None:
            seconds = max(time.perf_counter() - self._step_started, 1e-9)
            target, total = _token_counts(batch)
            self.log("train/target_tokens_per_s", target / seconds)
            self.log("train/tokens_per_s", total / seconds)
        if self.trainer.optimizers:
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])

    # ----------------------------------------------------------------------------------- validation
    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logprobs, mask = self.target_logprobs(self(batch), batch)
        # MeanMetric drops NaN (with a warning): a diverged model must stop here, not report a loss of the rest
        check_finite(logprobs[mask.bool()], "validation log-probs", "sft", self.global_step, self.config.lr,
                     stopped="before computing val/loss", across_ranks=False)  # rank 0 may validate alone
        # Every target token is one observation, so the epoch value is sum(nll) / #targets over the whole
        # set, not a mean of batch means (which would overweight short batches).
        self.val_nll.update(-logprobs[mask.bool()])

    def on_validation_epoch_end(self) -> None:
        if self.val_nll.update_count == 0:
            return  # no validation batch (e.g. an empty loader)
        loss = self.val_nll.compute()  # synced across ranks by torchmetrics: no sync_dist needed
        self.val_nll.reset()
        self.log("val/loss", loss)
        self.log("val/ppl", torch.exp(loss))

    # ----------------------------------------------------------------------------------- optimiser
    def configure_optimizers(self):
        cfg = self.config  # (the Trainer estimates the length only when total_steps is not set)
        return cfg.optimizers(self, cfg.total_steps or int(self.trainer.estimated_stepping_batches))

    # -------------------------------------------------------------------------------------- export
    summary_metrics = ("train/loss", "val/loss")

    def export_stage(self, folder: Path) -> dict[str, Path | None]:
        paths = self.export(folder)
        return {"export": paths.merged, "adapter": paths.adapter}

    def export(self, out_dir: str | Path) -> ExportPaths:
        """Write ``out_dir/merged`` (plain transformers + tokenizer) and, with LoRA, ``out_dir/adapter``
        (``PeftModel.from_pretrained(base, out_dir/adapter)``). The live model keeps its adapter."""
        out_dir = Path(out_dir)
        adapter = self.config.adapter_name if self.config.lora is not None else None
        merged = export_merged(self.model, out_dir / "merged", self.tokenizer, adapter=adapter)
        adapter_dir = None
        if adapter is not None:
            adapter_dir = export_adapter(self.model, out_dir / "adapter", adapter, self.tokenizer)
        return ExportPaths(merged, adapter_dir)


def _token_counts(batch: dict[str, Tensor]) -> tuple[int, int]:
    """(target tokens, real tokens) of a padded or packed batch; packed padding has ``sequence_ids == -1``."""
    target = int(batch["loss_mask"].sum())
    if "attention_mask" in batch:
        total = int(batch["attention_mask"].sum())
    elif "sequence_ids" in batch:
        total = int((batch["sequence_ids"] >= 0).sum())
    else:
        total = batch["input_ids"].numel()
    return target, total

