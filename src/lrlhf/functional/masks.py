"""Masked statistics and the masks of a sampled response.

Masks are ``bool`` (or 0/1 float) tensors broadcastable to the data: true marks a valid position. All
statistics use valid positions only, and every output leaves invalid positions at exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

#: Sums a tensor across processes (e.g. ``torch.distributed.all_reduce`` wrapped to return its input), so
#: that :func:`masked_var` and :func:`masked_whiten` can use global statistics.
AllReduce = Callable[[Tensor], Tensor]


def masked_sum(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Sum of ``x`` over valid positions. ``mask`` broadcasts to ``x``; reduces all dims when ``dim`` is None."""
    masked = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return masked.sum() if dim is None else masked.sum(dim=dim)


def _count(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None) -> Tensor:
    return masked_sum(torch.ones_like(x), mask, dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Mean of ``x`` over valid positions.

    Args:
        x: any shape, e.g. ``(B, T)``.
        mask: broadcastable to ``x``; true = valid.
        dim: dims to reduce; ``None`` reduces everything to a scalar.

    Returns:
        The mean; a slice with no valid position gives **0** (not NaN): an empty minibatch or an empty
        response then contributes a zero loss with a zero gradient.
    """
    return masked_sum(x, mask, dim) / _count(x, mask, dim).clamp(min=1)


def _global_mean_and_count(x: Tensor, mask: Tensor, all_reduce: AllReduce | None) -> tuple[Tensor, Tensor]:
    sums = torch.stack([masked_sum(x, mask), _count(x, mask, None)])
    if all_reduce is not None:
        sums = all_reduce(sums)
    total, count = sums[0], sums[1]
    if count == 0:
        raise ValueError("masked statistics: the mask has no valid position, there is nothing to average")
    return total / count, count


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True, all_reduce: AllReduce | None = None) -> Tensor:
    """Variance of ``x`` over all valid positions (a scalar).

    Two-pass (mean first, then squared deviations) for accuracy. With ``all_reduce`` the sums and counts
    are reduced across processes, so the result equals the variance of the concatenated batch.

    Raises:
        ValueError: no valid position, or exactly one with ``unbiased=True`` (Bessel's correction divides by
            zero): silently returning NaN or 0 would poison whitening.
    """
    mean, count = _global_mean_and_count(x, mask, all_reduce)
    sq = masked_sum((x - mean) ** 2, mask).reshape(1)
    if all_reduce is not None:
        sq = all_reduce(sq)
    if unbiased:
        if count < 2:
            raise ValueError("masked_var(unbiased=True) needs at least two valid positions, got 1")
        return sq[0] / (count - 1)
    return sq[0] / count


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    all_reduce: AllReduce | None = None,
) -> Tensor:
    """``(x - mean) * rsqrt(var + eps)`` with statistics over valid positions; invalid positions are 0.

    Args:
        x: ``(B, T)`` or any shape; mask broadcastable to it.
        shift_mean: when False the mean is added back (scale only), as for reward whitening where the sign
            of the reward carries meaning.
        eps: added to the (unbiased) variance.
        all_reduce: use global statistics across processes (see :func:`masked_var`).

    Raises:
        ValueError: fewer than two valid positions (see :func:`masked_var`).
    """
    mean, _ = _global_mean_and_count(x, mask, all_reduce)
    var = masked_var(x, mask, unbiased=True, all_reduce=all_reduce)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=whitened.dtype, device=x.device))


class ResponseMasks(NamedTuple):
    """Masks of a batch of sampled responses, built from the sampled token ids.

    One reward slot per sampled action (README, `lrlhf.functional` conventions): actions are the response tokens
    up to and including the first EOS.

    Fields (``B`` rows, ``R`` generated positions):
        action_mask: ``(B, R)`` bool. Valid actions: positions ``<= terminal_index``. Also the transition
            mask (one reward per action) and the value mask (a value is predicted for each action's state).
        done_mask: ``(B, R)`` bool. True only at ``terminal_index``: the episode ends there (EOS, or the
            response was cut at the length limit; RLHF scores it then, so there is nothing to bootstrap).
        terminal_index: ``(B,)`` long. Last valid action; ``-1`` when the row has no generated token.
        has_eos: ``(B,)`` bool. The response stopped with an EOS (False: truncated at ``R`` tokens).
        lengths: ``(B,)`` long. Number of valid actions (``terminal_index + 1``).
    """

    action_mask: Tensor
    done_mask: Tensor
    terminal_index: Tensor
    has_eos: Tensor
    lengths: Tensor


def response_masks(
    response_ids: Tensor, eos_token_id: int | list[int], pad_token_id: int | None = None
) -> ResponseMasks:
    """Masks for sampled responses ``(B, R)`` (generated ids only, prompt excluded).

    The first EOS ends a response and is itself an action; anything after it (pads written by ``generate``,
    or garbage) is not. The pad id is deliberately **not** used to build the mask: a pad id sampled by the
    policy before the EOS is a real action, and masking it would hide it from the loss. ``pad_token_id`` is
    accepted so that callers state it, and is checked against the EOS ids for the common ``pad == eos``
    setup, which this rule handles (the first occurrence stops the response).

    Args:
        response_ids: ``(B, R)`` sampled token ids.
        eos_token_id: one id or several stop ids.
        pad_token_id: the id ``generate`` pads finished rows with (may equal an EOS id).
    """
    if response_ids.dim() != 2:
        raise ValueError(f"response_ids must be (B, R), got shape {tuple(response_ids.shape)}")
    batch, resp_len = response_ids.shape
    if resp_len == 0:
        empty = torch.zeros(batch, 0, dtype=torch.bool, device=response_ids.device)
        none = torch.full((batch,), -1, dtype=torch.long, device=response_ids.device)
        return ResponseMasks(empty, empty, none, empty.any(dim=1), none + 1)
    eos_ids = torch.as_tensor(
        eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id], device=response_ids.device
    )
    is_eos = torch.isin(response_ids, eos_ids)
    has_eos = is_eos.any(dim=1)
    # argmax on int gives the first maximum: the first EOS (0 when none, fixed below).
    first_eos = is_eos.int().argmax(dim=1)
    terminal_index = torch.where(has_eos, first_eos, torch.full_like(first_eos, resp_len - 1)).long()
    positions = torch.arange(resp_len, device=response_ids.device).expand(batch, resp_len)
    action_mask = positions <= terminal_index[:, None]
    done_mask = positions == terminal_index[:, None]
    return ResponseMasks(
        action_mask=action_mask,
        done_mask=done_mask,
        terminal_index=terminal_index,
        has_eos=has_eos,
        lengths=terminal_index + 1,
    )
