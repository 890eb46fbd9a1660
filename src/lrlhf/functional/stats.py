"""Interval estimates over independent units (prompts, pairs)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def bootstrap_interval(values: Sequence[float], n_resamples: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one value per independent unit, e.g. per prompt:
    the units are resampled). For a paired comparison pass the per-unit differences of the two sides."""
    x = torch.as_tensor(list(values), dtype=torch.float64)
    if x.numel() == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    g = torch.Generator().manual_seed(seed)
    means = x[torch.randint(0, x.numel(), (n_resamples, x.numel()), generator=g)].mean(1)
    tail = (1.0 - level) / 2
    return means.quantile(tail).item(), means.quantile(1.0 - tail).item()


__all__ = ["bootstrap_interval"]
