"""Static-cache decoding for the rollout sampler (:func:`lrlhf.models.generation.sample_with_logprobs`), compiled
or not.

The eager sampler grows a ``DynamicCache`` and its mask by one column per token, so every decode step has new
shapes and runs op by op from Python: on a GPU the step is bound by kernel launches, not by the hardware. Here
the cache is a preallocated ``StaticCache`` of ``L`` columns, ``L`` = prompt + ``max_new_tokens`` rounded up to a
multiple of ``bucket`` (a few lengths cover every rollout), and the one-token step has fixed shapes: the token
``(B, 1)``, its position ``(B, 1)``, the cache column it writes (``cache_position``, a ``(1,)`` tensor; transformers
5.24 writes at the cache's own length counter instead, which ``reset()`` zeroes: the same column) and a ``(B, L)``
mask that is the prompt's mask then ones. The ones ahead of the current column are never attended: transformers'
causal mask hides every cache column after the current one. With ``compiled`` the step is ``torch.compile``-d once
per shape (``mode="reduce-overhead"``, CUDA graphs, on CUDA; inductor's default on a CPU) and reused by every later
rollout of the same batch size and bucket. The caches live beside the model (a few shapes per model, never in its
``__dict__``, so copies and exports do not carry them) and are reset between rollouts, so CUDA graphs replay on the
same addresses.

A shared-trunk value head reads each step's hidden state through a forward hook, which a compiled step would not
see (dynamo skips hook guards): with a value head, ``compiled`` runs the ``static`` steps uncompiled.

The prefill runs eagerly (its length varies with the prompts). The model calls are the eager sampler's on the
same inputs, so ids and log-probs agree with it to the kernels' rounding; ``tests/models/test_decoding.py``
checks that on a CPU, left padding and early stops included.
"""

from __future__ import annotations

import time
import weakref

import torch

DECODING = ("auto", "eager", "static", "compiled")

#: Seconds spent compiling decode steps in this process, per ``(batch, columns)`` shape (bench/sampler_speed.py
#: reports them; the first step of a new shape includes its compilation).
COMPILE_SECONDS: dict[tuple[int, int], float] = {}


#: What ``auto`` runs per device type. Eager everywhere for now: on a CPU the compiled step is not faster
#: (bench/RESULTS.md), and on CUDA it has not been measured yet (bench/gpu_check.sh part 3 times eager against
#: compiled; ``auto`` becomes ``compiled`` there once a GPU run has shown it faster and equal).
AUTO = {"cuda": "eager", "cpu": "eager"}


def resolve(decoding: str, device: torch.device, synced: bool = False, value_head: bool = False) -> str:
    """The decoding a sampler runs: ``auto`` as :data:`AUTO` says for the device; ``eager`` whenever the forward
    is a collective (``synced``, FSDP), whose gathers a compiled graph would capture; ``static`` for ``compiled``
    with a value head (its hook would not fire inside a compiled step)."""
    if decoding not in DECODING:
        raise ValueError(f"decoding={decoding!r}; choose one of {', '.join(DECODING)}")
    if synced:
        return "eager"
    if decoding == "auto":
        decoding = AUTO.get(torch.device(device).type, "eager")
    if decoding == "compiled" and value_head:
        return "static"
    return decoding


def _one_token(model, cache_keyword, cache, token, mask, position, cache_position):
    return model(input_ids=token, attention_mask=mask, position_ids=position, cache_position=cache_position,
                 use_cache=True, **{cache_keyword: cache}).logits[:, -1]


_COMPILED: dict[str, object] = {}

#: Static caches per model (weakly: they go with the model) and shape; at most this many shapes per model.
_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
MAX_CACHES = 4


def compiled_step(device_type: str):
    """The one-token step compiled for ``device_type`` (one compiled function per process, so its graphs are kept
    and reused across rollouts; dynamo guards recompile it for a new model or shape)."""
    if device_type not in _COMPILED:
        mode = "reduce-overhead" if device_type == "cuda" else None
        _COMPILED[device_type] = torch.compile(_one_token, mode=mode, dynamic=False)
    return _COMPILED[device_type]


class StaticDecoder:
    """Prefill and one-token steps over a ``StaticCache`` (kept on the model, reset per rollout)."""

    def __init__(self, model, shape: torch.Size, max_new_tokens: int, bucket: int, compiled: bool):
        from lrlhf.utils.compat import cache_keyword

        if bucket < 1:
            raise ValueError(f"decoding bucket must be >= 1, got {bucket}")
        self.model, self.compiled = model, compiled
        batch, prompt = shape
        self.columns = -(-(prompt + max_new_tokens) // bucket) * bucket
        self.keyword = cache_keyword(model)
        self.cache = self._cache(batch)
        self.cache_kwargs = {self.keyword: self.cache}
        self.prompt = prompt

    def _cache(self, batch: int):
        from lrlhf.utils.compat import static_cache

        param = next(self.model.parameters())
        device = param.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else param.dtype
        key = (batch, self.columns, dtype, device)  # the dtype the cache fills with (autocast's, if on)
        caches = _CACHES.setdefault(self.model, {})
        if key in caches:
            caches[key] = cache = caches.pop(key)  # most recently used last
            cache.reset()
            return cache
        while len(caches) >= MAX_CACHES:  # the least recently used shape goes
            caches.pop(next(iter(caches)))
        caches[key] = static_cache(self.model.config, self.columns)  # keys and values each in its own dtype
        return caches[key]

    def prefill(self, input_ids, mask, positions):
        batch, prompt = input_ids.shape
        ones = torch.ones(batch, self.columns - prompt, dtype=mask.dtype, device=mask.device)
        self.mask = torch.cat([mask, ones], dim=1)  # (B, L): the prompt's, then ones (hidden by causality)
        cache_position = torch.arange(prompt, device=input_ids.device)
        return self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          cache_position=cache_position, logits_to_keep=1, **self.cache_kwargs).logits[:, -1]

    def step(self, token, position, step: int):
        cache_position = torch.full((1,), self.prompt + step, dtype=torch.long, device=token.device)
        if not self.compiled:
            return _one_token(self.model, self.keyword, self.cache, token[:, None], self.mask, position,
                              cache_position)
        shape = (token.shape[0], self.columns)
        start = time.perf_counter() if shape not in COMPILE_SECONDS else None
        logits = compiled_step(token.device.type)(self.model, self.keyword, self.cache, token[:, None], self.mask,
                                                  position, cache_position)
        if start is not None:
            COMPILE_SECONDS[shape] = time.perf_counter() - start
        return logits.clone()  # a CUDA-graph output is overwritten by the next replay


__all__ = ["AUTO", "COMPILE_SECONDS", "DECODING", "MAX_CACHES", "StaticDecoder", "compiled_step", "resolve"]
