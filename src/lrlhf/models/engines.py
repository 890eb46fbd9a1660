"""The rollout-engine seam: what PPO's sampler is, as one small protocol, so another backend (a vLLM or SGLang
server, a paged continuous-batching ``generate``) can be added later without touching PPO.

A rollout engine has four methods (:class:`RolloutEngine` says them; subclassing it is optional):

- ``sync(model)``: load or sync the weights the trainer's policy has now (called before every rollout; an engine
  that keeps its own copy, merged or in another process, refreshes it here);
- ``generate(query_ids, query_mask, *, max_new_tokens, temperature, eos_token_ids, pad_token_id, value_head=None,
  synced=False)``: ``(response_ids, logprobs, values)``, ``(B, R)`` each: the sampled tokens, each one's log-prob
  under the distribution it was drawn from (None when the engine gives none: the trainer then scores them), and a
  shared-trunk critic's values (None without a ``value_head``);
- ``logprobs(query_ids, query_mask, response_ids, temperature)``: ``(B, R)`` teacher-forced log-probs of given
  response tokens as the engine computes them: the weight-sync guard compares them with the trainer's;
- ``free()``: release what the engine holds between rollouts (caches, a server's KV blocks).

After every ``sync`` the PPO module checks the engine against the trainer on a few fixed tokens
(:func:`lrlhf.modules.guards.check_engine_sync`): log-probs that differ by more than the precision's tolerance stop
the run with the measured gap, so a stale or missing adapter is never sampled from silently (verl #7495, TRL
#5312).

Shipped: :class:`LocalEngine`, the trainer's own model object sampled in this process by
:func:`~lrlhf.models.generation.sample_with_logprobs` (``decoding``: eager, static-cache or compiled; with a KV
cache checked to grow, stopped rows leaving the batch). Its ``sync`` only points at the model (the same weights),
so its guard measures the decoding path against the training forward.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lrlhf.functional import token_logprobs


@runtime_checkable
class RolloutEngine(Protocol):
    """The protocol of a rollout engine (module docstring)."""

    def sync(self, model) -> None: ...

    def generate(self, query_ids: Tensor, query_mask: Tensor, *, max_new_tokens: int, temperature: float,
                 eos_token_ids, pad_token_id: int, value_head=None, synced: bool = False) -> tuple: ...

    def logprobs(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, temperature: float) -> Tensor: ...

    def free(self) -> None: ...


def sequence_inputs(query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, attention_mask, position_ids)`` of prompt ``(B, P)`` + response ``(B, R)``, all ``(B, P + R)``.

    Every response column is attended (as in ``generate``; columns after a stop are masked out of the losses, and
    causal attention keeps them from changing the earlier ones); positions count attended tokens, so a left-padded
    row gets the positions ``generate`` gave it.
    """
    input_ids = torch.cat([query_ids, response_ids], dim=1)
    attention_mask = torch.cat([query_mask, torch.ones_like(response_ids, dtype=query_mask.dtype)], dim=1)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def teacher_forced_logprobs(model, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor,
                            temperature: float) -> Tensor:
    """``(B, R)`` log-probs of ``response_ids`` after left-padded ``query_ids`` under ``model``, laid out as
    :func:`sequence_inputs` lays out every sequence of PPO's forwards."""
    input_ids, mask, positions = sequence_inputs(query_ids, query_mask, response_ids)
    length = response_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                   logits_to_keep=length + 1).logits[:, :length]
    return token_logprobs(logits, response_ids, temperature)


class LocalEngine:
    """The trainer's own model, sampled in this process (module docstring). ``decoding``: ``auto`` | ``eager`` |
    ``static`` | ``compiled`` (:func:`lrlhf.models.decoding.resolve`); ``bucket``: the static cache's length step."""

    def __init__(self, decoding: str = "auto", bucket: int = 64):
        from lrlhf.models.decoding import DECODING

        if decoding not in DECODING:
            raise ValueError(f"module.config.decoding={decoding!r}; choose one of {', '.join(DECODING)}")
        self.decoding, self.bucket, self.model = decoding, bucket, None

    def sync(self, model) -> None:
        self.model = model  # the same object: nothing to copy

    def _model(self):
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}: call sync(model) before generating")
        return self.model

    def generate(self, query_ids: Tensor, query_mask: Tensor, *, max_new_tokens: int, temperature: float,
                 eos_token_ids, pad_token_id: int, value_head=None, synced: bool = False) -> tuple:
        from lrlhf.models.generation import sample_with_logprobs

        return sample_with_logprobs(self._model(), query_ids, query_mask, max_new_tokens=max_new_tokens,
                                    temperature=temperature, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                                    value_head=value_head, synced=synced, decoding=self.decoding, bucket=self.bucket)

    @torch.no_grad()
    def logprobs(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, temperature: float) -> Tensor:
        return teacher_forced_logprobs(self._model(), query_ids, query_mask, response_ids, temperature)

    def free(self) -> None:
        from lrlhf.models.decoding import _CACHES

        if self.model is not None:
            _CACHES.pop(self.model, None)


__all__ = ["LocalEngine", "RolloutEngine", "sequence_inputs", "teacher_forced_logprobs"]
