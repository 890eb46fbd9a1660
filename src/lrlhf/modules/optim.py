"""Optimiser and learning-rate schedules shared by the LightningModules."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

#: ``(warmup_steps, total_steps) -> (step -> lr factor)``. A new schedule is a new entry, not a new flag.
LRSchedule = Callable[[int, int], Callable[[int], float]]


def _warmup(step: int, warmup_steps: int) -> float:
    # (step + 1) / warmup: the first optimiser step already moves (HF's step / warmup wastes step 0).
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def _decay(decay: Callable[[float], float]) -> LRSchedule:
    """Linear warmup, then ``decay(progress)`` with progress going 0 -> 1 at ``total_steps``."""

    def schedule(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
        def factor(step: int) -> float:
            if step < warmup_steps:
                return _warmup(step, warmup_steps)
            return decay(min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))

        return factor

    return schedule


SCHEDULERS: dict[str, LRSchedule] = {
    "constant": _decay(lambda progress: 1.0),
    "linear": _decay(lambda progress: 1.0 - progress),
    "cosine": _decay(lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress))),
}


def adamw_with_schedule(
    module: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    scheduler: str,
    warmup_steps: int,
    total_steps: int,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> dict:
    """AdamW over ``module``'s trainable parameters, stepped per optimiser step with a named schedule.

    Weight decay applies to matrices only (biases, norms and scalar heads' biases are not decayed).
    Returns what ``LightningModule.configure_optimizers`` returns.
    """
    trainable = [p for p in module.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, eps=eps)
    lr_scheduler = LambdaLR(optimizer, SCHEDULERS[scheduler](warmup_steps, max(1, total_steps)))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "interval": "step"}}
