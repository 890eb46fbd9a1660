import pytest
import torch

from lrlhf.functional import gae


def test_gae_by_hand_and_no_bootstrap_past_terminal():
    # gamma 0.9, lambda 0.8 (gamma * lambda = 0.72); row 1 = row 0 followed by padding with garbage values
    rewards = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0], [1.0, 2.0, 3.0, 5.0, 5.0]])
    values = torch.tensor([[0.5, 1.0, 1.5, 0.0, 0.0], [0.5, 1.0, 1.5, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=2 (terminal): delta = 3 + 0 - 1.5 = 1.5 (no bootstrap from the 9.0 after it)         A2 = 1.5
    # t=1: delta = 2 + 0.9 * 1.5 - 1.0 = 2.35;  A1 = 2.35 + 0.72 * 1.5 = 3.43
    # t=0: delta = 1 + 0.9 * 1.0 - 0.5 = 1.4;   A0 = 1.4 + 0.72 * 3.43 = 3.8696
    expected_adv = torch.tensor([3.8696, 3.43, 1.5, 0.0, 0.0])
    expected_ret = torch.tensor([4.3696, 4.43, 3.0, 0.0, 0.0])
    for row in range(2):
        torch.testing.assert_close(adv[row], expected_adv, atol=1e-6, rtol=0)
        torch.testing.assert_close(ret[row], expected_ret, atol=1e-6, rtol=0)


def _naive_gae(rewards, values, gamma, lam):
    """The plain reverse loop on one unpadded episode (python floats)."""
    n = len(rewards)
    adv = [0.0] * n
    last = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.99, 0.9), (0.5, 0.0), (1.0, 1.0)])
def test_gae_equals_naive_loop_on_random_lengths(gamma, lam):
    g = torch.Generator().manual_seed(0)
    batch, steps = 16, 20
    rewards = torch.randn(batch, steps, generator=g, dtype=torch.float64)
    values = torch.randn(batch, steps, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, steps + 1, (batch,), generator=g)
    lengths[0], lengths[1] = 0, steps
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    for b in range(batch):
        n = int(lengths[b])
        exp_adv, exp_ret = _naive_gae(rewards[b, :n].tolist(), values[b, :n].tolist(), gamma, lam)
        torch.testing.assert_close(adv[b, :n], torch.tensor(exp_adv, dtype=torch.float64), atol=1e-10, rtol=0)
        torch.testing.assert_close(ret[b, :n], torch.tensor(exp_ret, dtype=torch.float64), atol=1e-10, rtol=0)
        assert (adv[b, n:] == 0).all() and (ret[b, n:] == 0).all()


def test_gae_lambda_one_gamma_one_is_monte_carlo():
    rewards = torch.tensor([[0.1, -0.2, 0.3, 2.0]])
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # returns = reward-to-go: 2.2, 2.1, 2.3, 2.0
    torch.testing.assert_close(ret, torch.tensor([[2.2, 2.1, 2.3, 2.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, ret - values, atol=1e-6, rtol=0)
