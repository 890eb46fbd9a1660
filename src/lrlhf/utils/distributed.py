"""Cross-rank reductions for statistics that must be global (whitening, the KL the controller sees).

Each helper is the identity in a single process (no process group, or a world of one), so code calling them
runs unchanged without a strategy. Every rank must call a helper the same number of times in the same order:
they are collectives.
"""

from __future__ import annotations

import torch
from torch import Tensor


def world_size() -> int:
    """Processes in the default group; 1 without an initialised process group."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def sum_across_ranks(x: Tensor) -> Tensor:
    """``x`` summed over every rank (a new tensor; ``x`` is left alone). The :data:`AllReduce` contract of
    :func:`lrlhf.functional.masked_whiten`."""
    if world_size() == 1:
        return x
    out = x.detach().clone()
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
    return out


def global_all_reduce():
    """:func:`sum_across_ranks` when more than one process trains, else None (local statistics, no collective)."""
    return sum_across_ranks if world_size() > 1 else None


def _scalar_device() -> torch.device:
    """Where a new scalar must live for the collective: NCCL reduces CUDA tensors only."""
    if world_size() > 1 and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def global_weighted_mean(value: float, weight: float) -> tuple[float, float]:
    """``(sum(value * weight) / sum(weight), sum(weight))`` over ranks: e.g. a per-rank mean and its row count
    give the mean over the whole global batch (0 when every weight is 0)."""
    both = sum_across_ranks(torch.tensor([value * weight, weight], dtype=torch.float64, device=_scalar_device()))
    total, count = float(both[0]), float(both[1])
    return (total / count if count > 0 else 0.0), count


def any_across_ranks(flag: bool) -> bool:
    """True when ``flag`` holds on at least one rank (every rank gets the same answer)."""
    return bool(sum_across_ranks(torch.tensor([float(flag)], device=_scalar_device()))[0] > 0)


__all__ = ["any_across_ranks", "global_all_reduce", "global_weighted_mean", "sum_across_ranks", "world_size"]
