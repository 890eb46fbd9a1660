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


def _groups(rewards: Tensor, k: int, name: str) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"{name}: rewards must be (B,), got shape {tuple(rewards.shape)}")
    if k < 2:
        raise ValueError(f"{name} needs k >= 2 samples per prompt, got {k}")
    if rewards.shape[0] % k:
        raise ValueError(f"{name}: {rewards.shape[0]} rewards do not split into groups of k={k}")
    return rewards.reshape(-1, k)


def rloo_advantages(rewards: Tensor, k: int) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al., 2024): ``A_i = r_i - mean_{j != i} r_j`` within a group.

    Args:
        rewards: ``(B,)`` sequence rewards, ``B = P * k``, the ``k`` samples of one prompt adjacent
            (rows ``[p * k, (p + 1) * k)``).
        k: samples per prompt, ``>= 2`` (a leave-one-out baseline needs another sample).

    Returns:
        ``(B,)`` advantages; each group sums to 0.
    """
    r = _groups(rewards, k, "rloo_advantages")  # (P, k)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (k - 1)
    return (r - baseline).reshape(-1)


def grpo_advantages(rewards: Tensor, k: int, eps: float = 1e-6, scale: bool = True) -> Tensor:
    """Group-relative advantages (GRPO, Shao et al., 2024): ``(r_i - mean_g) / (std_g + eps)``.

    ``std_g`` is the unbiased standard deviation of the group (as ``torch.std``); a group of equal rewards
    gives 0 advantages. ``scale=False`` only subtracts the group mean (Dr. GRPO, Liu et al., 2025).

    Args:
        rewards: ``(B,)`` sequence rewards, groups of ``k`` adjacent rows (see :func:`rloo_advantages`).
        k: samples per prompt, ``>= 2``.

    Returns:
        ``(B,)`` advantages.
    """
    r = _groups(rewards, k, "grpo_advantages")  # (P, k)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def informative_groups(scores: Tensor, k: int, tolerance: float = 0.0) -> Tensor:
    """``(B / k,)`` bool: the groups whose ``k`` scores are not all equal (``max - min > tolerance``).

    A group of equal scores has no advantage to learn from under RLOO / GRPO (only the KL's noise, which GRPO's
    division by the group's std blows up); DAPO's dynamic sampling (Yu et al. 2025) leaves such groups out.

    Args:
        scores: ``(B,)`` sequence scores (the reward, before the KL), groups of ``k`` adjacent rows.
    """
    r = _groups(scores, k, "informative_groups")  # (P, k)
    return (r.max(dim=1).values - r.min(dim=1).values) > tolerance
