"""The data of one PPO rollout: what the sampler returns (:class:`Sampled`), the frozen :class:`Rollout` the update
epochs read, and the checks and helpers around them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from lrlhf.functional import ResponseMasks, explained_variance, kl_k1, masked_mean, masked_sum
from lrlhf.models.engines import sequence_inputs  # the layout of prompt + response, one place for every forward


class Sampled(NamedTuple):
    """What :meth:`PPOModule.sample` returns, ``B`` rows, ``R <= max_new_tokens`` response columns.

    Fields:
        response_ids: ``(B, R)`` sampled ids (after a row's first EOS: anything, masked out later).
        logprobs: ``(B, R)`` log-probs of the sampled ids under the distribution they were drawn from (the old
            logprobs), or None: a no-grad forward of the policy computes them.
        values: ``(B, R)`` the critic's value of each action's state from the sampling pass itself (a critic on
            the policy's trunk), or None: a value forward computes them.
    """

    response_ids: Tensor
    logprobs: Tensor | None = None
    values: Tensor | None = None


@dataclass(frozen=True)
class Rollout:
    """One rollout, frozen for the update epochs. ``B`` rows, ``P`` prompt columns, ``R`` response columns.

    Fields:
        query_ids, query_mask: ``(B, P)`` left-padded prompts (exact ids) and their attention mask.
        response_ids: ``(B, R)`` sampled ids (after the first EOS: whatever ``generate`` wrote, masked).
        masks: :class:`ResponseMasks` of ``response_ids`` (action / done masks, terminal index, EOS, lengths).
        logprobs, ref_logprobs: ``(B, R)`` of the sampled actions under the sampling policy and the reference.
        values: ``(B, R)`` old values of each action's state (0 without a critic).
        raw_scores: ``(B,)`` reward-model scores; ``scores``: as added (calibrated, penalised, clipped).
        rewards, kl: ``(B, R)`` shaped per-action rewards and the per-token KL estimate (valid actions).
        advantages, returns: ``(B, R)``.
        policy_mask: ``(B, R)`` the tokens the policy loss averages over: ``action_mask`` less the rows
            ``module.overlong`` leaves out (truncated ones, with ``module/overlong=mask``).
        sampler_logprobs: ``(B, R)`` the sampler's own log-probs of the tokens (``mu``); equal to ``logprobs``
            unless the old log-probs were recomputed by the trainer (:mod:`lrlhf.functional.off_policy`).
    """

    query_ids: Tensor
    query_mask: Tensor
    response_ids: Tensor
    masks: ResponseMasks
    logprobs: Tensor
    ref_logprobs: Tensor
    values: Tensor
    raw_scores: Tensor
    scores: Tensor
    rewards: Tensor
    kl: Tensor
    advantages: Tensor
    returns: Tensor
    policy_mask: Tensor
    sampler_logprobs: Tensor

    def __len__(self) -> int:
        return self.query_ids.shape[0]

    @property
    def action_mask(self) -> Tensor:
        return self.masks.action_mask

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor by name (mask fields as ``masks.<field>``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "masks"}
        out.update({f"masks.{k}": v for k, v in self.masks._asdict().items()})
        return out

    def select(self, rows: Tensor) -> Rollout:
        """The rows ``rows`` (a minibatch)."""
        fields = {f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self) if f.name != "masks"}
        return Rollout(masks=ResponseMasks(*(m[rows] for m in self.masks)), **fields)


def row_chunks(n: int, size: int):
    """Slices of ``size`` rows (the last one shorter) covering ``range(n)``."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def check_finite(rollout: Rollout, index: int) -> None:
    """Raise before any update when a score, reward, value or advantage is NaN or infinite."""
    mask = rollout.action_mask
    for name in ("raw_scores", "scores", "logprobs", "ref_logprobs", "values", "rewards", "advantages", "returns",
                 "sampler_logprobs"):
        tensor = getattr(rollout, name)
        if tensor.dim() == 2:  # per action: only valid actions count (after a stop anything may sit there)
            tensor = torch.where(mask, tensor, 0.0)
        if not torch.isfinite(tensor).all():
            raise FloatingPointError(
                f"ppo: non-finite {name} in rollout {index}; stopping before any optimiser step on it "
                "(no poisoned weights are kept)"
            )


def rollout_stats(rollout: Rollout, kl_coef: float, with_values: bool) -> dict[str, float]:
    """Per-rollout statistics: scores, KL (and its cost at beta ``kl_coef``), rewards, lengths, EOS rate, and the
    critic's explained variance when ``with_values``."""
    masks, mask = rollout.masks, rollout.action_mask
    lengths = masks.lengths.float()
    kl_seq = masked_sum(rollout.kl, mask, dim=1)
    stats = {
        "rollout/size": float(len(rollout)),
        "rollout/score_raw": rollout.raw_scores.mean(),
        "rollout/score": rollout.scores.mean(),
        "rollout/kl_seq": kl_seq.mean(),
        "rollout/kl_token": masked_mean(rollout.kl, mask),
        "rollout/kl_k1": masked_mean(kl_k1(rollout.logprobs, rollout.ref_logprobs), mask),
        "rollout/kl_cost": kl_coef * kl_seq.mean(),
        "rollout/reward_total": masked_sum(rollout.rewards, mask, dim=1).mean(),
        "rollout/length_mean": lengths.mean(),
        "rollout/length_p95": torch.quantile(lengths, 0.95),
        "rollout/eos_rate": masks.has_eos.float().mean(),
        "rollout/truncated": (~masks.has_eos & (masks.lengths > 0)).float().sum(),
        "rollout/advantage_mean": masked_mean(rollout.advantages, mask),
    }
    if with_values and mask.any():
        stats["ppo/explained_variance"] = explained_variance(rollout.values, rollout.returns, mask)
    return {k: float(v) for k, v in stats.items()}


#: Statistics that are not means: reduced across ranks with their own operation when logged.
STAT_REDUCTIONS = {"rollout/size": "sum", "rollout/truncated": "sum", "ppo/ratio_max": "max",
                   "offpolicy/ratio_max": "max", "rollout/groups_sampled": "sum", "rollout/groups_kept": "sum"}


def log_synced(module, stats: dict[str, float], batch_size: int) -> None:
    """``module.log_dict`` the ``stats`` synced across ranks: means averaged (``sync_dist``), the counts and maxima
    of :data:`STAT_REDUCTIONS` summed and maxed."""
    for op in ("mean", *sorted(set(STAT_REDUCTIONS.values()))):
        part = {k: v for k, v in stats.items() if STAT_REDUCTIONS.get(k, "mean") == op}
        if part:
            module.log_dict(part, batch_size=batch_size, sync_dist=True, reduce_fx=op)


__all__ = ["STAT_REDUCTIONS", "Rollout", "Sampled", "check_finite", "log_synced", "rollout_stats", "row_chunks",
           "sequence_inputs"]
