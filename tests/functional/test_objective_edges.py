"""Boundaries and defaults of the RL objectives' building blocks: GAE's working dtype, the group advantages' errors
and defaults, the KL penalties and controllers, the policy losses' parameter checks and stats, the off-policy
limit and the per-token preference scores."""

import pytest
import torch

from lrlhf.functional.advantages import gae, grpo_advantages, informative_groups, rloo_advantages
from lrlhf.functional.kl import AdaptiveKLController, FixedKLController, KLInReward, kl_k1, kl_penalty
from lrlhf.functional.off_policy import MaskedIS
from lrlhf.functional.policy_losses import ClipHigher, ClipPPO, DualClip, SequenceSumNorm
from lrlhf.functional.preference_losses import SimPOLoss


def test_gae_computes_in_the_values_dtype():
    # 1 + 2**-24 is not a float32: GAE rounds the rewards to the values' dtype before accumulating
    rewards = torch.tensor([[2.0 ** -24, 1.0 + 2.0 ** -24]], dtype=torch.float64)
    values = torch.zeros(1, 2, dtype=torch.float32)
    mask = torch.ones(1, 2, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    ref_adv, ref_ret = gae(rewards.float(), values, mask.float(), gamma=1.0, lam=1.0)
    assert adv.dtype == ret.dtype == torch.float32
    assert torch.equal(adv, ref_adv)
    assert torch.equal(ret, ref_ret)


@pytest.mark.parametrize(
    ("fn", "name"),
    [(rloo_advantages, "rloo_advantages"), (grpo_advantages, "grpo_advantages"),
     (informative_groups, "informative_groups")],
)
def test_group_functions_name_themselves_in_shape_errors(fn, name):
    with pytest.raises(ValueError, match=rf"^{name}: rewards must be \(B,\), got shape \(2, 2\)$"):
        fn(torch.zeros(2, 2), 2)


def test_grpo_default_eps_is_one_millionth():
    rewards = torch.tensor([0.0, 2.0, 5.0, 5.0], dtype=torch.float64)
    r = rewards.reshape(-1, 2)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(-1)
    torch.testing.assert_close(grpo_advantages(rewards, 2), expected, rtol=0, atol=1e-15)


def test_kl_penalty_default_estimator_is_k1():
    logprobs = torch.tensor([-0.5, -2.0, -1.0])
    ref = torch.tensor([-1.0, -1.5, -1.0])
    torch.testing.assert_close(kl_penalty(logprobs, ref), kl_k1(logprobs, ref))


def test_kl_in_reward_refuses_a_loss_term_naming_its_class():
    with pytest.raises(NotImplementedError, match="^KLInReward puts the KL in the reward"):
        KLInReward().per_token(torch.zeros(2), torch.zeros(2))


def test_fixed_kl_controller_accepts_zero():
    assert FixedKLController(kl_coef=0.0).value == 0.0


def test_adaptive_kl_controller_has_no_stats_before_its_first_update():
    ctl = AdaptiveKLController()
    assert ctl.stats() == {}
    ctl.update(current_kl=2 * ctl.target, n_steps=1)
    assert set(ctl.stats()) == {"target", "error"}


def test_clip_eps_of_one_is_rejected():
    with pytest.raises(ValueError, match="clip_eps must be in"):
        ClipPPO(clip_eps=1.0)


def test_clip_higher_checks_eps_low():
    with pytest.raises(ValueError, match="eps_low must be in"):
        ClipHigher(eps_low=1.5)


def test_dual_clip_accepts_clip_c_between_one_and_two():
    assert DualClip(clip_c=1.5).clip_c == 1.5


def test_dual_clip_caps_only_negative_advantages():
    loss = DualClip(clip_eps=0.2, clip_c=3.0)
    ratio = torch.tensor([1.0, 1.0, 5.0])
    adv = torch.tensor([0.5, 0.0, -0.5])
    unclipped, chosen = loss.per_token(ratio, adv)
    # a positive advantage below 1 is the plain clipped surrogate; a negative one is capped at -c A
    assert chosen.tolist() == [-0.5, 0.0, 1.5]
    assert unclipped.tolist() == [-0.5, 0.0, 2.5]


def test_policy_loss_ratio_max_ignores_masked_positions():
    logprobs = torch.log(torch.tensor([[0.5, 0.8, 3.0]], dtype=torch.float64))
    old = torch.zeros(1, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    _, stats = ClipPPO()(logprobs, old, torch.ones(1, 3, dtype=torch.float64), mask)
    assert stats.ratio_max.item() == pytest.approx(0.8, rel=1e-12)


def test_policy_loss_of_an_empty_minibatch_is_zero():
    empty = torch.zeros(0, 4)
    loss, stats = ClipPPO()(empty, empty, empty, empty.bool())
    assert loss.item() == 0.0
    assert stats.ratio_max.item() == 0.0


@pytest.mark.parametrize(("rows", "expected"), [(0, 4.0), (1, 4.0), (3, 12.0)])
def test_sequence_sum_norm_divides_by_rows_times_tokens(rows, expected):
    assert SequenceSumNorm(tokens=4).denominator(torch.ones(rows, 2, dtype=torch.bool)).item() == expected


def test_masked_is_keeps_a_weight_equal_to_the_cap():
    w = torch.tensor([1.0, 2.0, 2.5], dtype=torch.float64)
    assert MaskedIS(cap=2.0).limit(w).tolist() == [1.0, 2.0, 0.0]


def test_simpo_accepts_a_zero_margin():
    assert SimPOLoss(gamma=0.0).gamma == 0.0


def test_per_token_scores_divide_by_the_token_count_in_the_scores_dtype():
    logps = torch.tensor([-3.0, -4.0, -5.0])
    lengths = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    scores = SimPOLoss().scores(logps, None, lengths)
    assert scores.dtype == torch.float32
    assert scores.tolist() == [-3.0, -2.0, -5.0]  # an empty completion divides by 1


def test_per_token_scores_need_the_token_counts():
    with pytest.raises(ValueError, match="^a per-token preference loss needs the completions' token counts$"):
        SimPOLoss().scores(torch.zeros(2), None, None)
