"""Prefix sharing: the tensor math of scoring several continuations of one prefix in ONE row.

A preference pair (or a K-way ranking) repeats its prompt in every sequence. The shared layout puts the common
prefix once, then each continuation after it, in one row::

    columns:     [ prefix (s) | continuation 1 | continuation 2 | ... | padding ]
    segment_ids: [ 0 ... 0    | 1 ... 1        | 2 ... 2        | ... | -1 ... ]
    positions:   [ 0 .. s-1   | s, s+1, ...    | s, s+1, ...    | ... | 0, 1, .. ]

With :func:`shared_attention_mask` (a continuation sees the prefix and its own earlier tokens, never another
continuation, and no real token sees padding) every token's hidden state equals the one it has in its own
unshared sequence, so a reward read at a sequence's last token and the log-probs of its targets are those of the
unshared forward. ``rows`` / ``cols`` map token ``t`` of sequence ``n`` (as the unshared, unpadded sequence numbers
it) to its place ``(rows[n], cols[n, t])`` in the shared layout.

The group estimators' rollouts (RLOO, GRPO: ``k`` samples of one left-padded prompt in adjacent rows) share the
same way in :func:`group_layout`: the prompt's ``P`` columns once, then the ``k`` responses of ``R`` columns each,
so a group costs ``P + k R`` columns instead of ``k (P + R)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lrlhf.functional.logprobs import token_logprobs

PREFIX, PADDING = 0, -1


def common_prefix_length(sequences: Sequence[Tensor]) -> int:
    """The longest prefix every 1-D id tensor of ``sequences`` starts with, capped at ``min(len) - 1`` so each
    sequence keeps at least its last token (where a reward model reads its score) in its own segment."""
    if not sequences:
        raise ValueError("common_prefix_length needs at least one sequence")
    shortest = min(len(s) for s in sequences)
    if shortest == 0:
        raise ValueError("common_prefix_length: an empty sequence has no last token")
    first = sequences[0][:shortest]
    same = torch.ones(shortest, dtype=torch.bool)
    for other in sequences[1:]:
        same &= first == other[:shortest]
    differs = (~same).nonzero()
    length = int(differs[0]) if len(differs) else shortest
    return min(length, shortest - 1)


def shared_attention_mask(segment_ids: Tensor) -> Tensor:
    """``(G, 1, L, L)`` bool, True where query column ``q`` may attend key column ``k``.

    ``k <= q`` (causal) and either ``k`` is in the prefix (segment 0) and ``q`` is a real token, or both are in
    the same segment. A padding column (segment -1) attends the padding before it and itself, so no row of the
    mask is empty (an all-masked softmax row gives NaN in some kernels); no real token attends padding.

    Args:
        segment_ids: ``(G, L)`` long: 0 prefix, ``j >= 1`` continuation ``j``, -1 padding.
    """
    columns = torch.arange(segment_ids.shape[1], device=segment_ids.device)
    causal = columns[None, :] <= columns[:, None]  # (L, L): [q, k]
    query, key = segment_ids[:, :, None], segment_ids[:, None, :]  # (G, L, 1), (G, 1, L)
    sees = (key == query) | ((key == PREFIX) & (query != PADDING))
    return (sees & causal)[:, None]


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean attention mask as the additive float mask eager attention adds to its scores: 0 where attended,
    the dtype's most negative finite value elsewhere (what transformers' own eager masks hold)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


def gather_last(x: Tensor, rows: Tensor, cols: Tensor, lengths: Tensor) -> Tensor:
    """``(N, ...)``: ``x`` (``(G, L, ...)``, shared layout) at each sequence's last token.

    Args:
        rows: ``(N,)`` the row of each sequence. cols: ``(N, T)`` its columns. lengths: ``(N,)`` its length.
    """
    return x[rows, cols.gather(1, (lengths - 1)[:, None]).squeeze(1)]


def shared_logprob_sums(logits: Tensor, input_ids: Tensor, rows: Tensor, cols: Tensor, targets: Tensor) -> Tensor:
    """``(N,)`` summed log-probs of each sequence's target tokens from a shared-layout forward.

    The unshared computation is ``masked_sum(token_logprobs(logits[:, :-1], ids[:, 1:]), targets[:, 1:])`` on the
    right-padded ``(N, T)`` sequences: token ``t`` is predicted by the logits of token ``t - 1``. Here token
    ``t`` of sequence ``n`` is ``input_ids[rows[n], cols[n, t]]`` and its predictor is column ``cols[n, t - 1]`` of
    the same row (the last prefix column predicts the first token of every continuation). Only target positions
    are computed (no ``(N, T, V)`` tensor is built), and the result keeps the graph to ``logits``.

    Args:
        logits: ``(G, L, V)`` of the shared forward.
        input_ids: ``(G, L)`` its ids.
        rows, cols: see :func:`gather_last`.
        targets: ``(N, T)`` bool, True at the tokens to score (the padded layout's ``loss_mask``; column 0,
            having no predictor, must be False).
    """
    if targets.shape != cols.shape:
        raise ValueError(f"targets {tuple(targets.shape)} and cols {tuple(cols.shape)} do not align")
    if targets[:, 0].any():
        raise ValueError("a sequence's first token has no predictor and cannot be a target")
    seq, tok = targets.nonzero(as_tuple=True)  # target (sequence, token) pairs, tok >= 1
    row = rows[seq]
    picked = token_logprobs(logits[row, cols[seq, tok - 1]], input_ids[row, cols[seq, tok]])
    sums = torch.zeros(cols.shape[0], dtype=picked.dtype, device=picked.device)
    return sums.index_add(0, seq, picked)


def group_layout(query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, position_ids, segment_ids)``, ``(G, P + k R)`` each: the shared layout of ``G = B / k`` groups
    of ``k`` adjacent rows that share one left-padded prompt.

    Row ``g`` holds the group's prompt once, as its ``P`` padded columns (left padding is a padding segment), then
    response ``j`` of the group in columns ``P + j R .. P + (j + 1) R - 1`` (segment ``j + 1``). Positions are those
    of the unshared rows (:func:`lrlhf.models.engines.sequence_inputs`): the prompt's count its attended tokens,
    every response's continue from the prompt's length. Every response column is attended, as in the unshared rows.

    Args:
        query_ids, query_mask: ``(B, P)``, rows ``g k .. g k + k - 1`` equal (the caller checks it).
        response_ids: ``(B, R)``.
    """
    rows, prompt_len = query_ids.shape
    if k < 1 or rows % k:
        raise ValueError(f"group_layout: {rows} rows are not whole groups of {k}")
    groups, resp_len, device = rows // k, response_ids.shape[1], query_ids.device
    mask = query_mask[::k].long()
    prompt_positions = (mask.cumsum(-1) - 1).clamp(min=0)
    response_positions = mask.sum(-1, keepdim=True) + torch.arange(resp_len, device=device).repeat(k)
    segments = torch.arange(1, k + 1, device=device).repeat_interleave(resp_len).expand(groups, -1)
    return (
        torch.cat([query_ids[::k], response_ids.reshape(groups, k * resp_len)], dim=1),
        torch.cat([prompt_positions, response_positions], dim=1),
        torch.cat([torch.where(mask.bool(), PREFIX, PADDING), segments], dim=1),
    )


