import math
import re

import pytest
import torch
import torch.nn.functional as F

from lrlhf.functional import (
    ClipPPO,
    bradley_terry_loss,
    dpo_loss,
    explained_variance,
    kto_loss,
    ranking_loss,
    value_loss,
)


# --- PPO policy loss ----------------------------------------------------------------------------------
def test_ratio_is_one_before_the_first_update():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 6, generator=g)
    mask = torch.rand(4, 6, generator=g) > 0.3
    loss, stats = ClipPPO(0.2)(logp, logp.clone(), adv, mask)
    assert loss.item() == pytest.approx(-adv[mask].mean().item(), abs=1e-6)
    assert stats.ratio_mean.item() == 1.0 and stats.ratio_max.item() == 1.0
    assert stats.clipfrac.item() == 0.0 and stats.approx_kl.item() == 0.0


def test_policy_loss_by_hand():
    # token 0: rho = e, A = +1 -> max(-e, -1.2) = -1.2 (clipped term active, zero gradient)
    # token 1: rho = e, A = -1 -> max(e, 1.2) = e (unclipped term active)
    # token 2: padding with absurd values, ignored
    logp = torch.tensor([[1.0, 1.0, 50.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 1e6]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = ClipPPO(0.2)(logp, old, adv, mask)
    e = math.e
    assert loss.item() == pytest.approx((-1.2 + e) / 2, abs=1e-6)
    assert stats.clipfrac.item() == pytest.approx(0.5, abs=1e-6)
    assert stats.approx_kl.item() == pytest.approx(e - 2, abs=1e-6)  # (rho - 1) - log rho = e - 1 - 1
    assert stats.ratio_mean.item() == pytest.approx(e, abs=1e-6)
    assert stats.ratio_max.item() == pytest.approx(e, abs=1e-6)
    loss.backward()
    # d/dlogp of (-A * rho) / 2 = -A * rho / 2 = e/2 for token 1; 0 for the clipped and the padded token
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, e / 2, 0.0]]), atol=1e-6, rtol=0)


