"""ResumableSampler: deterministic order, exact resume (also across epochs), disjoint DDP shards."""

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lrlhf.data.sampler import ResumableSampler


def test_order_is_seed_plus_epoch_permutation():
    sampler = ResumableSampler(10, seed=3)
    first = list(sampler)
    second = list(sampler)  # the sampler moved on to epoch 1 by itself
    assert first == torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    assert second == torch.randperm(10, generator=torch.Generator().manual_seed(4)).tolist()
    assert first != second and sorted(first) == list(range(10))
    assert list(ResumableSampler(10, seed=3)) == first


def test_no_shuffle_is_identity():
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def _batches(loader, sampler, n):
    """The next n batches, crossing epochs like a training loop (Lightning calls set_epoch first)."""
    out = []
    while len(out) < n:
        sampler.set_epoch(sampler.state_dict()["epoch"])
        for batch in loader:
            out.append(batch.tolist())
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("consumed", [1, 3, 4, 6])  # 10 items, batch 3 -> 4 batches/epoch; 4 and 6 cross it
def test_resume_yields_exactly_the_remaining_batches(consumed):
    total = 11

    def make():
        sampler = ResumableSampler(10, seed=7)
        return sampler, DataLoader(list(range(10)), batch_size=3, sampler=sampler)

    sampler, loader = make()
    straight = _batches(loader, sampler, total)

    sampler, loader = make()
    head = _batches(loader, sampler, consumed)
    state = sampler.state_dict()
    sampler, loader = make()
    sampler.load_state_dict(state)
    tail = _batches(loader, sampler, total - consumed)
    assert head + tail == straight


def test_state_after_a_full_epoch_points_to_the_next_epoch():
    sampler = ResumableSampler(4, seed=0)
    it = iter(sampler)
    for _ in range(4):
        next(it)
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["position"] == 0


def test_set_epoch_keeps_position_of_current_epoch_only():
    sampler = ResumableSampler(6, seed=1)
    sampler.load_state_dict({**sampler.state_dict(), "epoch": 2, "position": 4})
    sampler.set_epoch(2)
    assert list(sampler) == sampler.epoch_indices(2)[4:]
    sampler.set_epoch(5)
    assert list(sampler) == sampler.epoch_indices(5)


def test_load_refuses_a_different_dataset_or_seed():
    state = ResumableSampler(6, seed=1).state_dict()
    with pytest.raises(ValueError, match="checkpoint has dataset_size=6, this run has 7"):
        ResumableSampler(7, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="checkpoint has seed=1, this run has 2"):
        ResumableSampler(6, seed=2).load_state_dict(state)


@pytest.mark.parametrize(("n", "world", "drop_last"), [(12, 3, False), (10, 4, False), (10, 4, True)])
def test_ddp_shards_are_disjoint_and_cover_the_epoch(n, world, drop_last):
    shards = [list(ResumableSampler(n, seed=5, num_replicas=world, rank=r, drop_last=drop_last))
              for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # equal length: every rank runs the same number of steps
    flat = [i for s in shards for i in s]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(5)).tolist()
    if drop_last:  # 10 over 4 ranks: 8 distinct indices, the last 2 of the order are left out
        assert sorted(flat) == sorted(order[:8])
    elif n % world == 0:
        assert sorted(flat) == list(range(n))
    else:  # 10 over 4 ranks: padded to 12 by repeating the first 2 indices of the order
        assert sorted(flat) == sorted(order + order[:2])
    assert isinstance(ResumableSampler(n), DistributedSampler)  # so Lightning does not replace it
