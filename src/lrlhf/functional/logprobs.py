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


def _compute_dtype(x: Tensor) -> torch.dtype:
    """At least fp32 (bf16/fp16 are upcast; fp64 stays fp64)."""
    return torch.promote_types(x.dtype, torch.float32)


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

    The gradient is written chunk by chunk into one tensor of the logits' shape and dtype
    (:class:`_TokenLogprobs`): autograd through sliced chunks built a zero-filled full-size gradient per chunk and
    summed them (3x the time of this at the GRPO bench's shape, more with more chunks).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} do not align")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if tokens.numel() == 0:
        return torch.zeros(tokens.shape, dtype=_compute_dtype(logits), device=logits.device)
    return _TokenLogprobs.apply(logits, tokens, float(temperature), int(chunk_rows))


def _scaled(chunk: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """``chunk / temperature`` in ``dtype``: may be ``chunk`` itself (fp32 at T = 1), never to be written to."""
    chunk = chunk.to(dtype)
    return chunk if temperature == 1.0 else chunk / temperature


class _TokenLogprobs(torch.autograd.Function):
    """:func:`token_logprobs` with a chunked backward: ``d/dz (z_t - logsumexp(z)) = onehot(t) - softmax(z)``, each
    chunk's softmax recomputed from the saved ``logsumexp`` (no full-size tensor is kept between the passes)."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float, chunk_rows: int) -> Tensor:
        flat, flat_tokens = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1, 1)
        dtype = _compute_dtype(logits)
        picked = flat.new_empty(flat.shape[0], dtype=dtype)
        lse = flat.new_empty(flat.shape[0], dtype=dtype)
        for rows in _chunks(flat.shape[0], chunk_rows):
            z = _scaled(flat[rows], dtype, temperature)
            lse[rows] = torch.logsumexp(z, dim=-1)
            picked[rows] = z.gather(-1, flat_tokens[rows]).squeeze(-1)
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return (picked - lse).reshape(tokens.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        logits, tokens, lse = ctx.saved_tensors
        flat, flat_tokens = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1, 1)
        grad_rows = grad_out.reshape(-1, 1).to(lse.dtype)
        grad = torch.empty_like(flat)
        for rows in _chunks(flat.shape[0], ctx.chunk_rows):
            g = grad_rows[rows]
            dz = (_scaled(flat[rows], lse.dtype, ctx.temperature) - lse[rows, None]).exp_()  # softmax, a new tensor
            dz.mul_(-g).scatter_add_(-1, flat_tokens[rows], g)
            grad[rows] = dz if ctx.temperature == 1.0 else dz.div_(ctx.temperature)
        return grad.reshape(logits.shape), None, None, None


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
        log_p = torch.log_softmax(_scaled(flat[rows], _compute_dtype(flat), temperature), dim=-1)
        out.append(-(log_p.exp() * log_p).sum(dim=-1))
    if not out:
        return torch.zeros(logits.shape[:-1], dtype=_compute_dtype(logits), device=logits.device)
    return torch.cat(out).reshape(logits.shape[:-1])