def test_policy_loss_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=g, dtype=torch.float64)
    logp = (old + 0.05 * torch.randn(3, 5, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 5, generator=g) > 0.3
    assert torch.autograd.gradcheck(lambda x: ClipPPO(0.2)(x, old, adv, mask)[0], (logp,))


# --- value loss ---------------------------------------------------------------------------------------
def test_value_loss_by_hand():
    # token 0: V=2, old=1, R=0, eps .5: (2-0)^2 = 4 vs V_clip=1.5 -> 2.25; max 4, unclipped active
    # token 1: V=1.2, old=1, R=3, eps .5 -> V_clip=1.2 (inside); both 3.24
    values = torch.tensor([[2.0, 1.2, 7.0]], requires_grad=True)
    loss, stats = value_loss(
        values,
        torch.tensor([[1.0, 1.0, 0.0]]),
        torch.tensor([[0.0, 3.0, 0.0]]),
        torch.tensor([[True, True, False]]),
        clip_eps=0.5,
    )
    assert loss.item() == pytest.approx(0.5 * (4.0 + 3.24) / 2, abs=1e-6)
    assert stats.clipfrac.item() == 0.0
    assert stats.value_mean.item() == pytest.approx(1.6, abs=1e-6)


def test_value_loss_clipped_branch_has_no_gradient():
    # V=1.2, old=1, R=3, eps .1: unclipped (1.2-3)^2 = 3.24; V_clip = 1.1 -> (1.1-3)^2 = 3.61 wins
    values = torch.tensor([1.2], requires_grad=True)
    loss, stats = value_loss(values, torch.tensor([1.0]), torch.tensor([3.0]), torch.tensor([True]), clip_eps=0.1)
    assert loss.item() == pytest.approx(0.5 * 3.61, abs=1e-6)
    assert stats.clipfrac.item() == 1.0
    loss.backward()
    assert values.grad.item() == 0.0


def test_value_loss_without_clip_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(3, 4, generator=g, dtype=torch.float64).requires_grad_()
    old, returns = (
        torch.randn(3, 4, generator=g, dtype=torch.float64),
        torch.randn(3, 4, generator=g, dtype=torch.float64),
    )
    mask = torch.rand(3, 4, generator=g) > 0.3
    loss, _ = value_loss(values, old, returns, mask)
    assert loss.item() == pytest.approx(0.5 * ((values - returns)[mask] ** 2).mean().item(), abs=1e-12)
    assert torch.autograd.gradcheck(lambda v: value_loss(v, old, returns, mask, clip_eps=0.3)[0], (values,))


def test_value_loss_clips_a_value_below_the_old_one_from_below():
    # token 0: V=0, old=1, eps .1 -> V_clip = 0.9; R=-1: unclipped 1, clipped 1.9^2 = 3.61 wins
    # token 1: V=2, old=1 -> V_clip = 1.1; R=3: unclipped 1, clipped 1.9^2 = 3.61 wins
    values = torch.tensor([0.0, 2.0], dtype=torch.float64)
    loss, stats = value_loss(values, torch.ones(2, dtype=torch.float64), torch.tensor([-1.0, 3.0], dtype=torch.float64),
                             torch.ones(2, dtype=torch.bool), clip_eps=0.1)
    assert loss.item() == pytest.approx(0.5 * 1.9**2, abs=1e-12)
    assert stats.clipfrac.item() == 1.0


def test_value_loss_without_clip_reports_no_clipped_token():
    values = torch.tensor([[1.0, 5.0]], dtype=torch.float64)
    loss, stats = value_loss(values, values + 10, torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.5 * (1 + 25) / 2, abs=1e-12)
    assert torch.equal(stats.clipfrac, torch.zeros((), dtype=torch.float64))
    assert stats.value_mean.item() == 3.0


def test_explained_variance_by_hand():
    # R = 1,2,3 (var 2/3); R - V = 0,0,1 (var 2/9) -> 1 - (2/9)/(2/3) = 2/3
    mask = torch.tensor([True, True, True, False])
    ev = explained_variance(torch.tensor([1.0, 2.0, 2.0, 9.0]), torch.tensor([1.0, 2.0, 3.0, -9.0]), mask)
    assert ev.item() == pytest.approx(2 / 3, abs=1e-6)
    assert explained_variance(torch.ones(3), torch.ones(3), torch.ones(3, dtype=torch.bool)).item() == 0.0


# --- Bradley-Terry and rankings -----------------------------------------------------------------------
def test_bradley_terry_by_hand_and_stable():
    # margin 1: -log sigmoid(1) = log(1 + e^-1)
    assert bradley_terry_loss(torch.tensor([2.0]), torch.tensor([1.0])).item() == pytest.approx(
        math.log1p(math.exp(-1)), abs=1e-6
    )
    big = bradley_terry_loss(torch.tensor([0.0, 1000.0]), torch.tensor([1000.0, 0.0]))
    assert big.item() == pytest.approx(500.0, abs=1e-3)  # (1000 + 0) / 2, finite


def test_bradley_terry_tie_target_is_bce_at_half():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.3]), torch.tensor([1.0, 0.5, 0.3])
    margin = chosen - rejected
    expected = F.binary_cross_entropy(torch.sigmoid(margin), torch.full_like(margin, 0.5))
    assert bradley_terry_loss(chosen, rejected, target=0.5).item() == pytest.approx(expected.item(), abs=1e-6)
    # by hand for margin 1: 0.5 * (log(1 + e^-1) + log(1 + e))
    by_hand = 0.5 * (math.log1p(math.exp(-1)) + math.log1p(math.e))
    assert bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), 0.5).item() == pytest.approx(by_hand, abs=1e-6)
    # hard target 1 is the plain loss
    assert bradley_terry_loss(chosen, rejected, target=torch.ones(3)).item() == pytest.approx(
        bradley_terry_loss(chosen, rejected).item(), abs=1e-6
    )


def test_bradley_terry_gradcheck():
    g = torch.Generator().manual_seed(0)
    c = torch.randn(5, generator=g, dtype=torch.float64).requires_grad_()
    r = torch.randn(5, generator=g, dtype=torch.float64).requires_grad_()
    t = torch.rand(5, generator=g, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: bradley_terry_loss(a, b, t), (c, r))


def _bt(first, second, target=1.0):
    return F.binary_cross_entropy_with_logits(torch.tensor(first - second), torch.tensor(target)).item()


def test_ranking_loss_averages_per_prompt_first():
    # prompt 0: 2 candidates (1 pair); prompt 1: 4 candidates with a tie (6 pairs)
    rewards = torch.tensor([1.0, 0.0, 0.5, -0.5, 2.0, 0.0])
    ranks = torch.tensor([2, 1, 1, 3, 2, 2])
    group = torch.tensor([7, 7, 3, 3, 3, 3])
    p0 = _bt(0.0, 1.0)  # rank 1 (reward 0) beats rank 2 (reward 1)
    p1 = [
        _bt(0.5, -0.5),
        _bt(0.5, 2.0),
        _bt(0.5, 0.0),  # rank 1 beats everyone
        _bt(2.0, -0.5),
        _bt(0.0, -0.5),  # the two rank-2 beat rank 3
        _bt(2.0, 0.0, 0.5),  # the two rank-2 tie
    ]
    expected = (p0 + sum(p1) / 6) / 2
    assert ranking_loss(rewards, ranks, group).item() == pytest.approx(expected, abs=1e-6)
    flat = (p0 + sum(p1)) / 7  # what a flat mean over pairs would give: the larger prompt would weigh more
    assert abs(expected - flat) > 1e-2


