"""Global statistics across 2 processes (gloo, CPU) equal one process's statistics on the concatenated batch."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lrlhf.functional import AdaptiveKLController, gae, masked_whiten
from lrlhf.modules import PPOModule
from lrlhf.modules.advantages import GAE
from lrlhf.utils.distributed import any_across_ranks, global_all_reduce, global_weighted_mean, world_size

# Rank 0 holds rows 0-1, rank 1 rows 2-5: unequal shares, so a mean of per-rank means would be wrong.
SHARES = [slice(0, 2), slice(2, 6)]
CONFIG = dict(gamma=0.9, lam=0.8)
KL_TARGET = dict(kl_coef=0.1, target=1.0, horizon=100)


def _batch():
    """``(rewards, values, mask)``, ``(6, 5)`` each; rows of 5, 3, 1, 4, 2 and 5 valid actions."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(6, 5, generator=g) * 3 + 1
    values = torch.randn(6, 5, generator=g)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = torch.arange(5)[None] < lengths[:, None]
    return rewards, values, mask


def _whiten_tol(x, mask, out):
    """Bound on the difference of two fp32 whitenings ``out`` of the valid ``x`` that sum in different orders.

    The n-term sums of the mean and of the squared deviations round by at most n u times their absolute terms
    (u = 2^-24): the mean's error e moves an output by (1 + |out|) e / std, the variance's relative error
    (n + 3) u moves it by |out| times half that, each side's last operations add a few u |out|; twice that for
    the two sides.
    """
    valid = x[mask].double()
    n, u = valid.numel(), 2.0**-24
    e = u * (n * valid.abs().mean() + valid.mean().abs())
    return 2 * ((1 + out.abs()) * e / valid.std() + (n + 6) * u * out.abs())


def _module(scope):
    return PPOModule(nn.Linear(1, 1), nn.Linear(1, 1), advantage=GAE(whiten_scope=scope, **CONFIG),
                     kl_controller=AdaptiveKLController(**KL_TARGET))


def _worker(rank, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        rewards, values, mask = (t[SHARES[rank]] for t in _batch())
        out = {"world_size": world_size(), "any": any_across_ranks(rank == 1)}
        out["whitened"] = masked_whiten(rewards, mask, all_reduce=global_all_reduce())
        for scope in ("global", "local"):
            module = _module(scope)
            out[f"advantages_{scope}"] = module.compute_advantages(rewards, values, mask)[0]
        kl_seq = float(rank + 1)  # this rank's mean per-sequence KL over its rows
        module.update_kl_controller({"rollout/kl_seq": kl_seq, "rollout/size": float(len(rewards))})
        out["beta"] = module.kl_controller.value
        out["kl_mean"] = global_weighted_mean(kl_seq, len(rewards))
        torch.save(out, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(str(folder / "init"), str(folder)), nprocs=2, join=True)
    return [torch.load(folder / f"{rank}.pt", weights_only=False) for rank in range(2)]


def test_single_process_helpers_are_the_identity():
    assert world_size() == 1 and global_all_reduce() is None
    assert global_weighted_mean(2.5, 4) == (2.5, 4.0)
    assert any_across_ranks(True) and not any_across_ranks(False)


def test_global_whitening_equals_whitening_of_the_concatenated_batch(ranks):
    rewards, _, mask = _batch()
    expected = masked_whiten(rewards, mask)
    assert [r["world_size"] for r in ranks] == [2, 2]
    got = torch.cat([r["whitened"] for r in ranks])
    assert ((got - expected).abs() <= _whiten_tol(rewards, mask, expected)).all()


def test_ppo_advantages_are_whitened_globally_by_default_and_locally_on_request(ranks):
    rewards, values, mask = _batch()
    expected = _module("global").compute_advantages(rewards, values, mask)[0]  # one process, the whole batch
    got = torch.cat([r["advantages_global"] for r in ranks])
    unwhitened = gae(rewards, values, mask, **CONFIG)[0]  # per row: the same bits in every process
    assert ((got - expected).abs() <= _whiten_tol(unwhitened, mask, expected)).all()
    for rank, share in enumerate(SHARES):
        local = _module("global").compute_advantages(rewards[share], values[share], mask[share])[0]
        torch.testing.assert_close(ranks[rank]["advantages_local"], local, atol=1e-6, rtol=0)
    # the local statistics differ from the global ones (else the test above proves nothing)
    assert (ranks[0]["advantages_local"] - expected[SHARES[0]]).abs().max() > 1e-2


def test_kl_controller_sees_the_global_mean_kl_on_every_rank(ranks):
    # rank 0: 2 rows of mean KL 1; rank 1: 4 rows of mean KL 2 -> global mean (2 + 8) / 6 over 6 rows
    assert ranks[0]["kl_mean"] == ranks[1]["kl_mean"] == pytest.approx((10 / 6, 6.0))
    controller = AdaptiveKLController(**KL_TARGET)
    controller.update(10 / 6, n_steps=6)
    assert ranks[0]["beta"] == ranks[1]["beta"] == pytest.approx(controller.value, abs=1e-12)
    assert ranks[0]["any"] and ranks[1]["any"]


def test_whiten_scope_is_validated():
    with pytest.raises(ValueError, match="module.advantage.whiten_scope must be one of"):
        GAE(whiten_scope="world")
