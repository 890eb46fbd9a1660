"""Advantage estimators: step 6 of :class:`~lrlhf.modules.PPOModule`, one class per variant, chosen by ``_target_``
(``module.advantage`` in the recipes; ``module/advantage=gae|rloo|grpo`` picks a shipped one). The math is in
:mod:`lrlhf.functional`; these classes hold the settings and say what the module must provide.

The interface (:class:`AdvantageEstimator`): ``samples_per_prompt`` (k responses per prompt, adjacent rows),
``needs_critic`` (the module then has a critic, and the values passed in are its), ``name`` (what the run is
called in summaries: ``ppo``, ``rloo``, ``grpo``) and ``__call__(rewards, values, action_mask) -> (advantages,
returns)``, all ``(B, R)``. A new estimator is a new subclass (``docs/extending.md``); a group-baseline one only
writes :meth:`GroupAdvantage.sequence_advantages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from lrlhf.functional import gae, grpo_advantages, informative_groups, masked_sum, masked_whiten, rloo_advantages
from lrlhf.utils.distributed import global_all_reduce, min_across_ranks
from lrlhf.utils.errors import InvariantError

WHITEN_SCOPES = ("global", "local")


@dataclass(frozen=True, kw_only=True)
class AdvantageEstimator:
    """``(rewards, values, action_mask) -> (advantages, returns)``; see the module docstring."""

    samples_per_prompt: int = 1
    """k responses per prompt (adjacent rows of the rollout)."""
    needs_critic: ClassVar[bool] = False
    """True: the module must have a critic (``module.critic``); False: it must have none."""

    @property
    def name(self) -> str:
        """The algorithm PPOModule runs with this estimator (summary keys ``gold/<name>``): the class name."""
        return type(self).__name__.lower()

    def __post_init__(self):
        if self.samples_per_prompt < 1:
            raise ValueError(f"module.advantage.samples_per_prompt must be >= 1, got {self.samples_per_prompt!r}")

    def __call__(self, rewards: Tensor, values: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(advantages, returns)``, ``(B, R)`` each, from the shaped per-action ``rewards``, the old ``values``
        (0 without a critic) and the valid actions ``action_mask``."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class GAE(AdvantageEstimator):
    """Masked GAE over the critic's values (:func:`lrlhf.functional.gae`), advantages whitened over the rollout's
    valid actions: PPO."""

    gamma: float = 1.0
    """Discount."""
    lam: float = 0.95
    """GAE lambda."""
    whiten: bool = True
    """Whiten the advantages over the rollout's valid actions (when at least two exist)."""
    whiten_scope: str = "global"
    """Statistics of the whitening across data-parallel ranks: ``global`` (all-reduced: the mean and variance of
    the whole global rollout, as one process would compute them) or ``local`` (each rank its own rows)."""
    needs_critic: ClassVar[bool] = True
    name: ClassVar[str] = "ppo"

    def __post_init__(self):
        super().__post_init__()
        for key in ("gamma", "lam"):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"module.advantage.{key} must be in [0, 1], got {getattr(self, key)!r}")
        if self.whiten_scope not in WHITEN_SCOPES:
            raise ValueError(f"module.advantage.whiten_scope must be one of {list(WHITEN_SCOPES)}, "
                             f"got {self.whiten_scope!r}")

    def __call__(self, rewards: Tensor, values: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        advantages, returns = gae(rewards, values, action_mask, self.gamma, self.lam)
        if self.whiten:
            all_reduce = global_all_reduce() if self.whiten_scope == "global" else None
            count = action_mask.sum().to(advantages.dtype).reshape(1)
            if (all_reduce(count) if all_reduce is not None else count) >= 2:  # the same answer on every rank
                advantages = masked_whiten(advantages, action_mask, all_reduce=all_reduce)
        return advantages, returns


@dataclass(frozen=True, kw_only=True)
class GroupAdvantage(AdvantageEstimator):
    """No critic: each sample's sequence reward (the sum of its shaped rewards: score - beta * KL) against the other
    samples of its prompt, broadcast to every valid action; returns are 0. Subclasses write
    :meth:`sequence_advantages`."""

    samples_per_prompt: int = 4

    def __post_init__(self):
        if self.samples_per_prompt < 2:
            raise ValueError(f"module.advantage.samples_per_prompt must be >= 2 for {type(self).__name__} (a sample "
                             f"is compared with the others of its prompt), got {self.samples_per_prompt!r}")

    def sequence_advantages(self, rewards: Tensor) -> Tensor:
        """``(B,)`` advantages from ``(B,)`` sequence rewards, groups of ``samples_per_prompt`` adjacent rows."""
        raise NotImplementedError

    def __call__(self, rewards: Tensor, values: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        sequence = self.sequence_advantages(masked_sum(rewards, action_mask, dim=1))  # (B,)
        advantages = sequence[:, None] * action_mask.to(sequence.dtype)
        return advantages, torch.zeros_like(advantages)


@dataclass(frozen=True, kw_only=True)
class RLOO(GroupAdvantage):
    """REINFORCE leave-one-out (Ahmadian et al., 2024): ``r_i`` minus the mean of the other ``k - 1`` samples."""

    def sequence_advantages(self, rewards: Tensor) -> Tensor:
        return rloo_advantages(rewards, self.samples_per_prompt)


@dataclass(frozen=True, kw_only=True)
class GRPO(GroupAdvantage):
    """Group-relative advantages (Shao et al., 2024): ``(r_i - mean_g) / (std_g + eps)``.

    ``scale_by_std=False`` is Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training"): the group mean
    is subtracted, no division by the group's std (which up-weights prompts that are too easy or too hard). Their
    other change, no ``1 / |o_i|`` per-response length normalisation in the loss, is the policy loss's default
    aggregation here: a token-level mean over the minibatch (:class:`lrlhf.functional.TokenMean`).
    """

    scale_by_std: bool = True
    """Divide by the group's std (GRPO); False = Dr. GRPO."""
    eps: float = 1e-6
    """Added to the group's std."""

    def sequence_advantages(self, rewards: Tensor) -> Tensor:
        return grpo_advantages(rewards, self.samples_per_prompt, eps=self.eps, scale=self.scale_by_std)


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's dynamic sampling (Yu et al. 2025) for the group estimators (``module/group_filter=dynamic_sampling``):
    the groups whose scores are all equal (:func:`~lrlhf.functional.informative_groups`) are dropped from the
    rollout before its advantages, and the update keeps at most ``groups`` of the others. The refill is by
    over-sampling: the data batch holds more prompts than ``groups`` (e.g. ``data.batch_size=16
    module.group_filter.groups=8``), so a rollout still has ``groups`` informative ones when some are degenerate.
    Every rank keeps as many as the one with the fewest (the ranks step together).

    A rollout with no informative group makes no optimiser step; ``max_empty`` such rollouts in a row stop the run
    (the policy solves or fails every prompt alike: ``trainer.max_steps`` would never be reached).

    Args:
        groups: groups an update keeps at most; None = every informative group of the batch.
        tolerance: a group whose scores' range is at most this is degenerate.
        max_empty: empty rollouts in a row that stop the run.
    """

    groups: int | None = None
    tolerance: float = 0.0
    max_empty: int = 10

    def __post_init__(self):
        if self.groups is not None and self.groups < 1:
            raise ValueError(f"module.group_filter.groups must be >= 1 or null, got {self.groups!r}")
        if not self.tolerance >= 0:
            raise ValueError(f"module.group_filter.tolerance must be >= 0, got {self.tolerance!r}")
        if self.max_empty < 1:
            raise ValueError(f"module.group_filter.max_empty must be >= 1, got {self.max_empty!r}")

    def rows(self, scores: Tensor, k: int) -> tuple[Tensor, dict[str, float]]:
        """``(rows kept, stats)``: the rows of the first informative groups (``groups`` at most, the same number on
        every rank), and ``rollout/groups_sampled``, ``rollout/groups_informative_frac``, ``rollout/groups_kept``."""
        informative = informative_groups(scores, k, self.tolerance)
        chosen = torch.nonzero(informative).squeeze(-1)
        n = int(chosen.numel()) if self.groups is None else min(int(chosen.numel()), self.groups)
        chosen = chosen[:min_across_ranks(n)]
        rows = (chosen[:, None] * k + torch.arange(k, device=chosen.device)).reshape(-1)
        stats = {"rollout/groups_sampled": float(informative.numel()),
                 "rollout/groups_informative_frac": float(informative.float().mean()) if informative.numel() else 0.0,
                 "rollout/groups_kept": float(chosen.numel())}
        return rows, stats

    def check_empty(self, in_a_row: int, rollout: int) -> None:
        """Stop the run after ``max_empty`` rollouts in a row left no row (``rollout``: the last one's number)."""
        if in_a_row >= self.max_empty:
            raise InvariantError(
                f"dynamic sampling (module.group_filter) found no group with unequal scores in {in_a_row} rollouts in "
                f"a row (rollout {rollout}): the policy solves or fails every prompt alike, so nothing is left to "
                "learn and no optimiser step is made. Stop here, or raise module.group_filter.max_empty, or lower "
                "module.group_filter.tolerance")


__all__ = ["GAE", "GRPO", "RLOO", "WHITEN_SCOPES", "AdvantageEstimator", "DynamicSampling", "GroupAdvantage"]
