"""Advantage estimators as objects (lrlhf.modules.advantages): each one's output worked out by hand, the interface
PPOModule reads (``needs_critic``, ``samples_per_prompt``, ``name``), and the errors that name the config keys."""

import pytest
import torch

from lrlhf.functional import gae
from lrlhf.modules.advantages import GAE, GRPO, RLOO, AdvantageEstimator, GroupAdvantage

# two prompts x k = 2 samples; row lengths 2, 1, 3, 2 (a prefix mask)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
REWARDS = torch.tensor([[0.5, 1.0, 9.0], [2.0, 9.0, 9.0], [1.0, 1.0, 1.0], [0.0, -1.0, 9.0]])  # 9 = masked out
VALUES = torch.zeros(4, 3)


def test_group_estimators_compare_sequence_rewards_within_each_prompt():
    # sequence rewards (masked sums): 1.5, 2.0 | 3.0, -1.0
    adv, ret = RLOO(samples_per_prompt=2)(REWARDS, VALUES, MASK)
    # RLOO with k = 2: r_i - r_j -> -0.5, 0.5 | 4, -4, on every valid action of the row
    expected = torch.tensor([-0.5, 0.5, 4.0, -4.0])[:, None] * MASK
    assert torch.equal(adv, expected) and torch.equal(ret, torch.zeros(4, 3))
    # GRPO: (r - mean) / (std + 1e-6); a pair's unbiased std is |r_1 - r_2| / sqrt(2): 0.5/sqrt2 | 4/sqrt2
    adv, _ = GRPO(samples_per_prompt=2)(REWARDS, VALUES, MASK)
    s1, s2 = 0.5 / 2**0.5, 4.0 / 2**0.5
    expected = torch.tensor([-0.25 / (s1 + 1e-6), 0.25 / (s1 + 1e-6), 2.0 / (s2 + 1e-6), -2.0 / (s2 + 1e-6)])
    torch.testing.assert_close(adv, expected[:, None] * MASK, atol=0, rtol=2e-7)
    # Dr. GRPO: the group mean subtracted, no division by the std: -0.25, 0.25 | 2, -2
    adv, _ = GRPO(samples_per_prompt=2, scale_by_std=False)(REWARDS, VALUES, MASK)
    assert torch.equal(adv, torch.tensor([-0.25, 0.25, 2.0, -2.0])[:, None] * MASK)


def test_gae_is_the_functional_gae_whitened_over_valid_actions():
    values = torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.0, 0.0], [0.0, 0.5, 0.1], [0.2, 0.2, 0.0]])
    raw, returns = gae(REWARDS, values, MASK, 0.9, 0.8)
    adv, ret = GAE(gamma=0.9, lam=0.8, whiten_scope="local")(REWARDS, values, MASK)
    assert torch.equal(ret, returns)
    valid = raw[MASK]
    torch.testing.assert_close(adv[MASK], (valid - valid.mean()) / (valid.var() + 1e-8).sqrt(), atol=1e-6, rtol=0)
    assert torch.equal(GAE(gamma=0.9, lam=0.8, whiten=False)(REWARDS, values, MASK)[0], raw)


def test_the_interface_the_module_reads():
    assert (GAE().needs_critic, GAE().name, GAE().samples_per_prompt) == (True, "ppo", 1)
    assert (RLOO().needs_critic, RLOO().name, RLOO().samples_per_prompt) == (False, "rloo", 4)
    assert (GRPO().name, GRPO(samples_per_prompt=8).samples_per_prompt) == ("grpo", 8)
    assert issubclass(GroupAdvantage, AdvantageEstimator)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: GAE(gamma=1.5), "module.advantage.gamma must be in [0, 1], got 1.5"),
    (lambda: GAE(lam=-0.1), "module.advantage.lam must be in [0, 1], got -0.1"),
    (lambda: GAE(whiten_scope="world"), "module.advantage.whiten_scope must be one of ['global', 'local']"),
    (lambda: GAE(samples_per_prompt=0), "module.advantage.samples_per_prompt must be >= 1, got 0"),
    (lambda: RLOO(samples_per_prompt=1), "module.advantage.samples_per_prompt must be >= 2 for RLOO"),
    (lambda: GRPO(samples_per_prompt=1), "module.advantage.samples_per_prompt must be >= 2 for GRPO"),
])
def test_errors_name_the_key(make, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make()
