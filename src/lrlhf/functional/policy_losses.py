"""PPO's policy objective as objects (``module/policy_loss=ppo_clip|clip_higher|dual_clip|gspo``), with the loss
aggregation as an object of its own (``module.policy_loss.aggregation``), the pure math.

Per token ``t`` of sequence ``i``: ``r = exp(log pi - log pi_old)``, advantage ``A``; the per-token loss is the
negated surrogate, then aggregated over the minibatch's valid tokens:

- :class:`ClipPPO` (Schulman et al. 2017): ``max(-A r, -A clip(r, 1 - eps, 1 + eps))``.
- :class:`ClipHigher` (DAPO, Yu et al. 2025): the same with ``clip(r, 1 - eps_low, 1 + eps_high)``,
  ``eps_high > eps_low``: a low-probability token with a positive advantage may grow further (against entropy
  collapse).
- :class:`DualClip` (Ye et al. 2020): PPO's clip, and for ``A < 0`` the loss capped at ``-c A`` (``c > 1``): a
  ratio far above 1 on a bad action no longer gives an unbounded step.
- :class:`GSPO` (Zheng et al. 2025): one importance ratio per sequence, ``s_i = exp(mean_t(log pi - log pi_old))``
  (length-normalised), clipped as ``clip(s_i, 1 - eps_low, 1 + eps_high)`` with eps of order 1e-3; for
  sequence-level rewards (RLOO / GRPO). TRL 1.12's ``importance_sampling_level="sequence"``.

Aggregations (what the minibatch's loss is a mean of; DAPO, Dr. GRPO):

- :class:`TokenMean`: the mean over every valid token of the minibatch (TRL's ``dapo``/``bnpo``); each token
  weighs the same whatever its sequence's length. The default.
- :class:`SequenceMean`: the mean over sequences of each sequence's token mean (TRL's ``grpo``): a token of a short
  answer weighs more than one of a long answer.
- :class:`SequenceSumNorm`: the token sum over the minibatch divided by ``rows x tokens`` (a constant; Dr. GRPO,
  TRL's ``dr_grpo`` with ``tokens = max_completion_length``): no length normalisation at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lrlhf.functional.losses import PolicyLossStats
from lrlhf.functional.masks import masked_mean, masked_sum


# ------------------------------------------------------------------------------------------ aggregation
class Aggregation:
    """``(B, T)`` per-token losses and their mask -> the minibatch's scalar loss, ``numerator / denominator``.

    The two parts are separate so that a minibatch cut into micro-batches (gradient accumulation) gives the same
    loss and gradient as the whole: each micro-batch's ``numerator`` over the *whole minibatch's* ``denominator``,
    summed (:meth:`lrlhf.modules.PPOModule.update`). Dividing each micro-batch by its own denominator would weigh a
    token by the length of the micro-batch it happened to land in.
    """

    def numerator(self, per_token: Tensor, mask: Tensor) -> Tensor:
        """The part that sums over rows (a micro-batch's share)."""
        raise NotImplementedError

    def denominator(self, mask: Tensor) -> Tensor:
        """The normaliser, computed on the whole minibatch's ``(B, T)`` mask."""
        raise NotImplementedError

    def __call__(self, per_token: Tensor, mask: Tensor) -> Tensor:
        return self.numerator(per_token, mask) / self.denominator(mask)


@dataclass
class TokenMean(Aggregation):
    """The mean over every valid token of the minibatch (an empty minibatch gives 0)."""

    def numerator(self, per_token: Tensor, mask: Tensor) -> Tensor:
        return masked_sum(per_token, mask)

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.float().sum().clamp(min=1)


@dataclass
class SequenceMean(Aggregation):
    """The mean over the minibatch's sequences of each one's token mean (an empty sequence counts 0)."""

    def numerator(self, per_token: Tensor, mask: Tensor) -> Tensor:
        return masked_mean(per_token, mask, dim=-1).sum()

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.new_tensor(float(max(mask.shape[0], 1)), dtype=torch.float32)


@dataclass
class SequenceSumNorm(Aggregation):
    """The token sum over the minibatch divided by ``rows x tokens`` (a constant, e.g. the response budget)."""

    tokens: int = 32

    def __post_init__(self):
        if self.tokens < 1:
            raise ValueError(f"module.policy_loss.aggregation.tokens must be >= 1, got {self.tokens}")

    def numerator(self, per_token: Tensor, mask: Tensor) -> Tensor:
        return (per_token * mask).sum()

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.new_tensor(float(max(mask.shape[0], 1) * self.tokens), dtype=torch.float32)


# ------------------------------------------------------------------------------------------ objectives
class PolicyLoss:
    """A PPO policy objective: :meth:`per_token` gives the per-token losses, ``aggregation`` the scalar."""

    aggregation: Aggregation

    def ratios(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        """``(B, T)`` the importance ratio each token's loss uses (default: per token)."""
        return torch.exp(log_ratio)

    def per_token(self, ratio: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
        """``(unclipped, chosen)``: the plain surrogate's loss ``-A r`` and the objective's, per token."""
        raise NotImplementedError

    def __call__(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                 weights: Tensor | None = None, extra: Tensor | None = None,
                 denominator: Tensor | None = None) -> tuple[Tensor, PolicyLossStats]:
        """``(loss, stats)`` of the ``(B, T)`` tokens where ``mask`` holds.

        Args:
            weights: ``(B, T)`` per-token factors of the objective (no gradient), e.g. the off-policy correction's
                importance weights (:mod:`lrlhf.functional.off_policy`); None = 1.
            extra: ``(B, T)`` a per-token term added after the weights and before the aggregation, e.g.
                ``beta * kl`` (:class:`~lrlhf.functional.kl.KLInLoss`).
            denominator: the aggregation's denominator of the whole minibatch when this call sees one micro-batch
                of it; None = this call's own.
        """
        log_ratio = logprobs - old_logprobs.detach()
        ratio = self.ratios(log_ratio, mask)
        advantages = advantages.detach()
        unclipped, chosen = self.per_token(ratio, advantages)
        per_token = chosen if weights is None else chosen * weights.detach()
        if extra is not None:
            per_token = per_token + extra
        if denominator is None:
            denominator = self.aggregation.denominator(mask)
        loss = self.aggregation.numerator(per_token, mask) / denominator
        with torch.no_grad():
            valid = mask.bool()
            stats = PolicyLossStats(
                clipfrac=masked_mean((chosen != unclipped).float(), mask),
                approx_kl=masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
                ratio_mean=masked_mean(ratio, mask),
                ratio_max=torch.where(valid, ratio, 0.0).max() if valid.any() else ratio.new_zeros(()),
            )
        return loss, stats


def clipped_surrogate(ratio: Tensor, advantages: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """``(-A r, max(-A r, -A clip(r, 1 - low, 1 + high)))`` per token: the plain and the clipped surrogate's loss."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    return unclipped, torch.maximum(unclipped, clipped)


def _check_eps(**eps: float) -> None:
    for key, value in eps.items():
        if not 0 < value < 1:
            raise ValueError(f"module.policy_loss.{key} must be in (0, 1), got {value}")


@dataclass
class ClipPPO(PolicyLoss):
    """PPO's clipped surrogate (see the module docstring)."""

    clip_eps: float = 0.2
    aggregation: Aggregation = field(default_factory=TokenMean)

    def __post_init__(self):
        _check_eps(clip_eps=self.clip_eps)

    def per_token(self, ratio, advantages):
        return clipped_surrogate(ratio, advantages, self.clip_eps, self.clip_eps)


@dataclass
class ClipHigher(PolicyLoss):
    """DAPO's decoupled clip range (see the module docstring)."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: Aggregation = field(default_factory=TokenMean)

    def __post_init__(self):
        _check_eps(eps_low=self.eps_low, eps_high=self.eps_high)

    def per_token(self, ratio, advantages):
        return clipped_surrogate(ratio, advantages, self.eps_low, self.eps_high)


@dataclass
class DualClip(PolicyLoss):
    """PPO's clip with the loss of a negative advantage capped at ``-clip_c * A`` (see the module docstring)."""

    clip_eps: float = 0.2
    clip_c: float = 3.0
    aggregation: Aggregation = field(default_factory=TokenMean)

    def __post_init__(self):
        _check_eps(clip_eps=self.clip_eps)
        if not self.clip_c > 1:
            raise ValueError(f"module.policy_loss.clip_c must be > 1, got {self.clip_c}")

    def per_token(self, ratio, advantages):
        unclipped, clipped = clipped_surrogate(ratio, advantages, self.clip_eps, self.clip_eps)
        capped = torch.minimum(clipped, -advantages * self.clip_c)
        return unclipped, torch.where(advantages < 0, capped, clipped)


@dataclass
class GSPO(ClipHigher):
    """GSPO's sequence-level ratio, clipped as ClipHigher's (see the module docstring); its gradient reaches every
    token of the sequence through the mean log-ratio."""

    eps_low: float = 3e-4
    eps_high: float = 4e-4
    aggregation: Aggregation = field(default_factory=SequenceMean)

    def ratios(self, log_ratio, mask):
        per_sequence = masked_mean(log_ratio, mask, dim=-1)  # (B,)
        return torch.exp(per_sequence).unsqueeze(-1).expand_as(log_ratio)


__all__ = ["GSPO", "Aggregation", "ClipHigher", "ClipPPO", "DualClip", "PolicyLoss", "SequenceMean",
           "SequenceSumNorm", "TokenMean", "clipped_surrogate"]