def _response_index(k: int, resp_len: int, device) -> Tensor:
    """``(k, R)``: for response ``j``, token ``t``, the column of the last ``k R + 1`` of a :func:`group_layout` row
    whose logits predict it (0: the last prompt column, for every response's first token)."""
    index = torch.arange(k, device=device)[:, None] * resp_len + torch.arange(resp_len, device=device)
    index[:, 0] = 0
    return index


def group_response_columns(prompt_len: int, k: int, resp_len: int, device=None) -> Tensor:
    """``(k R,)`` the columns of a :func:`group_layout` row (``P + k R`` columns) whose logits predict each response
    token, response by response: pass them as ``logits_to_keep`` and the LM head runs on exactly those columns,
    its ``(G, k R, V)`` logits reshaping to ``(G k, R, V)`` with no copy (:func:`group_response_logits` instead
    indexes logits already computed for the last ``k R + 1`` columns: a copy of the ``V``-wide tensor and, in
    the backward, a zero-filled one)."""
    return prompt_len - 1 + _response_index(k, resp_len, device).flatten()


def group_response_logits(logits: Tensor, k: int, resp_len: int) -> Tensor:
    """``(G k, R, V)``: the logits predicting each response token, from the last ``k R + 1`` columns of a
    :func:`group_layout` forward (``logits`` ``(G, k R + 1, V)``: the last prompt column, then the responses).

    Token ``t`` of response ``j`` is predicted by the column before it in its own segment, and the first token of
    every response by the last prompt column (index 0 here), as in the unshared rows' columns ``P - 1 .. P + R - 2``.
    """
    if logits.shape[1] != k * resp_len + 1:
        raise ValueError(f"group_response_logits: {logits.shape[1]} columns, expected k R + 1 = {k * resp_len + 1}")
    index = _response_index(k, resp_len, logits.device)
    return logits[:, index.flatten()].reshape(logits.shape[0] * k, resp_len, logits.shape[-1])


__all__ = [
    "PADDING",
    "PREFIX",
    "additive_mask",
    "common_prefix_length",
    "gather_last",
    "group_layout",
    "group_response_columns",
    "group_response_logits",
    "shared_attention_mask",
    "shared_logprob_sums",
]