def test_ranking_loss_with_two_candidates_equals_bradley_terry():
    g = torch.Generator().manual_seed(0)
    chosen, rejected = torch.randn(5, generator=g), torch.randn(5, generator=g)
    rewards = torch.stack([rejected, chosen], dim=1).reshape(-1)  # rejected first: orientation comes from ranks
    ranks = torch.tensor([2, 1] * 5)
    group = torch.arange(5).repeat_interleave(2)
    assert ranking_loss(rewards, ranks, group).item() == pytest.approx(
        bradley_terry_loss(chosen, rejected).item(), abs=1e-6
    )


def test_ranking_loss_is_order_invariant_and_skips_singletons():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(9, generator=g)
    ranks = torch.tensor([1, 2, 3, 1, 1, 2, 1, 2, 1])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 5])  # group 5 has one candidate: no pair
    perm = torch.randperm(9, generator=g)
    a = ranking_loss(rewards, ranks, group)
    b = ranking_loss(rewards[perm], ranks[perm], group[perm])
    assert a.item() == pytest.approx(b.item(), abs=1e-6)
    c = ranking_loss(rewards[:8], ranks[:8], group[:8])
    assert a.item() == pytest.approx(c.item(), abs=1e-6)
    with pytest.raises(ValueError, match="no group has two candidates"):
        ranking_loss(torch.zeros(2), torch.ones(2), torch.tensor([0, 1]))


def test_ranking_loss_tie_keeps_the_pair_order_for_an_asymmetric_tie_target():
    # a tie at target 0.8 is not symmetric: the earlier candidate of the pair is "first"
    rewards = torch.tensor([1.0, 3.0, 0.5, 0.5, -2.0], dtype=torch.float64)
    ranks = torch.tensor([1, 1, 2, 1, 1])
    group = torch.tensor([0, 0, 1, 1, 1])
    # group 1: (2, 3) rank 1 (index 3) beats rank 2; (2, 4) likewise; (3, 4) a tie, index 3 first
    expected = (_bt(1.0, 3.0, 0.8) + (_bt(0.5, 0.5) + _bt(-2.0, 0.5) + _bt(0.5, -2.0, 0.8)) / 3) / 2
    assert ranking_loss(rewards, ranks, group, tie_target=0.8).item() == pytest.approx(expected, abs=1e-6)
    assert abs(_bt(1.0, 3.0, 0.8) - _bt(3.0, 1.0, 0.8)) > 1  # the orientation matters here


def test_ranking_loss_stays_on_the_inputs_device_whatever_the_default_device():
    rewards = torch.tensor([1.0, 0.0, 0.5, -0.5, 2.0], dtype=torch.float64)
    ranks, group = torch.tensor([2, 1, 1, 3, 2]), torch.tensor([7, 7, 3, 3, 3])
    expected = ranking_loss(rewards, ranks, group)
    with torch.device("meta"):  # a factory call without an explicit device lands here
        got = ranking_loss(rewards, ranks, group)
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_ranking_loss_without_a_pair_says_so():
    message = "ranking_loss: no group has two candidates, there is no pair to compare"
    with pytest.raises(ValueError, match=f"^{message}$"):
        ranking_loss(torch.zeros(3), torch.ones(3), torch.tensor([0, 1, 2]))


def test_ranking_loss_gradcheck():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(7, generator=g, dtype=torch.float64).requires_grad_()
    ranks = torch.tensor([1, 2, 2, 1, 3, 2, 1])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    assert torch.autograd.gradcheck(lambda r: ranking_loss(r, ranks, group), (rewards,))


