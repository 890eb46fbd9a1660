"""The data of one PPO rollout: what the sampler returns (:class:`Sampled`), the scored rows before the forwards
(:class:`Scored`), the frozen :class:`Rollout` the update epochs read, and the checks and helpers around them.

A rollout carries everything it produced (a reward's disagreement and named components, the dynamic-sampling
filter's statistics) as fields, so rows are kept or dropped in one place (:func:`select_rows`): a field added later
is selected with the others, never misaligned by hand."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from lrlhf.functional import ResponseMasks, explained_variance, kl_k1, masked_mean, masked_sum
from lrlhf.models.engines import sequence_inputs  # the layout of prompt + response, one place for every forward
from lrlhf.rewards.protocol import RewardScores


def take_rows(value, rows: Tensor):
    """``value``'s rows ``rows``: a tensor indexed, a dict or NamedTuple of them each taken, a list picked; None and
    plain numbers (a rollout's statistics) as they are."""
    if isinstance(value, Tensor):
        return value[rows]
    if isinstance(value, dict):
        return {name: take_rows(item, rows) for name, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(take_rows(item, rows) for item in value))
    if isinstance(value, list):
        return [value[i] for i in rows.tolist()]
    return value


def select_rows(data, rows: Tensor):
    """The dataclass ``data`` with every field's rows ``rows`` (:func:`take_rows`)."""
    return dataclasses.replace(data, **{f.name: take_rows(getattr(data, f.name), rows)
                                        for f in dataclasses.fields(data)})


def concat_scores(parts: list[RewardScores]) -> RewardScores:
    """One :class:`RewardScores` of the row chunks ``parts`` scored in turn (components as float32)."""
    spread = [part.disagreement for part in parts if part.disagreement is not None]
    if spread and len(spread) != len(parts):
        raise ValueError("a reward source gave a disagreement for some row chunks of a rollout and not for others")
    names = [sorted(part.components or {}) for part in parts]
    if any(n != names[0] for n in names):
        raise ValueError(f"a reward source named other components in some row chunks of a rollout: {names}")
    components: dict[str, list[Tensor]] = {}
    for part in parts:
        for name, value in (part.components or {}).items():
            components.setdefault(name, []).append(value.float())
    return RewardScores(torch.cat([part.scores for part in parts]), torch.cat(spread) if spread else None,
                        {name: torch.cat(chunks) for name, chunks in components.items()})


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
class Scored:
    """A rollout's rows before its forwards (steps 1-4 of :meth:`PPOModule.make_rollout`): the sampled responses,
    their reward, and what the sampler gave (``logprobs``/``values``: the old ones, or None for the trainer's
    forwards to compute; ``sampler_logprobs``: mu). :meth:`select` keeps rows (dynamic sampling)."""

    query_ids: Tensor
    query_mask: Tensor
    response_ids: Tensor
    masks: ResponseMasks
    reward: RewardScores
    logprobs: Tensor | None = None
    values: Tensor | None = None
    sampler_logprobs: Tensor | None = None
    filter_stats: dict[str, float] = dataclasses.field(default_factory=dict)
    prompt_index: Tensor | None = None

    select = select_rows


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
        disagreement: ``(B,)`` an ensemble reward's per-sample std of its members, or None.
        components: ``name -> (B,)`` the reward's named parts (a rule's pass, a mixture source's score).
        filter_stats: what dynamic sampling kept of the rows sampled (``rollout/groups_*``); empty without it.
        prompt_index: ``(B,)`` each row's prompt in the Trainer batch (rows kept by dynamic sampling keep theirs).
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
    disagreement: Tensor | None = None
    components: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    filter_stats: dict[str, float] = dataclasses.field(default_factory=dict)
    prompt_index: Tensor | None = None

    def __len__(self) -> int:
        return self.query_ids.shape[0]

    @property
    def action_mask(self) -> Tensor:
        return self.masks.action_mask

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor by name (mask fields as ``masks.<field>``, components as ``components.<name>``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if isinstance(getattr(self, f.name), Tensor)}
        out.update({f"masks.{k}": v for k, v in self.masks._asdict().items()})
        out.update({f"components.{k}": v for k, v in self.components.items()})
        return out

    #: The rows ``rows`` (a minibatch, the groups dynamic sampling keeps): every field's (:func:`select_rows`).
    select = select_rows

    def stats(self, kl_coef: float, with_values: bool) -> dict[str, float]:
        """Per-rollout statistics: scores, KL (and its cost at beta ``kl_coef``), rewards, lengths, EOS rate, the
        critic's explained variance when ``with_values``, what dynamic sampling kept (``rollout/groups_*``), an
        ensemble reward's mean disagreement (``reward/ensemble_std``) and each named component's mean
        (``reward/<name>``: a rule's pass rate, a mixture source's score)."""
        masks, mask = self.masks, self.action_mask
        lengths = masks.lengths.float()
        kl_seq = masked_sum(self.kl, mask, dim=1)
        stats = {
            "rollout/size": float(len(self)),
            "rollout/score_raw": self.raw_scores.mean(),
            "rollout/score": self.scores.mean(),
            "rollout/kl_seq": kl_seq.mean(),
            "rollout/kl_token": masked_mean(self.kl, mask),
            "rollout/kl_k1": masked_mean(kl_k1(self.logprobs, self.ref_logprobs), mask),
            "rollout/kl_cost": kl_coef * kl_seq.mean(),
            "rollout/reward_total": masked_sum(self.rewards, mask, dim=1).mean(),
            "rollout/length_mean": lengths.mean(),
            "rollout/length_p95": torch.quantile(lengths, 0.95),
            "rollout/eos_rate": masks.has_eos.float().mean(),
            "rollout/truncated": (~masks.has_eos & (masks.lengths > 0)).float().sum(),
            "rollout/advantage_mean": masked_mean(self.advantages, mask),
        }
        if with_values and mask.any():
            stats["ppo/explained_variance"] = explained_variance(self.values, self.returns, mask)
        stats.update(self.filter_stats)
        if self.disagreement is not None:
            stats["reward/ensemble_std"] = self.disagreement.mean()
        stats.update({f"reward/{name}": value.mean() for name, value in self.components.items()})
        return {k: float(v) for k, v in stats.items()}


def score_rows(score, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks, meta,
               size: int) -> RewardScores:
    """The reward of every row, ``score``-d (:meth:`PPOModule.reward_scores`) ``size`` rows at a time: one
    :class:`RewardScores` of them all (:func:`concat_scores`)."""
    return concat_scores([score(query_ids[rows], query_mask[rows], response_ids[rows], take_rows(masks, rows),
                                meta and meta[rows]) for rows in row_chunks(len(query_ids), size)])


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


#: Statistics that are not means: reduced across ranks with their own operation when logged.
STAT_REDUCTIONS = {"rollout/size": "sum", "rollout/truncated": "sum", "ppo/ratio_max": "max",
                   "offpolicy/ratio_max": "max", "engine/logprob_gap_max": "max", "rollout/groups_sampled": "sum",
                   "rollout/groups_kept": "sum"}


def log_synced(module, stats: dict[str, float], batch_size: int) -> None:
    """``module.log_dict`` the ``stats`` synced across ranks: means averaged (``sync_dist``), the counts and maxima
    of :data:`STAT_REDUCTIONS` summed and maxed."""
    for op in ("mean", *sorted(set(STAT_REDUCTIONS.values()))):
        part = {k: v for k, v in stats.items() if STAT_REDUCTIONS.get(k, "mean") == op}
        if part:
            module.log_dict(part, batch_size=batch_size, sync_dist=True, reduce_fx=op)


__all__ = ["STAT_REDUCTIONS", "Rollout", "Sampled", "Scored", "check_finite", "concat_scores", "log_synced",
           "row_chunks", "score_rows", "select_rows", "sequence_inputs", "take_rows"]
