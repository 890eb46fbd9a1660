"""Generalised advantage estimation over masked responses."""

from __future__ import annotations

import torch
from torch import Tensor


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Masked GAE (Schulman et al., 2016).

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t+1}``, where the
    value and advantage after the last valid action are 0: the episode ends at the terminal action (EOS,
    or a truncated response that is scored there), so nothing is bootstrapped past it.

    Args:
        rewards: ``(B, T)`` per-action rewards (0 on invalid positions is not required: they are masked).
        values: ``(B, T)`` value estimates of each action's state.
        mask: ``(B, T)`` valid actions, a prefix of each row (as from ``response_masks``).
        gamma, lam: discount and GAE lambda.

    Returns:
        ``(advantages, returns)``, both ``(B, T)``, ``returns = advantages + values``; 0 on invalid
        positions.
    """
    mask = mask.to(values.dtype)
    rewards = rewards.to(values.dtype) * mask
    values = values * mask
    batch, steps = values.shape
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(batch)
    next_advantage = values.new_zeros(batch)
    # One pass backwards in time, vectorised over the batch; an invalid position t+1 has value and
    # advantage 0 after masking, which is exactly "no bootstrap past the terminal action".
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    returns = (advantages + values) * mask
    return advantages, returns