# --- DPO ----------------------------------------------------------------------------------------------
def test_dpo_by_hand():
    # h = (-1 - -2) - (-3 - -2) = 2; beta h = 0.2; loss = log(1 + e^-0.2)
    args = [torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0])]
    loss, stats = dpo_loss(*args, beta=0.1)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-6)
    assert stats.chosen_rewards.item() == pytest.approx(0.1, abs=1e-6)
    assert stats.rejected_rewards.item() == pytest.approx(-0.1, abs=1e-6)
    assert stats.reward_margin.item() == pytest.approx(0.2, abs=1e-6)
    assert stats.accuracy.item() == 1.0
    smoothed, _ = dpo_loss(*args, beta=0.1, label_smoothing=0.1)
    expected = 0.9 * math.log1p(math.exp(-0.2)) + 0.1 * math.log1p(math.exp(0.2))
    assert smoothed.item() == pytest.approx(expected, abs=1e-6)


def test_dpo_at_init_is_log2_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    chosen, rejected = (
        torch.randn(4, generator=g, dtype=torch.float64),
        torch.randn(4, generator=g, dtype=torch.float64),
    )
    loss, stats = dpo_loss(chosen, rejected, chosen, rejected, beta=0.5)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-12)
    assert stats.accuracy.item() == 0.0
    pc, pr = chosen.clone().requires_grad_(), rejected.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: dpo_loss(a, b, chosen * 0.9, rejected, beta=0.5)[0], (pc, pr))
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(chosen, rejected, chosen, rejected, beta=0.5, label_smoothing=0.5)


# --- KTO ----------------------------------------------------------------------------------------------
def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_kto_loss_by_hand_with_weights_and_a_positive_reference_point():
    f64 = dict(dtype=torch.float64)
    policy, ref = torch.tensor([1.0, -0.5, 0.3], **f64), torch.tensor([0.2, 0.1, -0.4], **f64)
    policy_kl, ref_kl = torch.tensor([0.5, 0.2, 0.1], **f64), torch.tensor([0.1, 0.3, -0.2], **f64)
    desirable = torch.tensor([1, 0, 1])  # any 0/1 tensor: made bool
    beta, w_d, w_u = 0.5, 1.5, 0.7
    z0 = (0.4 - 0.1 + 0.3) / 3  # mean of policy_kl - ref_kl, positive: not clamped
    r = [0.8, -0.6, 0.7]
    expected = (w_d * (1 - _sigmoid(beta * (r[0] - z0))) + w_u * (1 - _sigmoid(beta * (z0 - r[1])))
                + w_d * (1 - _sigmoid(beta * (r[2] - z0)))) / 3
    loss, stats = kto_loss(policy, ref, policy_kl, ref_kl, desirable, beta, w_d, w_u)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert stats.kl.item() == pytest.approx(z0, abs=1e-12)
    torch.testing.assert_close(stats.rewards, beta * torch.tensor(r, **f64), atol=1e-12, rtol=0)
    # the default weights are 1
    default, _ = kto_loss(policy, ref, policy_kl, ref_kl, desirable, beta)
    assert default.item() == pytest.approx(((1 - _sigmoid(beta * (r[0] - z0))) + (1 - _sigmoid(beta * (z0 - r[1])))
                                            + (1 - _sigmoid(beta * (r[2] - z0)))) / 3, abs=1e-12)


def test_kto_reference_point_is_clamped_at_zero():
    f64 = dict(dtype=torch.float64)
    loss, stats = kto_loss(torch.tensor([2.0], **f64), torch.zeros(1, **f64), torch.tensor([-3.0], **f64),
                           torch.zeros(1, **f64), torch.tensor([False]), beta=1.0)
    assert stats.kl.item() == 0.0
    assert loss.item() == pytest.approx(1 - _sigmoid(0.0 - 2.0), abs=1e-12)


@pytest.mark.parametrize(("beta", "w_d", "w_u"), [(0.0, 1.0, 1.0), (-0.1, 1.0, 1.0), (1.0, 0.0, 1.0),
                                                   (1.0, -1.0, 1.0), (1.0, 1.0, 0.0), (1.0, 1.0, -2.0)])
def test_kto_loss_refuses_a_setting_that_is_not_positive(beta, w_d, w_u):
    x = torch.zeros(2)
    message = f"kto_loss: beta ({beta}) and the weights ({w_d}, {w_u}) must be > 0"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        kto_loss(x, x, x, x, torch.tensor([True, False]), beta, w_d, w_u)


def test_kto_loss_accepts_small_positive_settings():
    x = torch.zeros(2, dtype=torch.float64)
    loss, _ = kto_loss(x, x, x, x, torch.tensor([True, False]), beta=0.5, desirable_weight=0.5,
                       undesirable_weight=0.25)
    assert loss.item() == pytest.approx((0.5 * 0.5 + 0.25 * 0.5) / 2, abs=1e-12)
