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


def rank() -> int:
    """This process's rank in the default group; 0 without an initialised process group."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rank_seed(seed: int, rank: int) -> int:
    """A seed for ``rank``'s own random stream, deterministic in ``(seed, rank)`` and distinct across ranks
    (numpy's ``SeedSequence`` hash of the pair, 63 bits)."""
    import numpy as np

    return int(np.random.SeedSequence([int(seed), int(rank)]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def seed_rank_stream(seed: int | None = None) -> int | None:
    """With more than one rank, reseed torch's global generator (CPU and every CUDA device) with
    :func:`rank_seed` ``(seed, rank)``, so that each rank samples its own stream (``generate`` draws from the
    global generator); ``seed`` defaults to ``torch.initial_seed()`` (what ``seed_everything`` set, the same on
    every rank). Call it after the model is built and sharded: initialisation must stay identical on every rank.
    Returns the seed used, or None in a single process (left untouched, so single-process runs do not change).
    """
    if world_size() == 1:
        return None
    own = rank_seed(torch.initial_seed() if seed is None else seed, rank())
    torch.manual_seed(own)
    return own


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


__all__ = ["any_across_ranks", "global_all_reduce", "global_weighted_mean", "rank", "rank_seed", "seed_rank_stream",
           "sum_across_ranks", "world_size"]
