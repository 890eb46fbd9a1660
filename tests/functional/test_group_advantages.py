"""RLOO and GRPO advantages worked out by hand."""

import pytest
import torch

from lrlhf.functional import grpo_advantages, rloo_advantages


def test_rloo_by_hand():
    # group 0: rewards 1, 2, 6 -> baselines (2+6)/2 = 4, (1+6)/2 = 3.5, (1+2)/2 = 1.5 -> -3, -1.5, 4.5
    # group 1: rewards 0, 0, 3 -> baselines 1.5, 1.5, 0 -> -1.5, -1.5, 3
    rewards = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])
    adv = rloo_advantages(rewards, k=3)
    torch.testing.assert_close(adv, torch.tensor([-3.0, -1.5, 4.5, -1.5, -1.5, 3.0]), atol=1e-7, rtol=0)
    # RLOO is (k / (k - 1)) * (r - group mean): group 0 mean 3 -> 1.5 * (-2, -1, 3)
    assert torch.allclose(adv.reshape(2, 3).sum(1), torch.zeros(2))


def test_grpo_by_hand():
    # group 0: 1, 2, 6: mean 3, unbiased var ((-2)^2 + (-1)^2 + 3^2) / 2 = 7, std sqrt(7) = 2.6457513
    # group 1: all equal -> 0 whatever the scale
    rewards = torch.tensor([1.0, 2.0, 6.0, 4.0, 4.0, 4.0])
    adv = grpo_advantages(rewards, k=3, eps=0.0 + 1e-6)
    s = 7**0.5 + 1e-6
    torch.testing.assert_close(adv, torch.tensor([-2 / s, -1 / s, 3 / s, 0.0, 0.0, 0.0]), atol=1e-6, rtol=0)
    unscaled = grpo_advantages(rewards, k=3, scale=False)
    torch.testing.assert_close(unscaled, torch.tensor([-2.0, -1.0, 3.0, 0.0, 0.0, 0.0]), atol=1e-7, rtol=0)


def test_k2_rloo_is_the_pairwise_difference():
    # k = 2: A = r_i - r_other
    torch.testing.assert_close(rloo_advantages(torch.tensor([3.0, 1.0]), k=2), torch.tensor([2.0, -2.0]))


@pytest.mark.parametrize("fn", [rloo_advantages, grpo_advantages])
def test_group_errors(fn):
    with pytest.raises(ValueError, match="k >= 2"):
        fn(torch.zeros(4), k=1)
    with pytest.raises(ValueError, match="groups of k=3"):
        fn(torch.zeros(4), k=3)


def test_informative_groups_by_hand():
    from lrlhf.functional import informative_groups

    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 3.0, 0.0])
    assert informative_groups(scores, 2).tolist() == [False, True, False, True]
    assert informative_groups(scores, 4).tolist() == [True, True]
    assert informative_groups(torch.tensor([0.5, 0.52, 0.0, 1.0]), 2, tolerance=0.05).tolist() == [False, True]
