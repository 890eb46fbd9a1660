"""Pairwise-preference math of reward-model training: the pairs of a K-way ranking, pairwise accuracy, and a
summary of preference margins (the losses themselves are in :mod:`lrlhf.functional.losses`)."""

from __future__ import annotations

import torch
from torch import Tensor


def ranking_pairs(ranks: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every unordered within-group pair once, oriented better-first: ``(first, second, target)``, each ``(P,)``.

    ``ranks`` and ``group`` are ``(N,)`` (rank within the group, 1 = best; the group's integer id).
    ``target`` is 1 when ``first`` ranks strictly better, 0.5 for equal ranks (the orientation of a tie is the
    row order, which does not matter for a symmetric target).
    """
    n = ranks.shape[0]
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=ranks.device), diagonal=1)
    i, j = ((group[:, None] == group[None, :]) & upper).nonzero(as_tuple=True)
    swap = ranks[j] < ranks[i]
    first, second = torch.where(swap, j, i), torch.where(swap, i, j)
    target = torch.where(ranks[i] == ranks[j], 0.5, 1.0)
    return first, second, target


def pairwise_accuracy(margin: Tensor) -> Tensor:
    """``(P,)`` 1 where the preferred side scores higher, 0 where lower, 1/2 for equal scores."""
    return (margin > 0).float() + 0.5 * (margin == 0).float()


def margin_summary(margins: Tensor) -> dict[str, float]:
    """Mean, std (unbiased; 0 for one value) and the 5/25/50/75/95 % quantiles of ``(P,)`` margins."""
    qs = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=margins.dtype, device=margins.device)
    quantiles = torch.quantile(margins, qs).tolist()
    std = margins.std().item() if margins.numel() > 1 else 0.0
    out = {"mean": margins.mean().item(), "std": std}
    out.update({f"q{int(round(q * 100)):02d}": v for q, v in zip(qs.tolist(), quantiles, strict=True)})
    return out
