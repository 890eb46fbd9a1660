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

The eager sampler's cache (:func:`reserved_cache`) is a ``DynamicCache`` whose layers write each step's keys and
values into a buffer reserved for the whole rollout (prompt + ``max_new_tokens`` columns) and hand attention a view
of the columns filled so far: the same tensors a growing cache holds, without copying the whole cache at every step
(``torch.cat`` of the cache was ~10% of a CPU GRPO iteration at bench/grpo_vs_trl.py's shape).

The prefill runs eagerly (its length varies with the prompts). The model calls are the eager sampler's on the
same inputs, so ids and log-probs agree with it to the kernels' rounding; ``tests/models/test_decoding.py``
checks that on a CPU, left padding and early stops included.
"""

from __future__ import annotations

import functools
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


def reserved_cache(config, capacity: int):
    """A ``DynamicCache`` for ``config`` whose full-attention layers grow inside a buffer of ``capacity`` columns
    (:class:`ReservedLayer`; beyond it a layer reallocates, so a longer sequence still works). Sliding-window layers,
    and the layers of a transformers whose ``DynamicCache`` has no ``DynamicLayer`` list, stay as they are."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers without cache layers: the plain growing cache
        return cache
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        for i, layer in enumerate(layers):
            if type(layer) is DynamicLayer:
                layers[i] = reserved_layer_class()(capacity)
    return cache


@functools.cache
def reserved_layer_class():
    """:class:`ReservedLayer`, defined on first use (transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are views of the first ``n`` columns of buffers of ``capacity``
        columns: an update writes its columns in place instead of concatenating the whole cache again. A view
        replaced by an operation of the base class (``crop`` keeps the buffer; a batch selection copies) is taken
        back into a buffer at the next update."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity
            self._buffers = None

        def _reserve(self, keys, values, columns: int) -> None:
            batch, heads, filled = keys.shape[0], keys.shape[1], keys.shape[-2]
            size = max(columns, self.capacity)
            key_buf = keys.new_empty(batch, heads, size, keys.shape[-1])
            value_buf = values.new_empty(batch, values.shape[1], size, values.shape[-1])
            key_buf[:, :, :filled] = keys
            value_buf[:, :, :filled] = values
            self._buffers = key_buf, value_buf

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            filled, new = self.get_seq_length(), key_states.shape[-2]
            buffers = self._buffers
            if (filled == 0 or buffers is None or filled + new > buffers[0].shape[-2]
                    or self.keys.data_ptr() != buffers[0].data_ptr()):
                self._reserve(self.keys if filled else key_states[:, :, :0],
                              self.values if filled else value_states[:, :, :0], filled + new)
            key_buf, value_buf = self._buffers
            key_buf[:, :, filled:filled + new] = key_states
            value_buf[:, :, filled:filled + new] = value_states
            self.keys, self.values = key_buf[:, :, :filled + new], value_buf[:, :, :filled + new]
            return self.keys, self.values

        def batch_select_indices(self, indices) -> None:
            filled = self.get_seq_length()
            if filled > 0:  # one copy of the rows kept, into buffers of their own
                self._reserve(self.keys[indices], self.values[indices], filled)
                self.keys, self.values = self._buffers[0][:, :, :filled], self._buffers[1][:, :, :filled]

    return ReservedLayer


__all__ = ["AUTO", "COMPILE_SECONDS", "DECODING", "MAX_CACHES", "StaticDecoder", "compiled_step",
           "reserved_cache", "reserved_layer_class", "resolve"]
