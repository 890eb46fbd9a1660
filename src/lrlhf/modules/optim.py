"""Optimiser and learning-rate schedules shared by the LightningModules."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from lrlhf.utils.distributed import any_across_ranks

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



@dataclass
class OptimConfig:
    """The optimiser and schedule fields every module config shares (``module.config.<field>``), declared and
    checked here once. A module's config subclasses it and may change a default (its own ``lr``; PPO's
    ``scheduler``, whose length is in optimiser steps it cannot know before the first rollout)."""

    lr: float = 1e-4
    """AdamW learning rate (peak, after warmup)."""
    weight_decay: float = 0.0
    """AdamW weight decay, applied to matrices only (not to biases, norms or scalar heads' biases)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Optimiser steps of linear warmup from 0 to ``lr``."""
    scheduler: str = "cosine"
    """Learning-rate schedule after warmup: a name in :data:`SCHEDULERS` (``constant``, ``linear``, ``cosine``)."""
    total_steps: int | None = None
    """Length of the schedule in optimiser steps; None = the Trainer's ``estimated_stepping_batches``."""

    def check_optim(self) -> None:
        """Raise naming the key the user types (``module.config.<field>``); call first in ``__post_init__``."""
        self.betas = tuple(self.betas)
        checks = [
            ("lr", self.lr > 0, "must be > 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("betas", len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "must be two values in [0, 1)"),
            ("eps", self.eps > 0, "must be > 0"),
            ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
            ("scheduler", self.scheduler in SCHEDULERS, f"must be one of {sorted(SCHEDULERS)}"),
            ("total_steps", self.total_steps is None or self.total_steps > 0, "must be > 0 or None"),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ValueError(f"module.config.{key} {rule}, got {getattr(self, key)!r}")

    def optimizers(self, module: nn.Module, total_steps: int) -> dict:
        """:func:`adamw_with_schedule` over ``module`` with these settings (``self.total_steps`` wins when set)."""
        return adamw_with_schedule(module, lr=self.lr, weight_decay=self.weight_decay, betas=self.betas, eps=self.eps,
                                   scheduler=self.scheduler, warmup_steps=self.warmup_steps,
                                   total_steps=self.total_steps or total_steps)


def _likely_cause(lr: float, lr_key: str) -> str:
    return (f"Likely cause: the learning rate {lr_key}={lr:g} is too high and an update diverged (lower it, or add "
            "warmup); otherwise check the data (a batch without targets) and the precision (fp16 overflow: try "
            "trainer.precision=bf16-mixed or 32-true)")


def check_finite(value: Tensor, what: str, stage: str, step: int, lr: float, lr_key: str = "module.config.lr",
                 stopped: str = "before the optimiser step", across_ranks: bool = True) -> Tensor:
    """Raise :class:`FloatingPointError` when ``value`` (a loss, or scores) holds a NaN or an infinity on any rank,
    naming ``what``, the optimiser ``step``, the measured value and the likely cause (the learning rate
    ``lr_key``); returns ``value`` unchanged. Called on the training loss before its backward, so the run stops
    before the optimiser step and no non-finite weights are kept or exported.

    With ``across_ranks`` every rank checks the same flag (one all-reduce of a scalar when distributed), so all of
    them stop together instead of one waiting in a collective for a rank that stopped; False where not every rank
    runs the call (a validation that rank 0 runs alone after training, as the CLI's reward-model test metrics).
    """
    detached = value.detach().float()
    finite = bool(torch.isfinite(detached).all())
    if not (any_across_ranks(not finite) if across_ranks else not finite):
        return value
    if finite:
        measured = "finite here, non-finite on another rank"
    elif detached.numel() == 1:
        measured = f"{detached.item()}"
    else:
        measured = f"{int((~torch.isfinite(detached)).sum())} of {detached.numel()} values non-finite"
    raise FloatingPointError(f"{stage}: non-finite {what} at optimiser step {step} ({measured}); stopped {stopped}, "
                             f"so no non-finite weights are kept or exported. {_likely_cause(lr, lr_key)}")


def check_finite_weights(module: nn.Module, stage: str, step: int, lr: float, lr_key: str = "module.config.lr") -> None:
    """Raise :class:`FloatingPointError` when a trainable parameter of ``module`` holds a NaN or an infinity (after
    the last optimiser step, whose loss was still finite), naming the first such parameter: called at the end of
    training, before anything is evaluated or exported."""
    bad = [name for name, p in module.named_parameters()  # a sharded (DTensor) parameter: this rank's shard
           if p.requires_grad and not bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all())]
    if any_across_ranks(bool(bad)):
        name = bad[0] if bad else "(on another rank)"
        raise FloatingPointError(f"{stage}: non-finite trained weights after optimiser step {step} ({len(bad)} "
                                 f"tensors, first {name}); stopped before export. {_likely_cause(lr, lr_key)}")
