r"""Combining the scores of a reward-model ensemble into one reward (Coste et al., 2023, "Reward model ensembles
help mitigate overoptimization").

Every rule takes the members' calibrated scores ``(N, B)`` (member ``i``, sample ``b``; each member normalised by
its own calibration, so the members share one scale) and returns ``(B,)``:

- :class:`EnsembleMean`: :math:`\bar r = \frac1N \sum_i r_i` — the plain average;
- :class:`MeanMinusStd`: :math:`\bar r - \lambda\, s` with :math:`s` the members' standard deviation
  (uncertainty-weighted: samples the members disagree on are worth less);
- :class:`WorstCase`: :math:`\min_i r_i` — the most pessimistic member;
- :class:`SingleMember`: :math:`r_k` — one member alone (the single-RM baseline, while the others only watch:
  the disagreement is still measured and logged).

:func:`disagreement` is :math:`s` itself, the signal logged per rollout. The standard deviation is the unbiased
one (``correction=1``): with N members it estimates the spread of the member population, not of these N alone.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(scores: Tensor) -> None:
    if scores.dim() != 2:
        raise ValueError(f"ensemble scores must be (members, batch), got shape {tuple(scores.shape)}")
    if scores.shape[0] < 1:
        raise ValueError("an ensemble needs at least one member")


def disagreement(scores: Tensor) -> Tensor:
    """``(B,)`` the members' unbiased standard deviation per sample (0 for a single member)."""
    _check(scores)
    if scores.shape[0] == 1:
        return torch.zeros_like(scores[0])
    return scores.std(dim=0, correction=1)


class EnsembleCombine:
    """A combination rule: ``rule(scores (N, B)) -> (B,)``. Subclasses implement :meth:`combine`."""

    def __call__(self, scores: Tensor) -> Tensor:
        _check(scores)
        return self.combine(scores)

    def combine(self, scores: Tensor) -> Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


class EnsembleMean(EnsembleCombine):
    """The members' mean."""

    def combine(self, scores: Tensor) -> Tensor:
        return scores.mean(dim=0)


class MeanMinusStd(EnsembleCombine):
    """Uncertainty-weighted: the mean less ``coef`` times the members' (unbiased) standard deviation."""

    def __init__(self, coef: float = 1.0):
        if not coef >= 0:
            raise ValueError(f"coef must be >= 0, got {coef}")
        self.coef = float(coef)

    def combine(self, scores: Tensor) -> Tensor:
        return scores.mean(dim=0) - self.coef * disagreement(scores)

    def describe(self) -> str:
        return f"MeanMinusStd(coef={self.coef:g})"


class WorstCase(EnsembleCombine):
    """The lowest member score."""

    def combine(self, scores: Tensor) -> Tensor:
        return scores.min(dim=0).values


class SingleMember(EnsembleCombine):
    """Member ``index`` alone: optimise one reward model and watch the ensemble's disagreement."""

    def __init__(self, index: int = 0):
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        self.index = int(index)

    def combine(self, scores: Tensor) -> Tensor:
        if self.index >= scores.shape[0]:
            raise ValueError(f"SingleMember(index={self.index}) of an ensemble of {scores.shape[0]} members")
        return scores[self.index]

    def describe(self) -> str:
        return f"SingleMember(index={self.index})"
