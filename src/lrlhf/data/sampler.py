"""A deterministic, shardable, resumable sampler.

The order of epoch ``e`` is ``torch.randperm(n)`` from a generator seeded with ``seed + e``: the same on every
machine and every rank. Rank ``r`` of ``w`` takes ``order[r::w]`` (after padding the order to a multiple of
``w`` with its own first indices, as ``DistributedSampler`` does, or cutting it with ``drop_last``), so the
shards are disjoint and together cover the epoch.

It subclasses ``DistributedSampler`` on purpose: Lightning (``use_distributed_sampler=True``, the default)
replaces or wraps any other sampler under DDP, which would lose the position; a ``DistributedSampler`` it
leaves alone and only calls ``set_epoch``. The datamodule passes the trainer's rank and world size.

Resume: ``state_dict()`` records the epoch and how many indices this rank has yielded in it; after
``load_state_dict`` the next iteration yields exactly the rest of that epoch, then the following epochs as an
uninterrupted run would. The position counts indices handed to the DataLoader, which equals the indices of
consumed batches with ``num_workers=0``; with workers the loader prefetches, so a checkpoint taken mid-epoch
then skips up to ``prefetch_factor * num_workers`` batches on resume.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler


class ResumableSampler(DistributedSampler):
    """Indices of a map-style dataset of ``num_samples`` items, deterministic from ``seed`` and the epoch."""

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        # Not calling DistributedSampler.__init__: it needs a dataset and may query torch.distributed.
        self.dataset_size = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # indices of this rank already yielded in ``self.epoch``
        if drop_last:
            self.num_samples = num_samples // num_replicas
        else:
            self.num_samples = math.ceil(num_samples / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def epoch_indices(self, epoch: int) -> list[int]:
        """This rank's full index list for ``epoch``."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.dataset_size, generator=generator).tolist()
        else:
            order = list(range(self.dataset_size))
        if self.total_size > len(order):  # pad by repeating from the start (cycling if tiny)
            order += (order * math.ceil(self.total_size / max(len(order), 1)))[: self.total_size - len(order)]
        order = order[: self.total_size]
        return order[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self.epoch_indices(self.epoch)
        while self.position < len(indices):
            index = indices[self.position]
            self.position += 1
            yield index
        # Epoch finished: the next iteration (or a checkpoint taken now) starts the following epoch.
        self.epoch += 1
        self.position = 0

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at every epoch start; keeps the position when it names the current epoch."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def state_dict(self) -> dict[str, int]:
        epoch, position = self.epoch, self.position
        if position >= self.num_samples:  # all yielded but the loader has not asked past the end yet
            epoch, position = epoch + 1, 0
        return {
            "epoch": epoch, "position": position, "seed": self.seed,
            "dataset_size": self.dataset_size, "num_replicas": self.num_replicas, "rank": self.rank,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in ("seed", "dataset_size", "num_replicas"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume sampler: checkpoint has {key}={state[key]}, this run has "
                    f"{getattr(self, key)} (the data, seed or world size changed)"
                )
        self.epoch = state["epoch"]
        self.position = state["position"]
