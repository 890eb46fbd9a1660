"""Upstream API differences inside the dependency range pyproject.toml declares, each handled here, once.

The range declared is the range tested: CI runs the suite on the newest releases and again on every declared
floor (``.ci/run``, the lowest-versions leg). When an upstream API changes inside the range, the code asks
this module for the spelling instead of naming one version's:

- **The KV-cache keyword** of a causal LM's ``forward``: ``past_key_values`` up to transformers 5.23, ``cache``
  from 5.24 (``past_key_values`` then still works, deprecated until 5.40). A keyword the model does not take
  lands in its ``**kwargs`` and is silently ignored: every decode step then sees one token and no context, the
  defect that made PPO worsen the policy under transformers 5.17. :func:`cache_keyword` reads the name from the
  model's own ``forward`` signature (so remote-code models that kept the old name work too), falling back to
  the installed version for a ``forward`` that only takes ``**kwargs``.
- **The static cache's dtypes**: a ``StaticCache`` layer allocated its keys and its values both in the keys' dtype
  up to transformers 5.2x (5.0 and 5.17 do; 5.25 gives each its own). Under bf16 autocast a Llama or Qwen2 attention
  makes fp32 keys (its rotary embedding promotes them) and bf16 values, so the first value copy failed:
  ``index_copy_(): self and source expected to have the same dtype`` (the compiled sampler on CUDA under
  bf16-mixed; on a CPU under ``torch.autocast`` too). :func:`static_cache` allocates each in its own.
- **Loading a frozen adapter beside trained ones**: peft 0.18 (our floor) ``load_adapter(..., is_trainable=False)``
  marks every parameter of the model untrainable, the other adapters' too; 0.21 leaves them as they were. PPO loads
  the reward model's adapter onto the policy's base after the policy and value adapters: on peft 0.18 the policy's
  LoRA then never trained (the value head alone did; RLOO/GRPO stopped on an empty optimizer).
  :func:`load_frozen_adapter` loads it and gives back every other parameter its ``requires_grad``.
- **Lightning's private loop state** (2.6.0-2.6.6 alike): a step metric's last value kept in ``trainer._results``
  (:func:`forget_step_metrics`), and whether a validation follows the batch that is ending
  (:func:`validates_after_this_batch`, which the checkpoint and the clean stop wait for); and the SIGTERM flag its
  own handler sets (:func:`take_over_sigterm`).
"""

from __future__ import annotations

import functools
import inspect

import torch

CACHE_KEYWORDS = ("cache", "past_key_values")  # the new spelling first


def load_frozen_adapter(peft_model, path: str, adapter_name: str) -> None:
    """``peft_model.load_adapter(path, adapter_name, is_trainable=False)``, every parameter that was trainable before
    still trainable after (module docstring)."""
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    peft_model.load_adapter(path, adapter_name=adapter_name, is_trainable=False)
    for parameter in trainable:
        parameter.requires_grad_(True)


def unwrap_model(model):
    """The transformers model inside peft (``get_base_model``), DDP / FSDP1 (``module``) wrappers."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif hasattr(model, "_fsdp_wrapped_module"):
            model = model._fsdp_wrapped_module
        elif type(model).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel"):
            model = model.module
    return model


@functools.cache
def _cache_keyword_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    for name in CACHE_KEYWORDS:
        if name in params:
            return name
    return "cache" if transformers_version() >= (5, 24) else "past_key_values"


def cache_keyword(model) -> str:
    """The keyword by which ``model``'s forward takes a KV cache (``cache`` or ``past_key_values``)."""
    return _cache_keyword_of(type(unwrap_model(model)))


def transformers_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed transformers."""
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _values_in_their_own_dtype(layer):
    """``layer.lazy_initialization`` that then gives the values the dtype of the values it is first given."""
    allocate = layer.lazy_initialization

    def lazy_initialization(key_states, value_states, *args, **kwargs):
        allocate(key_states, value_states, *args, **kwargs)
        if layer.values.dtype != value_states.dtype:
            layer.values = torch.zeros_like(layer.values, dtype=value_states.dtype)
            if not torch.compiler.is_compiling():  # the static address a CUDA graph replays on, as upstream marks it
                torch._dynamo.mark_static_address(layer.values)

    return lazy_initialization


def static_cache(config, max_cache_len: int):
    """A transformers ``StaticCache`` of ``max_cache_len`` columns whose layers hold keys and values each in its
    own dtype, on every transformers of the range (module docstring)."""
    from transformers import StaticCache

    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    for layer in getattr(cache, "layers", ()):
        if hasattr(layer, "lazy_initialization"):
            layer.lazy_initialization = _values_in_their_own_dtype(layer)
    return cache


def forget_step_metrics(trainer) -> None:
    """Forget the step-only metrics logged at earlier batches, so that a metric logged at some steps only (a held-out
    evaluation every N rollouts, a conditional statistic) is written in the rows of those steps alone. Lightning
    (2.6) keeps a step metric's last value in the trainer's result collection (``trainer._results``, not public)
    until the epoch ends, and every later row of ``metrics.csv`` and W&B repeated it. They are forgotten after a
    batch whose row was written (``trainer.log_every_n_steps``), so one logged between rows still reaches the next
    row. Epoch aggregates and
    torchmetrics objects are left alone; ``trainer.callback_metrics`` / ``logged_metrics`` keep the last values."""
    every = trainer.log_every_n_steps
    if not every or trainer.fit_loop.epoch_loop._batches_that_stepped % every:
        return  # the last batch's row was not written: what it logged goes into the next row that is
    results = getattr(trainer, "_results", None)
    for item in (results or {}).values():
        if item.is_tensor and item.meta.on_step and not item.meta.on_epoch:
            item.reset()


def validates_after_this_batch(trainer) -> bool:
    """Whether Lightning validates at the end of the training batch that is ending: its own decision, a private
    method (``_should_check_val_fx``) alike from lightning 2.6.0, our floor, to 2.6.6; False where it cannot be
    asked (the caller then acts at the batch end, as without a validation)."""
    loop = trainer.fit_loop.epoch_loop
    decide = getattr(loop, "_should_check_val_fx", None)
    try:
        return bool(decide(trainer.fit_loop._data_fetcher)) if decide is not None else False
    except (AttributeError, TypeError):
        return False


def take_over_sigterm(trainer) -> bool:
    """Whether Lightning's own SIGTERM handler caught a signal before training started, which the caller takes over:
    the flag is cleared. Left set, Lightning's training loop raises its ``SIGTERMException`` (a ``SystemExit`` with
    no status: the process ended with status 0, silently) at the end of the first batch, before the clean stop could
    point ``last.ckpt`` at its checkpoint and say how to resume. The flag lives on the Trainer's private signal
    connector (``trainer.received_sigterm`` reads it) from lightning 2.6.0 to 2.6.6."""
    received = bool(getattr(trainer, "received_sigterm", False))
    connector = getattr(trainer, "_signal_connector", None)
    if received and connector is not None and hasattr(connector, "received_sigterm"):
        connector.received_sigterm = False
    return received


__all__ = ["CACHE_KEYWORDS", "cache_keyword", "forget_step_metrics", "static_cache", "transformers_version",
           "take_over_sigterm", "unwrap_model", "validates_after_this_batch"]
