"""Offline preference losses as objects (``module/preference_loss=dpo|cdpo|ipo|robust|simpo``), the pure math.

Every loss sees, per pair, the summed log-probs of the chosen and the rejected completion under the policy and the
reference, the completions' token counts and ``beta`` (``module.config.beta``, the one strength every variant has, as
TRL's ``beta`` beside its ``loss_type``); it returns the mean loss over the pairs and :class:`DPOStats` (the
implicit rewards ``beta * score`` of each side, their margin and the pairwise accuracy). The ``score`` of a completion
is what the loss compares:

- :class:`DPOLoss` (Rafailov et al. 2023; with ``label_smoothing`` > 0 the conservative cDPO of Mitchell 2023):
  score = ``log pi - log ref`` (summed), ``loss = -(1 - s) log sigmoid(beta d) - s log sigmoid(-beta d)``,
  ``d = score_c - score_r``. TRL 1.12's ``loss_type="sigmoid"`` at ``s = 0``.
- :class:`IPOLoss` (Azar et al. 2023): score = ``(log pi - log ref) / n`` (per token, as TRL 1.12 and the IPO
  authors' runs), ``loss = (d - 1 / (2 beta))^2``: a squared loss that does not push the margin to infinity.
- :class:`RobustDPOLoss` (Chowdhury et al. 2024): the unbiased loss under labels flipped with probability ``s``,
  ``(-(1 - s) log sigmoid(beta d) + s log sigmoid(-beta d)) / (1 - 2s)``. TRL 1.12's ``loss_type="robust"``.
- :class:`SimPOLoss` (Meng et al. 2024): reference-free, score = ``log pi / n`` (the mean token log-prob),
  ``loss = -(1 - s) log sigmoid(beta d - gamma) - s log sigmoid(-(beta d - gamma))``. TRL 1.12's CPO trainer with
  ``loss_type="simpo"``, ``cpo_alpha=0``. On per-token scores ``beta`` is larger than DPO's (the paper: 2 to 2.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class DPOStats(NamedTuple):
    """Detached tensors from :func:`dpo_loss`.

    Fields:
        chosen_rewards: ``(B,)`` implicit rewards ``beta * (log pi - log ref)`` of the chosen responses.
        rejected_rewards: ``(B,)`` the same for the rejected ones.
        reward_margin: scalar mean of ``chosen_rewards - rejected_rewards``.
        accuracy: scalar fraction of pairs with ``chosen_rewards > rejected_rewards``.
    """

    chosen_rewards: Tensor
    rejected_rewards: Tensor
    reward_margin: Tensor
    accuracy: Tensor


class PreferenceLoss:
    """A loss over preference pairs; subclasses set :meth:`scores` and :meth:`pair_losses` (see the module
    docstring). ``uses_reference``: False for a reference-free loss (the module then skips the reference pass)."""

    uses_reference: bool = True

    def scores(self, logps: Tensor, ref_logps: Tensor | None, lengths: Tensor | None) -> Tensor:
        """``(B,)`` what the loss compares of each completion (default: the summed log-ratio to the reference)."""
        return logps - ref_logps.detach()

    def pair_losses(self, margin: Tensor, beta: float) -> Tensor:
        """``(B,)`` the loss of each pair from ``margin = score_chosen - score_rejected``."""
        raise NotImplementedError

    def __call__(self, chosen: Tensor, rejected: Tensor, ref_chosen: Tensor | None, ref_rejected: Tensor | None,
                 chosen_lengths: Tensor | None, rejected_lengths: Tensor | None,
                 beta: float) -> tuple[Tensor, DPOStats]:
        """The mean loss over the pairs and its detached statistics (``*_lengths``: completion tokens, the per-token
        losses' divisor; None for a loss on sums)."""
        if not beta > 0:
            raise ValueError(f"module.config.beta must be > 0, got {beta}")
        score_c = self.scores(chosen, ref_chosen, chosen_lengths)
        score_r = self.scores(rejected, ref_rejected, rejected_lengths)
        losses = self.pair_losses(score_c - score_r, beta)
        with torch.no_grad():
            reward_c, reward_r = beta * score_c.detach(), beta * score_r.detach()
            stats = DPOStats(chosen_rewards=reward_c, rejected_rewards=reward_r,
                             reward_margin=(reward_c - reward_r).mean(), accuracy=(reward_c > reward_r).float().mean())
        return losses.mean(), stats


def _per_token(values: Tensor, lengths: Tensor | None) -> Tensor:
    if lengths is None:
        raise ValueError("a per-token preference loss needs the completions' token counts")
    return values / lengths.clamp(min=1).to(values.dtype)


def _check_smoothing(smoothing: float) -> None:
    if not 0.0 <= smoothing < 0.5:
        raise ValueError(f"module.preference_loss.label_smoothing must be in [0, 0.5), got {smoothing}")


@dataclass
class DPOLoss(PreferenceLoss):
    """DPO; cDPO with ``label_smoothing`` > 0 (see the module docstring)."""

    label_smoothing: float = 0.0

    def __post_init__(self):
        _check_smoothing(self.label_smoothing)

    def pair_losses(self, margin: Tensor, beta: float) -> Tensor:
        s, logits = self.label_smoothing, beta * margin
        return -(1.0 - s) * F.logsigmoid(logits) - s * F.logsigmoid(-logits)


@dataclass
class IPOLoss(PreferenceLoss):
    """IPO on per-token log-ratios (see the module docstring)."""

    def scores(self, logps, ref_logps, lengths):
        return _per_token(logps - ref_logps.detach(), lengths)

    def pair_losses(self, margin: Tensor, beta: float) -> Tensor:
        return (margin - 1.0 / (2.0 * beta)) ** 2


@dataclass
class RobustDPOLoss(PreferenceLoss):
    """Robust DPO under a label-flip rate ``label_smoothing`` (see the module docstring)."""

    label_smoothing: float = 0.1

    def __post_init__(self):
        _check_smoothing(self.label_smoothing)

    def pair_losses(self, margin: Tensor, beta: float) -> Tensor:
        s, logits = self.label_smoothing, beta * margin
        return (-(1.0 - s) * F.logsigmoid(logits) + s * F.logsigmoid(-logits)) / (1.0 - 2.0 * s)


@dataclass
class SimPOLoss(PreferenceLoss):
    """SimPO: reference-free, mean token log-probs, a target margin ``gamma`` (see the module docstring)."""

    gamma: float = 0.5
    label_smoothing: float = 0.0
    uses_reference = False

    def __post_init__(self):
        _check_smoothing(self.label_smoothing)
        if self.gamma < 0:
            raise ValueError(f"module.preference_loss.gamma must be >= 0, got {self.gamma}")

    def scores(self, logps, ref_logps, lengths):
        return _per_token(logps, lengths)

    def pair_losses(self, margin: Tensor, beta: float) -> Tensor:
        s, logits = self.label_smoothing, beta * margin - self.gamma
        return -(1.0 - s) * F.logsigmoid(logits) - s * F.logsigmoid(-logits)


def dpo_loss(policy_chosen_logps: Tensor, policy_rejected_logps: Tensor, ref_chosen_logps: Tensor,
             ref_rejected_logps: Tensor, beta: float, label_smoothing: float = 0.0) -> tuple[Tensor, DPOStats]:
    """:class:`DPOLoss` as a function: the mean DPO (cDPO) loss over pairs of summed log-probs."""
    return DPOLoss(label_smoothing)(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                    None, None, beta)


__all__ = ["DPOStats", "dpo_loss", "DPOLoss", "IPOLoss", "PreferenceLoss", "RobustDPOLoss", "SimPOLoss"]
