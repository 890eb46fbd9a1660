"""Losses: PPO value, Bradley–Terry and K-way rankings for reward models, DPO.

Each loss returns a scalar; the value and DPO losses also return detached statistics for logging (the policy
losses are objects: :mod:`lrlhf.functional.policy_losses`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lrlhf.functional.masks import masked_mean, masked_var


class PolicyLossStats(NamedTuple):
    """Detached scalars of a policy loss (:mod:`lrlhf.functional.policy_losses`; 0 when no token is valid).

    Fields:
        clipfrac: fraction of valid tokens whose clipped term is the active one (its gradient is zero).
        approx_kl: k3 estimate of KL(old || new): mean of ``(rho - 1) - log rho``.
        ratio_mean: mean of ``rho = exp(logprobs - old_logprobs)``.
        ratio_max: max of ``rho``.
    """

    clipfrac: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor


class ValueLossStats(NamedTuple):
    """Detached scalars from :func:`value_loss`.

    Fields:
        clipfrac: fraction of valid tokens where the clipped squared error is the larger one.
        value_mean: mean predicted value.
    """

    clipfrac: Tensor
    value_mean: Tensor


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = None
) -> tuple[Tensor, ValueLossStats]:
    """Clipped value loss ``0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))``.

    ``V_clip = old_values + clip(values - old_values, -clip_eps, clip_eps)``; with ``clip_eps=None`` the
    loss is ``0.5 * masked_mean((V - R)^2)``.

    Args:
        values: ``(B, T)`` current value predictions (with grad).
        old_values: ``(B, T)`` predictions at rollout time.
        returns: ``(B, T)`` targets.
        mask: ``(B, T)`` valid value positions.
    """
    returns = returns.detach()
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        loss = 0.5 * masked_mean(unclipped, mask)
        clipfrac = values.new_zeros(())
    else:
        old_values = old_values.detach()
        clipped_values = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        clipped = (clipped_values - returns) ** 2
        loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
        clipfrac = masked_mean((clipped > unclipped).float().detach(), mask)
    return loss, ValueLossStats(clipfrac=clipfrac, value_mean=masked_mean(values.detach(), mask))


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var(R - V) / Var(R)`` over valid positions (1 = perfect, 0 = no better than a constant).

    Returns NaN-free 0-dim tensor; ``Var(R) == 0`` gives 0 (nothing to explain).
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    if var_returns == 0:
        return returns.new_zeros(())
    return 1.0 - masked_var(returns - values, mask, unbiased=False) / var_returns


def bradley_terry_loss(
    chosen_rewards: Tensor, rejected_rewards: Tensor, target: Tensor | float | None = None
) -> Tensor:
    """Bradley–Terry negative log-likelihood, mean over pairs.

    ``P(first wins) = sigmoid(r_c - r_r)``. With ``target = t`` (the probability that the first wins:
    1 = hard label, 0.5 = tie, anything in [0, 1] = soft label) the loss is the binary cross-entropy
    ``-t log sigmoid(m) - (1 - t) log sigmoid(-m)`` on the logit ``m = r_c - r_r``, computed stably from
    ``logsigmoid``; ``target=None`` means 1.

    Args:
        chosen_rewards, rejected_rewards: ``(N,)``.
        target: ``(N,)`` or a scalar.
    """
    margin = chosen_rewards - rejected_rewards
    if target is None:
        return -F.logsigmoid(margin).mean()
    target = torch.as_tensor(target, dtype=margin.dtype, device=margin.device).expand_as(margin)
    return F.binary_cross_entropy_with_logits(margin, target)


def ranking_loss(rewards: Tensor, ranks: Tensor, group: Tensor, tie_target: float = 0.5) -> Tensor:
    """Bradley–Terry loss over every pair within each K-way ranking, averaged per prompt, then over prompts.

    Each unordered pair ``{i, j}`` of one group counts once: the better-ranked item is "first" with target
    1; equal ranks are a tie with target ``tie_target`` (the BCE at 0.5 is symmetric, so the orientation
    does not matter). A group's loss is the mean over its pairs, so a prompt with more candidates does not
    weigh more; the result is the mean over groups that have at least one pair.

    Args:
        rewards: ``(N,)`` scalar rewards of the flattened candidates.
        ranks: ``(N,)`` ranks within the group, lower is better (1 = best).
        group: ``(N,)`` integer id of the prompt each candidate answers.

    Raises:
        ValueError: no group has two candidates.
    """
    n = rewards.shape[0]
    same_group = group[:, None] == group[None, :]
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=rewards.device), diagonal=1)
    pairs = same_group & upper
    if not pairs.any():
        raise ValueError("ranking_loss: no group has two candidates, there is no pair to compare")
    i, j = pairs.nonzero(as_tuple=True)
    # Orient each pair so that `first` is the better (lower) rank; ties keep their order.
    swap = ranks[j] < ranks[i]
    first = torch.where(swap, j, i)
    second = torch.where(swap, i, j)
    tie = ranks[i] == ranks[j]
    target = torch.where(tie, torch.full_like(rewards[i], tie_target), torch.ones_like(rewards[i]))
    pair_losses = F.binary_cross_entropy_with_logits(rewards[first] - rewards[second], target, reduction="none")
    _, pair_group = torch.unique(group[i], return_inverse=True)
    n_groups = int(pair_group.max()) + 1
    group_sum = torch.zeros(n_groups, dtype=pair_losses.dtype, device=rewards.device).index_add(
        0, pair_group, pair_losses
    )
    group_count = torch.zeros(n_groups, dtype=pair_losses.dtype, device=rewards.device).index_add(
        0, pair_group, torch.ones_like(pair_losses)
    )
    return (group_sum / group_count).mean()


class KTOStats(NamedTuple):
    """Detached tensors from :func:`kto_loss`.

    Fields:
        rewards: ``(B,)`` implicit rewards ``beta * (log pi - log ref)`` of every answer.
        kl: scalar, the reference point ``z0`` the loss used (the batch's KL estimate, clamped at 0).
    """

    rewards: Tensor
    kl: Tensor


def kto_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    policy_kl_logps: Tensor,
    ref_kl_logps: Tensor,
    desirable: Tensor,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[Tensor, KTOStats]:
    """KTO loss (Ethayarajh et al., 2024, eq. 7-8) as TRL's ``KTOTrainer`` computes it (``loss_type="kto"``), mean
    over the batch's answers.

    ``z0 = max(0, mean(log pi(y'|x) - log ref(y'|x)))``, detached: the KL reference point, estimated on mismatched
    (prompt, answer) pairs ``y'`` of the batch; ``r = log pi(y|x) - log ref(y|x)``;
    a desirable answer's loss ``w_d (1 - sigmoid(beta (r - z0)))``, an undesirable one's ``w_u (1 - sigmoid(beta
    (z0 - r)))``.

    Args:
        policy_logps, ref_logps: ``(B,)`` summed log-probs of each answer (its tokens only).
        policy_kl_logps, ref_kl_logps: ``(B,)`` the same for each prompt with another example's answer.
        desirable: ``(B,)`` bool, True for a desirable answer.
        beta: the implicit reward's scale; desirable_weight, undesirable_weight: ``w_d``, ``w_u`` (> 0).
    """
    if beta <= 0 or desirable_weight <= 0 or undesirable_weight <= 0:
        raise ValueError(f"kto_loss: beta ({beta}) and the weights ({desirable_weight}, {undesirable_weight}) "
                         "must be > 0")
    with torch.no_grad():
        kl = (policy_kl_logps - ref_kl_logps).mean().clamp(min=0)
    logratio = policy_logps - ref_logps.detach()
    desirable = desirable.bool()
    losses = torch.where(desirable, desirable_weight * (1 - torch.sigmoid(beta * (logratio - kl))),
                         undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratio))))
    return losses.mean(), KTOStats(rewards=beta * logratio.detach(), kl=kl)
