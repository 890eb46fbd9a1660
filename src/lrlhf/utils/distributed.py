"""Cross-rank reductions for statistics that must be global (whitening, the KL the controller sees).

Each helper is the identity in a single process (no process group, or a world of one), so code calling them
runs unchanged without a strategy. Every rank must call a helper the same number of times in the same order:
they are collectives. The rank helpers (:func:`is_global_zero`, :func:`barrier`, :func:`wait_for_file`) let the
CLI write shared outputs from global rank 0 only, also before the first ``fit`` has created a process group.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import Tensor


def die_with_parent() -> None:
    """In a child process (Linux): SIGTERM when its parent dies, even killed (SIGKILL, the OOM killer): a stage worker
    of ``jobs=N`` or an evaluation worker never outlives its launch. Elsewhere nothing."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def world_size() -> int:
    """Processes in the default group; 1 without an initialised process group."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the default group; 0 without an initialised process group."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_global_zero() -> bool:
    """Whether this process is global rank 0: from the process group once one exists, before it (e.g. before
    the first ``trainer.fit`` of a launch) from the launcher's environment -- ``RANK`` (torchrun), ``NODE_RANK``
    and ``LOCAL_RANK`` (Lightning's own launcher sets them for the processes it starts, and for its first process
    at its first ``fit``), ``SLURM_PROCID`` (srun); none of them: a single process, rank 0."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"]) == 0
    if int(env.get("NODE_RANK", "0")) != 0:
        return False
    if "LOCAL_RANK" in env:  # before SLURM_PROCID: Lightning's children inherit the SLURM variables
        return int(env["LOCAL_RANK"]) == 0
    return int(env.get("SLURM_PROCID", "0")) == 0


def launched_processes() -> int:
    """How many processes an external launcher started (torchrun's or Lightning's ``WORLD_SIZE``, srun's
    ``SLURM_NTASKS``); 1 without one. Lightning's launcher sets it only at the first ``fit``."""
    env = os.environ
    if "WORLD_SIZE" in env:
        return int(env["WORLD_SIZE"])
    if "SLURM_PROCID" in env:
        return int(env.get("SLURM_NTASKS", "1"))
    return 1


def barrier() -> None:
    """Wait for every rank of the default process group; nothing without one (one process, or before the first
    ``fit`` has created it)."""
    if world_size() > 1:
        torch.distributed.barrier()


def wait_for_file(path: str | Path, timeout: float = 1800.0, poll: float = 0.2) -> Path:
    """Wait until ``path`` exists (written atomically by rank 0, before any process group exists to wait on).

    Raises:
        TimeoutError: ``path`` did not appear within ``timeout`` seconds (rank 0 failed or is much slower).
    """
    path, deadline = Path(path), time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s (global rank 0 writes it)")
        time.sleep(poll)
    return path


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


def forward_is_collective(model: torch.nn.Module) -> bool:
    """True when a forward of ``model`` needs every rank (FSDP2 units marked ``_is_fsdp_managed_module`` by
    :func:`lrlhf.strategies.fully_shard_model`, as transformers marks its own; FSDP1 wrappers) and more than one
    process runs: loops of forwards (sampling) must then run the same number of steps on every rank."""
    if world_size() == 1:
        return False
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(getattr(m, "_is_fsdp_managed_module", False) or isinstance(m, FullyShardedDataParallel)
               for m in model.modules())


def any_across_ranks(flag: bool) -> bool:
    """True when ``flag`` holds on at least one rank (every rank gets the same answer)."""
    return bool(sum_across_ranks(torch.tensor([float(flag)], device=_scalar_device()))[0] > 0)


def min_across_ranks(value: int) -> int:
    """The smallest ``value`` over every rank (every rank gets the same answer)."""
    if world_size() == 1:
        return value
    out = torch.tensor([float(value)], dtype=torch.float64, device=_scalar_device())
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MIN)
    return int(out[0])


__all__ = ["any_across_ranks", "barrier", "forward_is_collective", "global_all_reduce", "global_weighted_mean",
           "is_global_zero", "launched_processes", "min_across_ranks", "rank", "rank_seed", "seed_rank_stream",
           "sum_across_ranks", "wait_for_file", "world_size"]


def close_process_group() -> None:
    """Every rank leaves together and closes the default process group (when a ``fit`` created one): a rank that
    exited with the group still open aborted at interpreter exit ("terminate called without an active
    exception", seen once under torchrun)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        barrier()
        torch.distributed.destroy_process_group()
