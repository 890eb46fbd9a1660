"""Token-level reward shaping: a KL penalty on every action plus the sequence score once at the end."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lrlhf.functional.kl import KLEstimator, kl_penalty


class ShapedRewards(NamedTuple):
    """Output of :func:`shape_rewards`.

    Fields:
        rewards: ``(B, R)`` per-action rewards: ``-kl_coef * kl`` on valid actions, plus ``scores`` at
            ``terminal_index``; 0 on invalid positions.
        kl: ``(B, R)`` per-token KL estimate on valid actions, 0 elsewhere (before ``kl_coef``).
        scores: ``(B,)`` the sequence scores as added (after the missing-EOS penalty and clipping).
    """

    rewards: Tensor
    kl: Tensor
    scores: Tensor


def shape_rewards(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    action_mask: Tensor,
    terminal_index: Tensor,
    kl_coef: float | Tensor,
    estimator: str | KLEstimator = "k1",
    *,
    has_eos: Tensor | None = None,
    missing_eos_penalty: float | None = None,
    score_clip: float | None = None,
) -> ShapedRewards:
    """Per-token rewards for PPO.

    Order of operations (each optional step named):
        1. ``missing_eos_penalty``: subtracted from the score of rows with ``has_eos == False``;
        2. ``score_clip``: the score is clamped to ``[-score_clip, score_clip]`` (after the penalty, so the
           clip bounds what reaches the return);
        3. ``kl = estimator(logprobs, ref_logprobs)`` on valid actions; ``rewards = -kl_coef * kl``;
        4. the score is added **exactly once**, at ``terminal_index`` (rows with ``terminal_index == -1``
           have no action and get nothing).

    Args:
        scores: ``(B,)`` sequence scores (e.g. calibrated RM outputs).
        logprobs, ref_logprobs: ``(B, R)`` log-probs of the sampled actions under the sampling policy and
            the reference.
        action_mask: ``(B, R)`` valid actions (see :func:`lrlhf.functional.response_masks`).
        terminal_index: ``(B,)`` last valid action, ``-1`` for none.
        kl_coef: beta, a float or a 0-dim tensor.
        has_eos: ``(B,)`` bool, required with ``missing_eos_penalty``.
    """
    scores = scores.float()
    if missing_eos_penalty is not None:
        if has_eos is None:
            raise ValueError("shape_rewards: missing_eos_penalty needs has_eos")
        scores = scores - missing_eos_penalty * (~has_eos.bool()).float()
    if score_clip is not None:
        scores = scores.clamp(-score_clip, score_clip)
    mask = action_mask.bool()
    kl = torch.where(mask, kl_penalty(logprobs.float(), ref_logprobs.float(), estimator), 0.0)
    rewards = -kl_coef * kl
    rows = torch.nonzero(terminal_index >= 0).squeeze(-1)
    rewards = rewards.index_put((rows, terminal_index[rows]), scores[rows], accumulate=True)
    return ShapedRewards(rewards=rewards, kl=kl, scores=scores)


class Overlong:
    """What to do with responses that run up to the token budget (``module/overlong=mask|soft_penalty``; DAPO,
    Yu et al. 2025, sec. 3.4): a truncated answer's score judges an answer that was never finished.

    ``penalty`` is subtracted from the sequence score; ``keep`` says which rows the policy loss learns from.
    """

    def penalty(self, lengths: Tensor, has_eos: Tensor, max_new_tokens: int) -> Tensor:
        """``(B,)`` subtracted from the score (0 = none)."""
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)

    def keep(self, lengths: Tensor, has_eos: Tensor) -> Tensor:
        """``(B,)`` bool: the rows whose tokens the policy loss averages over."""
        return torch.ones(lengths.shape, dtype=torch.bool, device=lengths.device)


class OverlongMask(Overlong):
    """DAPO's overlong filtering: a truncated response (no EOS within the budget) is left out of the policy loss
    (its tokens neither count nor weigh); its score still feeds the baselines and the critic."""

    def keep(self, lengths: Tensor, has_eos: Tensor) -> Tensor:
        return has_eos.bool() | (lengths == 0)


class SoftOverlongPenalty(Overlong):
    """DAPO's soft overlong punishment: 0 up to ``max_new_tokens - cache_tokens`` tokens, then a linear ramp to
    ``-penalty`` at the budget: ``penalty * clamp((len - (L - cache)) / cache, 0, 1)`` is subtracted from the score.

    Args:
        cache_tokens: the length of the ramp (DAPO's ``L_cache``), ``1 <= cache_tokens <= max_new_tokens``.
        penalty: its size at the budget, in the units of the (calibrated) score.
    """

    def __init__(self, cache_tokens: int = 4, penalty: float = 1.0):
        if cache_tokens < 1:
            raise ValueError(f"module.overlong.cache_tokens must be >= 1, got {cache_tokens!r}")
        if not penalty >= 0:
            raise ValueError(f"module.overlong.penalty must be >= 0, got {penalty!r}")
        self.cache_tokens, self.penalty_size = int(cache_tokens), float(penalty)

    def settings(self) -> dict:
        return {"cache_tokens": self.cache_tokens, "penalty": self.penalty_size}

    def penalty(self, lengths: Tensor, has_eos: Tensor, max_new_tokens: int) -> Tensor:
        if self.cache_tokens > max_new_tokens:
            raise ValueError(f"module.overlong.cache_tokens={self.cache_tokens} is longer than the budget "
                             f"module.config.max_new_tokens={max_new_tokens}")
        start = max_new_tokens - self.cache_tokens
        ramp = ((lengths.float() - start) / self.cache_tokens).clamp(0.0, 1.0)
        return self.penalty_size * ramp
