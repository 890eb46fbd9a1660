"""Log-probabilities and entropy of token distributions, memory-lean.

Logits of an LM are ``(B, T, V)`` with ``V`` in the tens of thousands: a full ``log_softmax`` of a batch
doubles the largest tensor of the step (and upcasting bf16 to fp32 doubles it again). These functions work
on row chunks, upcast one chunk at a time to at least fp32, and keep autograd intact (the PPO update differentiates
through them).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Rows (positions) per chunk: ``chunk_rows * V`` fp32 values are alive at once (512 * 50k = 100 MB).
DEFAULT_CHUNK_ROWS = 512


def _upcast(x: Tensor) -> Tensor:
    """At least fp32 (bf16/fp16 are upcast; fp64 stays fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def token_logprobs(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> Tensor:
    """``log softmax(logits / temperature)[token]`` for each position.

    Args:
        logits: ``(..., V)`` raw logits whose position ``i`` predicts ``tokens[..., i]`` (the caller shifts:
            for a causal LM, ``logits[:, :-1]`` predicts ``input_ids[:, 1:]``).
        tokens: ``(...)`` token ids, same leading shape as ``logits``.
        temperature: the sampling temperature; the returned log-probs are those of the distribution the
            tokens were sampled from (no top-k/top-p: a warped distribution is not this one).
        chunk_rows: positions processed at once.

    Returns:
        ``(...)`` log-probabilities in fp32 (fp64 for fp64 logits), differentiable w.r.t. ``logits``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} do not align")
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1, 1)
    out = []
    for rows in _chunks(flat_logits.shape[0], chunk_rows):
        scaled = _upcast(flat_logits[rows]) / temperature
        picked = scaled.gather(-1, flat_tokens[rows]).squeeze(-1)
        out.append(picked - torch.logsumexp(scaled, dim=-1))
    if not out:
        return torch.zeros(tokens.shape, dtype=_upcast(logits).dtype, device=logits.device)
    return torch.cat(out).reshape(tokens.shape)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at each position.

    Args:
        logits: ``(..., V)``.

    Returns:
        ``(...)`` fp32, ``H = -sum(softmax(z) * log_softmax(z))`` with ``z = logits / temperature``
        (``log_softmax`` subtracts the max first, so a peaked distribution keeps its small entropy accurate).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    flat = logits.reshape(-1, logits.shape[-1])
    out = []
    for rows in _chunks(flat.shape[0], chunk_rows):
        z = _upcast(flat[rows]) / temperature
        log_p = torch.log_softmax(z, dim=-1)
        out.append(-(log_p.exp() * log_p).sum(dim=-1))
    if not out:
        return torch.zeros(logits.shape[:-1], dtype=_upcast(logits).dtype, device=logits.device)
    return torch.cat(out).reshape(logits.shape[:-1])
