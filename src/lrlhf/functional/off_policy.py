"""Off-policy correction between the sampler and the trainer (``module/off_policy=truncated_is|masked_is``).

The rollout's tokens are drawn by a sampler whose log-probs ``log mu`` may differ from the trainer's full forward
``log pi_old`` of the same weights: cached one-token kernels, half precision, a compiled decoder, tomorrow an
inference engine. PPO's ratio is taken against the trainer's ``pi_old`` (so the first update's ratio is exactly 1
and :mod:`lrlhf.modules.guards` stays meaningful), and the gap between the two is corrected by an importance weight
on each token's loss, ``w = pi_old / mu`` (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"; TRL's ``vllm_importance_sampling_correction``, verl's ``rollout_is``):

- :class:`TruncatedIS`: ``min(w, cap)`` (truncated importance sampling, TIS): bounded variance, a small bias.
- :class:`MaskedIS`: ``w`` where ``w <= cap``, 0 elsewhere (masked importance sampling, MIS): a token the sampler
  got badly wrong teaches nothing instead of a capped amount.

``level="sequence"`` uses one weight per sequence, ``exp(sum_t log w_t)``, for every token of it. The weights depend
on the rollout's frozen log-probs only (the same at every update epoch) and carry no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from lrlhf.functional.masks import masked_mean

LEVELS = ("token", "sequence")


@dataclass
class OffPolicyCorrection:
    """``(trainer_logprobs, sampler_logprobs, mask) -> (B, T)`` weights (0 off the mask); subclasses write
    :meth:`limit` and name what it changes (``changed_name``).

    Args:
        cap: the bound of ``pi_old / mu``, ``>= 1``.
        level: ``token`` (a weight per token) or ``sequence`` (one per sequence, the product of its tokens').
    """

    cap: float = 2.0
    level: str = "token"
    changed_name: ClassVar[str] = "changed"  # the logged fraction: ``offpolicy/<changed_name>_frac``

    def __post_init__(self):
        if not self.cap >= 1:
            raise ValueError(f"module.off_policy.cap must be >= 1, got {self.cap!r}")
        if self.level not in LEVELS:
            raise ValueError(f"module.off_policy.level must be one of {list(LEVELS)}, got {self.level!r}")

    def limit(self, w: Tensor) -> Tensor:
        """The raw weights ``w`` bounded (truncated or masked at ``cap``)."""
        raise NotImplementedError

    def _weights(self, trainer_logprobs: Tensor, sampler_logprobs: Tensor,
                 mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(log w, w, bounded w)`` in fp64, each ``(B, T)``, 0 (and w = 1) off the mask."""
        valid = mask.bool()
        log_w = torch.where(valid, trainer_logprobs.double() - sampler_logprobs.double(), 0.0)
        if self.level == "sequence":
            log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
        raw = torch.exp(log_w)
        return log_w, raw, torch.where(valid, self.limit(raw), 0.0)

    @torch.no_grad()
    def __call__(self, trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> Tensor:
        """``(B, T)`` the bounded weights ``pi_old / mu`` (0 off the mask), in ``trainer_logprobs``' dtype. They
        depend on the rollout's frozen log-probs only: the same at every update epoch."""
        return self._weights(trainer_logprobs, sampler_logprobs, mask)[2].to(trainer_logprobs.dtype)

    @torch.no_grad()
    def stats(self, trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
        """What a rollout's correction did: ``offpolicy/log_ratio_abs_mean`` (how far the sampler is from the
        trainer), the raw ratio's mean and max, the fraction of tokens truncated / masked, the weights' mean."""
        log_w, raw, weights = self._weights(trainer_logprobs, sampler_logprobs, mask)
        valid = mask.bool()
        return {
            "offpolicy/log_ratio_abs_mean": float(masked_mean(log_w.abs(), mask)),
            "offpolicy/ratio_mean": float(masked_mean(raw, mask)),
            "offpolicy/ratio_max": float(torch.where(valid, raw, 0.0).max()) if valid.any() else 0.0,
            f"offpolicy/{self.changed_name}_frac": float(masked_mean((weights != raw).double(), mask)),
            "offpolicy/weight_mean": float(masked_mean(weights, mask)),
        }


@dataclass
class TruncatedIS(OffPolicyCorrection):
    """``min(pi_old / mu, cap)`` per token (or per sequence): truncated importance sampling."""

    changed_name: ClassVar[str] = "truncated"

    def limit(self, w: Tensor) -> Tensor:
        return w.clamp(max=self.cap)


@dataclass
class MaskedIS(OffPolicyCorrection):
    """``pi_old / mu`` where it is ``<= cap``, 0 elsewhere, per token (or per sequence): masked importance
    sampling."""

    changed_name: ClassVar[str] = "masked"

    def limit(self, w: Tensor) -> Tensor:
        return torch.where(w <= self.cap, w, 0.0)


__all__ = ["LEVELS", "MaskedIS", "OffPolicyCorrection", "TruncatedIS"]
