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
so its guard measures the decoding path against the training forward. :class:`MergedEngine` (``module/engine=
merged``) samples from a copy of the policy with its LoRA adapter merged into the base, in the run's compute dtype
(bf16 under ``bf16-mixed``): one matmul per layer and half the bytes per decode step, at the memory of one more
copy of the base in that dtype. An engine that samples in a reduced precision says so (``reduced``): the trainer
then recomputes the old log-probs (the sampler's stay the off-policy correction's ``mu``) and its guards allow
that precision's rounding.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lrlhf.functional import token_logprobs

HALF_DTYPES = (torch.float16, torch.bfloat16)


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

    #: samples from half-precision weights while the trainer keeps wider ones (the old log-probs are then
    #: recomputed by the trainer, and the guards allow half precision's rounding)
    reduced = False

    def __init__(self, decoding: str | None = "auto", bucket: int | None = 64):
        from lrlhf.models.decoding import DECODING

        if decoding is not None and decoding not in DECODING:
            raise ValueError(f"module.config.decoding={decoding!r}; choose one of {', '.join(DECODING)}")
        self.decoding, self.bucket, self.model = decoding, bucket, None  # None: the module's config sets them

    def settings(self) -> dict:
        """What the run's hyperparameters record of it."""
        return {"decoding": self.decoding, "bucket": self.bucket}

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


def _refuse_tied(copy, layers: dict) -> None:
    """Refuse an adapted layer whose weight the copy ties to another module (tied embeddings): a merged delta would
    reach both, while the policy adapts only one."""
    shared: dict[int, list[str]] = {}
    for name, parameter in copy.named_parameters(remove_duplicate=False):
        shared.setdefault(parameter.data_ptr(), []).append(name)
    for name in layers:
        tied = shared.get(copy.get_submodule(name).weight.data_ptr(), [])
        if len(tied) > 1:
            raise ValueError(f"module.engine=merged: the adapted layer {name} shares its weight with {tied} (tied "
                             "embeddings): merging would adapt both; use the local engine")


class MergedEngine(LocalEngine):
    """Samples from a copy of the policy: the LoRA ``adapter`` merged into the base, cast to ``dtype`` (module
    docstring). ``dtype``: ``auto`` (autocast's dtype when :meth:`sync` runs under autocast, as in a ``bf16-mixed``
    training step; else the weights'), or a torch dtype name (``bfloat16``, ``float16``, ``float32``).

    :meth:`sync` takes the model; the merge happens at the next ``generate`` or ``logprobs``, under the autocast
    state the rollout runs in (a sync outside the training step, as ``configure_model``'s, copies nothing). The
    copy is made once (the base without adapters, a deep copy cast to ``dtype``; again only if the dtype or the
    model changes); every merge writes ``W + delta`` (peft's ``get_delta_weight`` of ``adapter``, summed in fp32)
    into the copy's layers that carry the adapter, so the copy follows each update to the dtype's rounding. Without a
    shared-trunk critic's values (the trainer's value forward computes them); a quantised (k-bit) base, DoRA and a
    sharded forward (FSDP) are refused.
    """

    def __init__(self, dtype: str = "auto", adapter: str = "policy", decoding: str | None = None,
                 bucket: int | None = None):
        super().__init__(decoding, bucket)
        if dtype != "auto" and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ValueError(f"module.engine.dtype={dtype!r}: auto or a torch dtype name (bfloat16, float16, float32)")
        self.dtype_setting, self.adapter, self.copy, self.source, self.pending = dtype, adapter, None, None, None
        self.resolved: torch.dtype | None = None  # ``auto`` as first seen under autocast, kept for the run

    def settings(self) -> dict:
        return {**super().settings(), "dtype": self.dtype_setting, "adapter": self.adapter}

    def _dtype(self, weights: Tensor) -> torch.dtype:
        """The copy's dtype: the setting's; ``auto``: the first autocast dtype a sync or merge runs under (the
        training step's, bf16 under ``bf16-mixed``), kept for the run, so a sample drawn outside the step (a
        held-out evaluation in a callback) does not rebuild the copy; the weights' own until one is seen."""
        if self.dtype_setting != "auto":
            return getattr(torch, self.dtype_setting)
        device = weights.device.type
        if self.resolved is None and torch.is_autocast_enabled(device):
            self.resolved = torch.get_autocast_dtype(device)
        return self.resolved or weights.dtype

    @property
    def reduced(self) -> bool:
        """Half-precision weights beside the trainer's wider ones (known at the sync, before any merge)."""
        from lrlhf.utils.compat import unwrap_model

        model = self.pending if self.pending is not None else self.source
        if model is None:
            return False
        weights = next(p for p in unwrap_model(model).parameters() if p.is_floating_point())
        return self._dtype(weights) in HALF_DTYPES and weights.dtype not in HALF_DTYPES

    def sync(self, model) -> None:
        self.pending = model  # merged at the next use, under the autocast state the rollout runs in

    def _model(self):
        if self.pending is not None:
            self._merge(self.pending)
            self.pending = None
        return super()._model()

    @torch.no_grad()
    def _merge(self, model) -> None:
        import copy

        from peft.tuners.lora import LoraLayer

        from lrlhf.models.lora import is_quantised
        from lrlhf.utils.compat import unwrap_model

        if is_quantised(model):
            raise ValueError("module.engine=merged: a quantised (k-bit) base cannot take the merged adapter; use the "
                             "local engine (module.engine=null)")
        base = unwrap_model(model)
        layers = {name: layer for name, layer in base.named_modules() if isinstance(layer, LoraLayer)
                  and (self.adapter in layer.lora_A or self.adapter in getattr(layer, "lora_embedding_A", {}))}
        if not layers:
            raise ValueError(f"module.engine=merged: the policy has no LoRA adapter {self.adapter!r} to merge")
        if any(layer.use_dora.get(self.adapter, False) for layer in layers.values()):
            raise ValueError("module.engine=merged: DoRA adapters are not merged here; use the local engine")
        weights = next(p for p in base.parameters() if p.is_floating_point())
        dtype = self._dtype(weights)
        if self.copy is None or self.source is not model or self.copy.dtype != dtype:
            self.copy = None  # the old copy goes before the new one is made
            copied = copy.deepcopy(model).unload().to(dtype).eval().requires_grad_(False)
            _refuse_tied(copied, layers)
            self.copy, self.source = copied, model
        for name, layer in layers.items():
            target = self.copy.get_submodule(name)
            merged = layer.base_layer.weight.float() + layer.get_delta_weight(self.adapter).float()
            target.weight.copy_(merged.to(target.weight.dtype))
        self.model = self.copy

    def generate(self, query_ids: Tensor, query_mask: Tensor, *, max_new_tokens: int, temperature: float,
                 eos_token_ids, pad_token_id: int, value_head=None, synced: bool = False) -> tuple:
        if synced:
            raise ValueError("module.engine=merged samples from a whole copy of the policy on each process: a sharded "
                             "forward (FSDP) needs the local engine (module.engine=null)")
        # (ids, logprobs): a shared trunk's values come from the trainer's value forward
        return super().generate(query_ids, query_mask, max_new_tokens=max_new_tokens, temperature=temperature,
                                eos_token_ids=eos_token_ids, pad_token_id=pad_token_id)


__all__ = ["LocalEngine", "MergedEngine", "RolloutEngine", "sequence_inputs", "teacher_forced_logprobs"]
