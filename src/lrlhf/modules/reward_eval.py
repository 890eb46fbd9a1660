"""A trained reward model's held-out evaluation: test accuracy, AUROC and ECE, and the calibration statistics
(mean and std of its rewards on held-out completions) that PPO normalises rewards with."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from lrlhf.models.reward import RewardCalibration


def evaluate_held_out(module, data, out_dir: Path, trained) -> dict:
    """Validate ``module`` (whole, on global rank 0) on ``data``'s test split and calibrate it there; ``trained``
    is the module that trained (its per-source metrics are registered on a gathered copy)."""
    import lightning.pytorch as pl

    from lrlhf.strategies import no_metric_sync

    if module is not trained or getattr(data.trainer, "world_size", 1) > 1:  # rank 0 alone, the whole test set
        data.trainer = None
        data.setup("test")
        module.register_sources(trained.source_names.values())  # the metrics training had, and the test set's
        module.register_split_sources(data, "test")
        no_metric_sync(module)
    evaluator = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                           default_root_dir=str(out_dir))
    metrics = evaluator.validate(module, dataloaders=data.test_dataloader(), verbose=False)[0]
    calibration = compute_calibration(module, data.test_dataloader(), reference="held-out preference completions")
    return {"test/accuracy": metrics["val/accuracy"], "test/auroc": metrics["val/auroc"],
            "test/ece": metrics["val/ece"], "calibration": {"mean": calibration.mean, "std": calibration.std}}


@torch.no_grad()
def compute_calibration(module, data, reference: str = "") -> RewardCalibration:
    """Mean and std of the rewards of every completion in ``data``; stored on ``module.calibration``.

    Args:
        module: the trained reward module (scored in eval mode, restored afterwards).
        data: a datamodule (its ``val_dataloader()``), a DataLoader, or any iterable of batches that
            :meth:`RewardModule.score` accepts (pair, ranking, or plain ``input_ids`` / ``attention_mask``
            batches, e.g. the SFT policy's outputs).
        reference: a description saved with the numbers.

    Single process: run it after ``trainer.fit`` on rank 0.
    """
    if hasattr(data, "val_dataloader"):
        data.setup("validate")
        data = data.val_dataloader()
    was_training = module.training
    module.eval()
    try:
        rewards = torch.cat([module.score(_to_device(b, module.device)).float().cpu() for b in data])
    finally:
        module.train(was_training)
    if rewards.numel() < 2:
        raise ValueError("compute_calibration needs at least two completions")
    std = rewards.std().item()
    if not std > 0:
        raise ValueError(f"compute_calibration: every reward of {rewards.numel()} completions is "
                         f"{rewards[0].item():g}, the std is 0: a degenerate reward model (training diverged: "
                         "module.config.lr too high?) or identical completions")
    module.calibration = RewardCalibration(rewards.mean().item(), std, rewards.numel(), reference)
    return module.calibration


def _to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
